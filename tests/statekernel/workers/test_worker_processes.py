"""Three ``statekernel worker`` processes share 200 runs (on one Redis server, on a Redis
Cluster and on PostgreSQL); one is SIGKILLed midway and another stopped with SIGTERM.
Checked from outside, through the store, the queue and the side-effect log the tools
append to: every run completes exactly once, no non-idempotent call runs twice, nothing
stays pending, invariants 1-4 hold."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel._storage.queues import RunQueues
from statekernel.errors import RunBusy
from statekernel.stores import open_store
from statekernel.testing import ScriptedProvider
from statekernel.testing._fuzz import run_history_ok, run_outcome

HERE = Path(__file__).parent
EXE = shutil.which("statekernel")
RUNS, TURNS = 200, 3
SIDE_TOTAL = RUNS * TURNS
UNCERTAIN = "uncertain_tool_calls"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(EXE is None, reason="the statekernel console script is not installed"),
]


def spawn_worker(url: str, log: Path, index: int, tmp: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SK_WORKER_LOG=str(log), SK_TURNS=str(TURNS), SK_MODEL_DELAY="0.02")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    args = [str(EXE), "worker", "--store", url, "--queue", "q", "--concurrency", "15"]
    args += ["--agent", "worker_agent:make", "--lease-ttl", "2", "--grace", "20"]
    args += ["--name", f"w{index}"]
    out = (tmp / f"w{index}.err").open("wb")
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=out)


def side_lines(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [line.split() for line in log.read_text().splitlines() if line]


def wait_for(check: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


async def submit_all(url: str) -> None:
    providers = {"scripted": ScriptedProvider([])}  # the workers bring the real one
    async with sk.Kernel(url, providers=providers) as kernel:
        for i in range(RUNS):
            run = await kernel.start(model="scripted/w", messages=["go"], run_id=f"run-{i:03}")
            await kernel.submit(run.run_id, queue="q")


def wait_drained(url: str, what: str, within: float = 60.0) -> None:
    """Return once the queue has no entry left, delivered or not (asked over one
    connection: a store opened for each look is a Redis Cluster's discovery each time)."""

    async def poll() -> None:
        store = open_store(url)
        assert isinstance(store, RunQueues)
        q = store.run_queue("q")
        deadline = time.monotonic() + within
        try:
            while (await q.pending(), await q.waiting()) != (0, 0):
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.05)
        finally:
            await q.aclose()
            await store.aclose()

    asyncio.run(poll())


async def resolve_uncertain(url: str, log: Path) -> int:
    """What an operator does: say what happened to calls a killed worker left in flight."""
    done = {(f[1], f[2]) for f in side_lines(log) if f[0] == "side"}
    resolved = 0
    async with sk.Kernel(url) as kernel:
        page = await kernel.store.list_runs(state="paused", limit=RUNS)
        for summary in page.runs:
            run = await kernel.get(summary.run_id)
            assert run.pause is not None
            assert run.pause.reason == UNCERTAIN
            for c in run.pause.metadata["calls"]:
                if (run.run_id, c["id"]) in done:
                    output = f"wrote {c['input']['key']}"
                    await kernel.resolve_tool_call(run.run_id, c["id"], output=output)
                else:
                    await kernel.resolve_tool_call(run.run_id, c["id"], rerun=True)
            await kernel.submit(run.run_id, queue="q")
            resolved += 1
    return resolved


async def baseline(tmp: Path) -> tuple[Any, ...]:
    sys.path.insert(0, str(HERE))
    try:
        import worker_agent
    finally:
        sys.path.pop(0)
    options = worker_agent.make(str(tmp / "baseline.log"), TURNS, 0.0)
    async with sk.Kernel("memory://", **options) as kernel:
        await kernel.start(model="scripted/w", messages=["go"], run_id="run-000")
        async for _ in kernel.run("run-000"):
            pass
        return run_outcome(await kernel.get("run-000"))


async def check_runs(url: str, log: Path, tmp: Path) -> None:
    expected = await baseline(tmp)
    acked: dict[str, list[tuple[int, str]]] = {}
    for f in side_lines(log):
        if f[0] == "ack":
            acked.setdefault(f[1], []).append((int(f[2]), f[3]))
    store = open_store(url)
    try:
        for i in range(RUNS):
            run_id = f"run-{i:03}"
            final = await store.load(run_id)
            assert final.state == "completed", run_id
            kinds = [e.type for e in await store.events(run_id)]
            assert kinds.count("run_completed") == 1, f"{run_id} completed more than once"
            assert run_outcome(final) == expected, f"invariant 1: {run_id}"
            await run_history_ok(store, run_id)  # invariant 3
            for revision, call_id in acked.get(run_id, []):  # invariant 4
                at = await store.load(run_id, revision=revision)
                turn = at.current_turn
                assert turn is not None, f"invariant 4: {run_id} r{revision} lost"
                assert call_id in {r.id for r in turn.in_flight}, f"invariant 4: {run_id}"
    finally:
        await store.aclose()


def check_log(log: Path) -> None:
    lines = side_lines(log)
    side = Counter((f[1], f[2]) for f in lines if f[0] == "side")
    idem = [(f[1], f[2], f[3]) for f in lines if f[0] == "idem"]
    assert max(side.values()) == 1, f"invariant 2: repeated {[k for k, n in side.items() if n > 1]}"
    assert len(side) == SIDE_TOTAL, "invariant 2: a side effect never ran"
    assert len({(r, c) for r, c, _ in idem}) == SIDE_TOTAL, "an idempotent call never ran"
    assert all(key == f"{r}:{c}" for r, c, key in idem), "idempotency key changed"


async def leftovers(url: str) -> tuple[int, int]:
    """Runs whose lease is still held, and dead letters of the queue."""
    store = open_store(url)
    assert isinstance(store, RunQueues)
    q = store.run_queue("q")
    held = 0
    try:
        for i in range(RUNS):
            try:
                lease = await store.acquire(f"run-{i:03}", "checker", ttl=5)
            except RunBusy:
                held += 1
            else:
                await store.release(lease)
        return held, len(await q.dead_letters(limit=RUNS))
    finally:
        await q.aclose()
        await store.aclose()


@pytest.mark.parametrize(
    "server",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis_cluster", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
def test_three_workers_one_killed_one_stopped(
    server: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, log = str(request.getfixturevalue(f"{server}_store_url")), tmp_path / "side.log"
    asyncio.run(submit_all(url))

    def progress(n: int) -> Callable[[], bool]:
        return lambda: sum(f[0] == "side" for f in side_lines(log)) >= n

    workers = [spawn_worker(url, log, i, tmp_path) for i in range(3)]
    try:
        wait_for(progress(SIDE_TOTAL // 4), "a quarter of the work")
        workers[0].send_signal(signal.SIGKILL)
        wait_for(progress(SIDE_TOTAL // 2), "half of the work")
        workers[1].send_signal(signal.SIGTERM)
        # its grace is 20 s; the bound only ends a failing test (a loaded machine's drain
        # and exit took longer than 30 s)
        assert workers[1].wait(timeout=120) == 0, (tmp_path / "w1.err").read_text()
        assert workers[0].wait(timeout=5) == -signal.SIGKILL
        wait_drained(url, "the queue to drain")
        resolved = asyncio.run(resolve_uncertain(url, log))
        wait_drained(url, "resolved runs to finish")
        workers[2].send_signal(signal.SIGTERM)
        assert workers[2].wait(timeout=120) == 0, (tmp_path / "w2.err").read_text()
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stopped = (tmp_path / "w1.err").read_text()
    assert "handed back" in stopped, stopped
    assert "Traceback" not in stopped + (tmp_path / "w2.err").read_text()
    check_log(log)
    asyncio.run(check_runs(url, log, tmp_path))
    assert asyncio.run(leftovers(url)) == (0, 0), "leases left or runs dead-lettered"
    print(f"runs resolved after the kill: {resolved}")
