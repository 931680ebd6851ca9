"""One owner per run, between real processes (``race_driver.py``).

Two processes drive the same runs at the same time: a call never has two executions at
once, no live owner's call is taken for a crash remnant, every run ends as a solo run
does. A process SIGKILLed inside its tools is taken over by the next one: at once where
the store can prove the death (sqlite, file, postgres), after the lease where it cannot (redis).
Everything is checked from outside: the store and the ledger the tools append to.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest

import statekernel as sk
from statekernel.stores import open_store
from statekernel.testing import ScriptedProvider
from statekernel.testing._fuzz import run_history_ok, run_outcome

DRIVER = Path(__file__).with_name("race_driver.py")
RACE_RUNS = int(os.environ.get("STATEKERNEL_RACE_RUNS", "12"))
KILL_RUNS = 8
STORES = [
    "sqlite",
    "file",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


def _driver_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("race_driver", DRIVER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


race_driver = _driver_module()
TURNS: int = race_driver.TURNS


def store_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    urls: dict[str, Callable[[], str]] = {
        "file": lambda: f"file://{tmp_path}/store",
        "sqlite": lambda: f"sqlite:///{tmp_path}/runs.db",
        "redis": lambda: str(request.getfixturevalue("redis_store_url")),
        "postgres": lambda: str(request.getfixturevalue("postgres_store_url")),
    }
    return urls[kind]()


# -- the ledger ------------------------------------------------------------------


class Mark(NamedTuple):
    """One ledger line: ``start``/``end`` of an execution of ``key`` (``run:call``)."""

    kind: str
    key: str
    attempt: int
    pid: int
    tool: str


def read_ledger(path: Path) -> list[Mark]:
    if not path.exists():
        return []
    marks = []
    for line in path.read_text().splitlines():
        kind, key, attempt, pid, tool, *_ = line.split()
        marks.append(Mark(kind, key, int(attempt), int(pid), tool))
    return marks


def overlaps(marks: Iterable[Mark], dead: frozenset[int] = frozenset()) -> list[str]:
    """Executions of a call that started while another one of it ran. An execution of a
    ``dead`` process without an end ended with its process."""
    running: dict[str, list[Mark]] = {}
    found = []
    for mark in marks:
        now = running.setdefault(mark.key, [])
        if mark.kind == "end":
            now[:] = [m for m in now if (m.attempt, m.pid) != (mark.attempt, mark.pid)]
            continue
        for other in (m for m in now if m.pid not in dead):
            found.append(
                f"{mark.key}: attempt {mark.attempt} in pid {mark.pid} started while "
                f"attempt {other.attempt} in pid {other.pid} ran"
            )
        now.append(mark)
    return found


def unfinished(marks: Iterable[Mark], pid: int) -> set[str]:
    """Keys whose execution in ``pid`` started and never ended."""
    started = {m.key for m in marks if m.pid == pid and m.kind == "start"}
    ended = {m.key for m in marks if m.pid == pid and m.kind == "end"}
    return started - ended


def side_starts(marks: Iterable[Mark]) -> Counter[str]:
    return Counter(m.key for m in marks if m.kind == "start" and m.tool == "side")


def side_keys(run_ids: Iterable[str]) -> set[str]:
    return {f"{r}:call_{t}_0" for r in run_ids for t in range(TURNS)}


# -- processes -------------------------------------------------------------------


def spawn(
    mode: str,
    url: str,
    ledger: Path,
    run_ids: list[str],
    *,
    lease_ttl: float,
    busy_timeout: float,
    slow: float = 0.0,
) -> subprocess.Popen[str]:
    args = [sys.executable, str(DRIVER), mode, url, str(ledger), str(lease_ttl)]
    args += [str(busy_timeout), str(slow), *run_ids]
    return subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def go(procs: list[subprocess.Popen[str]]) -> None:
    """Wait until every process has loaded, then let them all start at once."""
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), f"driver did not start: {line!r} {finish(proc)}"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    """The driver's report (its last line of output); it must have exited cleanly."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"driver exited with {proc.returncode}: {err}"
    report: dict[str, Any] = json.loads(out.splitlines()[-1])
    return report


def wait_for(check: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- the store -------------------------------------------------------------------


async def create_runs(url: str, run_ids: list[str]) -> None:
    providers = {"scripted": ScriptedProvider([])}  # the processes bring the real one
    async with sk.Kernel(url, providers=providers) as kernel:
        for run_id in run_ids:
            await kernel.start(model="scripted/race", messages=["go"], run_id=run_id)


async def solo_outcome(run_id: str, ledger: Path) -> tuple[object, ...]:
    """What the run ends as when one process drives it alone, uninterrupted."""
    options = race_driver.agent(str(ledger), 0.0, [run_id])
    async with sk.Kernel("memory://", **options) as kernel:
        await kernel.start(model="scripted/race", messages=["go"], run_id=run_id)
        async for _ in kernel.run(run_id):
            pass
        return run_outcome(await kernel.get(run_id))


async def stored_runs(url: str, run_ids: list[str]) -> dict[str, sk.Run]:
    """Each run's head; its stored history must be sound."""
    store = open_store(url)
    try:
        for run_id in run_ids:
            await run_history_ok(store, run_id)
        return {run_id: await store.load(run_id) for run_id in run_ids}
    finally:
        await store.aclose()


# -- the tests -------------------------------------------------------------------


def test_the_ledger_check_sees_overlapping_executions() -> None:
    def mark(kind: str, attempt: int, pid: int) -> Mark:
        return Mark(kind, "r:call_0_1", attempt, pid, "idem")

    one_after_another = [mark("start", 1, 10), mark("end", 1, 10), mark("start", 2, 11)]
    assert overlaps(one_after_another) == []
    second_while_first = [mark("start", 1, 10), mark("start", 2, 11), mark("end", 1, 10)]
    assert overlaps(second_while_first) == [
        "r:call_0_1: attempt 2 in pid 11 started while attempt 1 in pid 10 ran"
    ]
    assert overlaps(second_while_first, dead=frozenset({10})) == []
    assert unfinished(second_while_first, 11) == {"r:call_0_1"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", STORES)
def test_two_processes_driving_the_same_runs_never_overlap(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    run_ids = [f"race-{i:02}" for i in range(RACE_RUNS)]
    asyncio.run(create_runs(url, run_ids))
    ledger = tmp_path / "ledger"
    procs = [
        spawn("race", url, ledger, run_ids, lease_ttl=15.0, busy_timeout=0.5) for _ in range(2)
    ]
    go(procs)
    reports = [finish(proc) for proc in procs]

    marks = read_ledger(ledger)
    problems = overlaps(marks)
    for report in reports:
        problems += [
            f"{key}: a live owner's call paused as uncertain" for key in report["uncertain"]
        ]
        if lost := report["seen"].get("lost", 0):
            problems.append(f"pid {report['pid']}: {lost} commits overtaken by another drive")
    side = side_starts(marks)
    for key in sorted(side_keys(run_ids)):
        if side[key] != 1:
            problems.append(f"{key}: non-idempotent call ran {side[key]} times")
    runs = asyncio.run(stored_runs(url, run_ids))
    for run_id, run in runs.items():
        solo = asyncio.run(solo_outcome(run_id, tmp_path / "solo-ledger"))
        if run_outcome(run) != solo:
            problems.append(f"{run_id}: ended {run.state}, not as a solo run")
    assert not problems, "\n".join(problems)
    print(f"{kind}: " + ", ".join(f"pid {r['pid']} saw {r['seen']}" for r in reports))


def stuck_in_slow_turn(ledger: Path, run_ids: list[str], pid: int) -> bool:
    """Both calls of each run's slow turn are running in ``pid``."""
    marks = read_ledger(ledger)
    running = unfinished(marks, pid)
    slow = {f"{r}:call_{i % TURNS}_{c}" for i, r in enumerate(run_ids) for c in (0, 1)}
    return slow <= running


@pytest.mark.slow
@pytest.mark.parametrize("kind", STORES)
def test_a_sigkilled_owner_is_taken_over(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    run_ids = [f"kill-{i:02}" for i in range(KILL_RUNS)]
    asyncio.run(create_runs(url, run_ids))
    ledger = tmp_path / "ledger"
    # sqlite and file prove the death with the lock the owner held, postgres with its
    # session's advisory lock: its long lease must not matter. redis cannot: the short
    # lease is what lets the next process in.
    lease_ttl = 1.0 if kind == "redis" else 120.0
    first = spawn("all", url, ledger, run_ids, lease_ttl=lease_ttl, busy_timeout=3.0, slow=60.0)
    go([first])
    wait_for(lambda: stuck_in_slow_turn(ledger, run_ids, first.pid), "the slow tools to start")
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    in_flight = unfinished(read_ledger(ledger), first.pid)

    second = spawn("takeover", url, ledger, run_ids, lease_ttl=15.0, busy_timeout=3.0)
    go([second])
    report = finish(second)

    assert report["seen"] == {}, f"the dead owner's runs were not taken over: {report}"
    marks = read_ledger(ledger)
    assert overlaps(marks, dead=frozenset({first.pid})) == []
    side = {key for key in in_flight if key.endswith("_0")}
    assert set(report["uncertain"]) == side, "uncertain calls are the dead owner's side effects"
    reruns = {m.key for m in marks if m.pid == second.pid and m.kind == "end" and m.attempt == 2}
    assert reruns == in_flight - side, "the dead owner's idempotent calls re-ran as attempt 2"
    starts = side_starts(marks)
    assert {key: starts[key] for key in side_keys(run_ids)} == dict.fromkeys(side_keys(run_ids), 1)
    runs = asyncio.run(stored_runs(url, run_ids))
    assert {r.state for r in runs.values()} == {"completed"}
    errors = {
        f"{run_id}:{record.id}"
        for run_id, run in runs.items()
        for turn in run.turns
        for record in turn.completed
        if record.error == race_driver.UNKNOWN
    }
    assert errors == side, "each uncertain call was resolved from the ledger"
