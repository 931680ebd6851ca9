"""Several processes on one store: compare-and-set holds, SIGKILL never loses a commit."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

from statekernel._records.events import Event
from statekernel._records.messages import Message, ModelRequest, ModelResult, ToolCall
from statekernel._records.run import Run, ToolCallRecord, Turn
from statekernel.errors import ConflictError, RunNotFound
from statekernel.stores import Checkpoint, open_store

T0 = datetime(2030, 1, 1, tzinfo=UTC)
RUN_ID = "crash-run"


def expected_run(revision: int, run_id: str = RUN_ID) -> Run:
    """The run at ``revision``: one turn every 3 revisions, a tool output of ~1 KB."""
    messages: list[Message] = [Message.user("start")]
    turns: list[Turn] = []
    for i in range(revision // 3):
        call = ToolCall(f"c{i}", "tool", f'{{"i": {i}, "pad": "{"x" * 150}"}}')
        request = ModelRequest("scripted/test", tuple(messages))
        answer = Message.assistant(tool_calls=[call])
        output = f"output {i} " + "y" * 1000
        record = ToolCallRecord(call.id, "tool", call.arguments, None, output, attempt=1)
        messages += [answer, Message.tool(call.id, "tool", output)]
        turns.append(Turn(i, request, ModelResult(answer), 1, completed=(record,)))
    current = None
    if revision % 3:
        request = ModelRequest("scripted/test", tuple(messages))
        current = Turn(len(turns), request, model_attempts=revision % 3)
    return Run(
        run_id=run_id,
        model="scripted/test",
        revision=revision,
        state="calling_model" if current else "preparing_turn",
        messages=tuple(messages),
        turns=tuple(turns),
        current_turn=current,
        event_count=revision + 1,
        created_at=T0,
        updated_at=T0 + timedelta(seconds=revision),
    )


def events_of(run: Run) -> tuple[Event, ...]:
    """The one event of the commit of ``run``."""
    return (Event("model_started", run.run_id, run.revision, run.revision, {}, T0),)


def between(previous: Run | None, run: Run) -> Checkpoint:
    """The checkpoint from ``previous`` to ``run`` (counts, since objects are not shared)."""
    if previous is None:
        return Checkpoint(run, events_of(run), len(run.messages), len(run.turns), True)
    return Checkpoint(
        run,
        events_of(run),
        new_messages=len(run.messages) - len(previous.messages),
        new_turns=len(run.turns) - len(previous.turns),
    )


async def write_forever(url: str, report: Any) -> None:
    """Commit the next revision again and again, reporting each one that landed."""
    store = open_store(url)
    try:
        head = await store.load(RUN_ID)
    except RunNotFound:
        head = None
    while True:
        nxt = expected_run(0 if head is None else head.revision + 1)
        await store.commit(between(head, nxt))
        report(nxt.revision)
        head = nxt


def racer_main(url: str, base: int, tag: str, barrier: Any, results: Any) -> None:
    """Child process body of one racer of one round."""
    results.put((tag, asyncio.run(race_round(url, base, tag, barrier.wait))))


async def commit_attempts(url: str, attempts: int) -> int:
    """Try ``attempts`` times to commit the next revision; how many landed."""
    store = open_store(url)
    wins = 0
    try:
        for _ in range(attempts):
            head = await store.load(RUN_ID)
            try:
                await store.commit(between(head, expected_run(head.revision + 1)))
                wins += 1
            except ConflictError:
                await asyncio.sleep(0)
    finally:
        await store.aclose()
    return wins


def attempts_main(url: str, attempts: int, results: Any) -> None:
    """Child process body of the many-writers test."""
    results.put(asyncio.run(commit_attempts(url, attempts)))


def writer_main(url: str, fd: int) -> None:
    """Child process body: report committed revisions as lines on ``fd``."""

    def report(revision: int) -> None:
        os.write(fd, b"%d\n" % revision)

    os.write(fd, b"start\n")
    asyncio.run(write_forever(url, report))


async def race_round(url: str, base: int, tag: str, ready: Any) -> bool:
    """Load revision ``base``, wait for ``ready()``, commit ``base + 1``; True if it landed."""
    store = open_store(url)
    try:
        head = await store.load(RUN_ID)
        assert head.revision == base
        nxt = attrs.evolve(expected_run(base + 1), context={"writer": tag})
        ready()
        try:
            await store.commit(between(head, nxt))
        except ConflictError:
            return False
        return True
    finally:
        await store.aclose()


FORK = multiprocessing.get_context("fork")
KILLS = {"file": 50, "sqlite": 50, "redis": 20, "postgres": 20}


def url_for(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "file":
        return f"file://{tmp_path}/runs"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    if kind == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    return str(request.getfixturevalue("redis_store_url"))


STORES = [
    "file",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


async def _create(url: str) -> None:
    store = open_store(url)
    try:
        await store.commit(between(None, expected_run(0)))
    finally:
        await store.aclose()


async def _check(url: str, at_least: int) -> int:
    """The store loads a valid run, at least as new as ``at_least``; its revision."""
    store = open_store(url)
    try:
        try:
            run = await store.load(RUN_ID)
        except RunNotFound:
            assert at_least < 0, f"revision {at_least} was reported but no run loads"
            return -1
        assert run.revision >= at_least, f"revision {run.revision} < reported {at_least}"
        assert run == expected_run(run.revision), f"revision {run.revision} is not intact"
        for past in {0, run.revision // 2, max(run.revision - 1, 0)}:
            assert await store.load(RUN_ID, revision=past) == expected_run(past)
        events = await store.events(RUN_ID)
        assert [e.seq for e in events] == list(range(run.revision + 1)), "events lost"
        return run.revision
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", STORES)
def test_sigkill_writer_never_loses_a_commit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each writer is killed once it has reported 1 to 4 commits (then a random instant
    within a few ms, so the kill lands anywhere in the commit after them): what it
    reported is never lost, however slow the machine."""
    url = url_for(kind, tmp_path, request)
    rng = random.Random(f"kill-{kind}")
    reported = -1
    waited = 0
    for _ in range(KILLS[kind]):
        read_end, write_end = os.pipe()
        proc = FORK.Process(target=writer_main, args=(url, write_end), daemon=True)
        proc.start()
        os.close(write_end)
        with os.fdopen(read_end, "rb") as lines:
            assert lines.readline() == b"start\n"
            commits = rng.randint(1, 4)
            for _ in range(commits):
                line = lines.readline()
                assert line, f"the writer died before reporting {commits} commits"
                reported = max(reported, int(line))
            waited += commits
            time.sleep(rng.uniform(0, 0.005))  # where the kill lands, not whether it counts
            assert proc.pid is not None  # started
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            done = [int(x) for x in lines.read().split()]
        reported = max([reported, *done])
        revision = asyncio.run(_check(url, reported))
        reported = max(reported, revision)
    assert reported + 1 >= waited, f"{waited} commits reported, the head is r{reported}"


@pytest.mark.parametrize("kind", STORES)
def test_two_processes_on_one_revision_exactly_one_wins(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = url_for(kind, tmp_path, request)
    asyncio.run(_create(url))
    for base in range(8):
        barrier, results = FORK.Barrier(2), FORK.Queue()
        procs = [
            FORK.Process(target=racer_main, args=(url, base, tag, barrier, results))
            for tag in ("a", "b")
        ]
        for proc in procs:
            proc.start()
        outcome = dict(results.get(timeout=120) for _ in procs)
        for proc in procs:
            proc.join(timeout=120)
            assert proc.exitcode == 0
        assert sorted(outcome.values()) == [False, True], f"round {base}: {outcome}"


@pytest.mark.parametrize("kind", STORES)
def test_many_processes_lose_no_update(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = url_for(kind, tmp_path, request)
    asyncio.run(_create(url))
    results = FORK.Queue()
    procs = [FORK.Process(target=attempts_main, args=(url, 15, results)) for _ in range(4)]
    for proc in procs:
        proc.start()
    wins = sum(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=120)
    assert asyncio.run(_check(url, wins)) == wins, "commits were lost or doubled"
