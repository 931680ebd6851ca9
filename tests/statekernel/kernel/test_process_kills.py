"""Real process deaths: a worker driving a run is SIGKILLed at random moments and a
fresh process resumes it. Invariants 1 to 4 are checked from outside: the stored
history, the acknowledged revisions and the side-effect ledger the tools append to."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import statekernel as sk
from statekernel.stores import open_store
from statekernel.testing._fuzz import run_history_ok, run_outcome

WORKER = Path(__file__).with_name("kill_worker.py")
KILLS = int(os.environ.get("STATEKERNEL_KILLS", "30"))
TURNS = 6


def spawn(url: str, run_id: str, log: Path, entry: str = "start") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), url, run_id, str(log), str(TURNS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SK_KILL_ENTRY": entry},
    )


def read_acks(out: str) -> int:
    acks = [int(line.split()[1]) for line in out.splitlines() if line.startswith("ACK ")]
    return max(acks, default=-1)


def wait_ready(proc: subprocess.Popen[str], timeout: float = 60) -> list[str]:
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("READY"):
            return lines
    raise AssertionError(
        f"worker never got ready: {lines} {proc.stderr.read() if proc.stderr else ''}"
    )


async def expected_outcome(run_id: str, scratch: Path) -> tuple[object, ...]:
    sys.path.insert(0, str(WORKER.parent))
    try:
        import kill_worker
    finally:
        sys.path.pop(0)
    log = scratch / f"baseline-{run_id}.log"
    async with sk.Kernel("memory://", **kill_worker.agent(str(log), TURNS)) as kernel:
        await kernel.start(model="scripted/kill", messages=["go"], run_id=run_id)
        async for _ in kernel.run(run_id):
            pass
        return run_outcome(await kernel.get(run_id))


def kill_loop(url: str, tmp_path: Path, kills_wanted: int, entry: str = "start") -> Counter[str]:
    rng = random.Random(int(os.environ.get("STATEKERNEL_KILL_SEED", "7")))
    stats: Counter[str] = Counter()
    while stats["kills"] < kills_wanted:
        run_id = uuid.uuid4().hex
        log = tmp_path / f"{run_id}.log"
        acked = -1
        completed = False
        while not completed:
            proc = spawn(url, run_id, log, entry)
            early = wait_ready(proc)
            if stats["kills"] < kills_wanted:
                time.sleep(rng.uniform(0.0, 0.08))
                proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=120)
            acked = max(acked, read_acks("".join(early) + out))
            if proc.returncode == -signal.SIGKILL:
                stats["kills"] += 1
            else:
                assert proc.returncode == 0, err
                completed = True
            head = asyncio.run(_load(url, run_id)) if acked >= 0 or completed else None
            if head is not None:  # a process killed before its first commit left no run
                assert head.revision >= acked, f"invariant 4: r{head.revision} < acked r{acked}"
        stats["runs"] += 1
        asyncio.run(_check_run(url, run_id, log))
        _check_ledger(run_id, log)
    return stats


async def _load(url: str, run_id: str) -> sk.Run:
    store = open_store(url)
    try:
        return await store.load(run_id)
    finally:
        await store.aclose()


async def _check_run(url: str, run_id: str, log: Path) -> None:
    store = open_store(url)
    try:
        final = await store.load(run_id)
        assert final.state == "completed"
        expected = await expected_outcome(run_id, log.parent)
        assert run_outcome(final) == expected, "invariant 1"
        await run_history_ok(store, run_id)  # invariant 3
    finally:
        await store.aclose()


def _check_ledger(run_id: str, log: Path) -> None:
    lines = log.read_text().splitlines() if log.exists() else []
    side = Counter(line.split()[1] for line in lines if line.startswith("side "))
    idem = Counter(line.split()[1] for line in lines if line.startswith("idem "))
    assert all(n == 1 for n in side.values()), f"invariant 2: a side effect repeated: {side}"
    assert len(side) == TURNS, "invariant 2: a side effect never ran"
    assert len(idem) == TURNS, "invariant 2: an idempotent call never ran"
    keys = {line.split()[2] for line in lines if line.startswith("idem ")}
    assert keys == {f"{run_id}:call_{i}_1" for i in range(TURNS)}, "idempotency keys changed"


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["start", "start_and_run"])
@pytest.mark.parametrize(
    "kind",
    [
        "file",
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def test_sigkill_then_resume(
    kind: str, entry: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``entry``: runs made by ``start`` then ``run``, or by ``start_and_run``, whose
    first commit takes the lease (``CreatesLeased``): a process killed before, during or
    after it leaves no run, or one the next process takes over (at once where the owner's
    death is proven, on Redis once its lease expired)."""
    urls: dict[str, Callable[[], str]] = {
        "file": lambda: f"file://{tmp_path}/store",
        "sqlite": lambda: f"sqlite:///{tmp_path}/runs.db",
        "redis": lambda: request.getfixturevalue("redis_url"),
        "postgres": lambda: request.getfixturevalue("postgres_store_url"),
    }
    kills = KILLS if entry == "start" else max(KILLS // 3, 1)
    stats = kill_loop(urls[kind](), tmp_path, kills, entry)
    assert stats["kills"] >= kills
    print(f"{kind} ({entry}): {stats['kills']} kills over {stats['runs']} runs")
