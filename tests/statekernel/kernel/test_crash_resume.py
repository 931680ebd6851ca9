"""Crash/resume invariants, fuzzed with Hypothesis over every store.

Crashes are simulated in-process (``statekernel.testing.Crash`` at the points of
``CRASH_POINTS``); real SIGKILLs of a process live in ``test_process_kills.py``.
Select a deeper run with ``HYPOTHESIS_PROFILE=long``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

import statekernel as sk
from statekernel.errors import InvalidArgument
from statekernel.stores import CheckpointStore, open_store
from statekernel.testing import CrashAt, call, check_crash_resume, fuzz_agent
from statekernel.testing import strategies as sts
from statekernel.testing._fuzz import run_history_ok

STORES = ["memory", "file", "sqlite", "redis", pytest.param("postgres", marks=pytest.mark.postgres)]
LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"
FUZZ = settings(
    deadline=None,
    max_examples=1500 if LONG else 150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_counter = itertools.count()


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """A factory of fresh store URLs of one kind (one per generated example)."""
    kind = request.param
    if kind in ("redis", "postgres"):  # one server's store: each example has its own run ids
        base: str = request.getfixturevalue(
            "redis_url" if kind == "redis" else "postgres_store_url"
        )

    def fresh() -> str:
        n = next(_counter)
        if kind == "memory":
            return f"memory://fuzz-{uuid.uuid4().hex}"
        if kind == "file":
            return f"file://{tmp_path}/files-{n}"
        if kind == "sqlite":
            return f"sqlite:///{tmp_path}/db-{n}.db"
        return base

    return fresh


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[CheckpointStore]:
    store = open_store(url)
    try:
        yield store
    finally:
        await store.aclose()


def run_case(
    url: str, script: list[object], schedule: list[CrashAt], *, eager: bool = False
) -> None:
    async def case() -> None:
        async with opened(url) as store:
            start = {"model": "scripted/fuzz", "messages": ["go"], "run_id": uuid.uuid4().hex}
            agent = fuzz_agent(script, eager=eager)
            report = await check_crash_resume(
                agent, start=start, schedule=schedule, store=lambda: store
            )
            assert report.final.state == "completed"
            if currently_in_test_context():
                event(f"crashes fired: {len(report.crashes)}")
                for crash in report.crashes:
                    event(f"crash at {crash.point}")

    asyncio.run(case())


@FUZZ
@given(script=sts.agent_scripts(), schedule=sts.crash_schedules(), eager=st.booleans())
def test_crash_resume_invariants(
    store_url: Callable[[], str], script: list[object], schedule: list[CrashAt], eager: bool
) -> None:
    run_case(store_url(), script, schedule, eager=eager)


TWO_CALLS = [[call("side_effect", {"key": "a"}), call("lookup", {"key": "b"})], "done"]
ONE_CALL = [[call("side_effect", {"key": "k0"})], "ok"]


@pytest.mark.parametrize(
    ("script", "schedule"),
    [
        (TWO_CALLS, [CrashAt("tool_after_effect", 1)]),
        # regression: a crash escaping one tool task while another call completed was
        # swallowed, and the driver went on believing it still ran the crashed call
        (TWO_CALLS, [CrashAt("after_commit", 5), CrashAt("tool_after_effect", 2)]),
        (
            TWO_CALLS,
            [CrashAt("before_commit", 1), CrashAt("mid_stream", 1), CrashAt("model_call", 3)],
        ),
        # regression: a "rerun" resolution stayed in force after the re-run was itself
        # interrupted, so a non-idempotent call ran a third time without asking
        (ONE_CALL, [CrashAt("after_commit", 6), CrashAt("tool_after_effect", 1)]),
    ],
)
def test_known_schedules(
    store_url: Callable[[], str], script: list[object], schedule: list[CrashAt]
) -> None:
    run_case(store_url(), script, schedule)


# -- invariant 5: two kernels racing on one run ---------------------------------------


def test_racing_kernels_never_both_run_a_call(store_url: Callable[[], str]) -> None:
    executed: list[str] = []

    @sk.tool
    async def charge(key: str, ctx: sk.ToolContext) -> str:
        """Not idempotent."""
        executed.append(ctx.call_id)
        await asyncio.sleep(0.01)
        return f"charged {key}"

    script = [[call("charge", {"key": str(i)}) for i in range(3)], "done"]

    async def race() -> None:
        async with opened(store_url()) as store:
            kernels = [
                sk.Kernel(
                    store,
                    tools=[charge],
                    providers={"scripted": sk.testing.ScriptedProvider(script)},
                )
                for _ in range(2)
            ]
            run = await kernels[0].start(model="scripted/x", messages=["go"])

            async def drive(kernel: sk.Kernel) -> str:
                async for _ in kernel.run(run.run_id):
                    await asyncio.sleep(0)
                return "done"

            # one owner at a time: the second drive waits for the first, then finds the
            # run completed; no call is taken for a crash remnant
            outcomes = await asyncio.gather(*(drive(k) for k in kernels))
            assert outcomes == ["done", "done"]
            assert sorted(executed) == sorted(set(executed)), f"a call ran twice: {executed}"
            assert len(executed) == 3
            head = await store.load(run.run_id)
            assert head.state == "completed"
            assert all(not r.resolved for t in head.turns for r in t.completed)
            for kernel in kernels:
                await kernel.aclose()
            await run_history_ok(store, run.run_id)

    asyncio.run(race())


# -- invariant 6: cancellation at any await point ---------------------------------------


@settings(FUZZ, max_examples=100 if LONG else 12)
@given(cut=st.integers(0, 40), script=sts.agent_scripts(max_turns=2), eager=st.booleans())
def test_cancellation_anywhere_is_resumable(
    store_url: Callable[[], str], cut: int, script: list[object], eager: bool
) -> None:
    async def case() -> None:
        async with opened(store_url()) as store:
            agent = fuzz_agent(script, eager=eager)
            kernel = sk.Kernel(store, **agent())
            run = await kernel.start(model="scripted/fuzz", messages=["go"])
            task = asyncio.ensure_future(_drain(kernel, run.run_id))
            for _ in range(cut):
                await asyncio.sleep(0)
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
            await kernel.aclose()
            head = await store.load(run.run_id)
            if head.failure is not None:  # only the script's own model errors fail a run
                assert head.failure.error == "ProviderUnavailable"
            events = await store.events(run.run_id)
            failures = [e.data["error"] for e in events if e.type == "run_failed"]
            assert set(failures) <= {"ProviderUnavailable"}
            kernel = sk.Kernel(store, **agent())
            for _ in range(20):
                await _drain(kernel, run.run_id)
                head = await store.load(run.run_id)
                if head.state == "completed":
                    break
                if head.state == "failed":
                    await kernel.retry(run.run_id)
                elif head.pause is not None and head.pause.reason == "input_required":
                    await kernel.resume(run.run_id, value="an answer")
                elif head.pause is not None:
                    for c in head.pause.metadata.get("calls", []):
                        await kernel.resolve_tool_call(run.run_id, c["id"], rerun=True)
            assert head.state == "completed"
            await run_history_ok(store, run.run_id)

    asyncio.run(case())


async def _drain(kernel: sk.Kernel, run_id: str) -> None:
    async for _ in kernel.run(run_id):
        pass


async def _paused_on_uncertain_calls(
    script: Sequence[object],
) -> tuple[CheckpointStore, Callable[[], Mapping[str, Any]], sk.Kernel, sk.Run]:
    """A run of ``script`` on a memory store, crashed after the first tool's effect and
    driven again by a second kernel until it pauses on its uncertain calls: the store,
    the agent, that kernel (open) and the paused run."""
    from statekernel.stores import MemoryStore
    from statekernel.testing import Crash, FaultPlan

    store = MemoryStore()
    agent = fuzz_agent(script)
    first = sk.Kernel(
        store,
        **{**agent(), "middleware": [FaultPlan([CrashAt("tool_after_effect", 1)]).middleware()]},
    )
    run = await first.start(model="scripted/fuzz", messages=["go"])
    with pytest.raises(Crash):
        await _drain(first, run.run_id)
    await first.aclose()
    second = sk.Kernel(store, **agent())
    await _drain(second, run.run_id)
    return store, agent, second, await second.get(run.run_id)


async def test_a_crash_between_the_last_resolution_and_its_resume_is_resumable() -> None:
    """All uncertain calls answered, then the resume commit lost to a crash: the run
    stays paused with every answer stored, and ``resume`` goes on with them."""
    from statekernel.testing import Crash, FaultPlan, FaultyStore

    script = [[call("side_effect", {"key": "a"}), call("side_effect", {"key": "b"})], "done"]
    store, agent, second, paused = await _paused_on_uncertain_calls(script)
    assert paused.pause is not None
    assert paused.pause.reason == "uncertain_tool_calls"
    calls = [c["id"] for c in paused.pause.metadata["calls"]]
    plan = FaultPlan([CrashAt("before_commit", len(calls) + 1)])  # the resume commit
    crashing = sk.Kernel(FaultyStore(store, plan), **agent())
    for call_id in calls[:-1]:
        await crashing.resolve_tool_call(paused.run_id, call_id, output="done by hand")
    with pytest.raises(Crash):  # its answer lands, the resume that follows does not
        await crashing.resolve_tool_call(paused.run_id, calls[-1], output="done by hand")
    stuck = await second.get(paused.run_id)
    assert stuck.state == "paused"
    assert set(stuck.pause.metadata["resolutions"]) == set(calls)  # type: ignore[union-attr]
    await second.resume(paused.run_id)
    await _drain(second, paused.run_id)
    final = await second.get(paused.run_id)
    assert final.state == "completed"
    outputs = {r.id: (r.output, r.resolved) for r in final.turns[0].completed}
    assert all(outputs[c] == ("done by hand", True) for c in calls)
    await second.aclose()


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"error": 402}, r"resolutions\['c'\]: error must be a str, got 402"),
        ({"rerun": "no"}, r"resolutions\['c'\]: rerun must be true, got 'no'"),
        ({"eror": "declined"}, r"exactly one of output, error or rerun, got keys \['eror'\]"),
        ({"output": 1, "error": "x"}, r"got keys \['error', 'output'\]"),
        ("ran", r"resolutions\['c'\] must be a JSON object, got 'ran'"),
    ],
)
async def test_resolutions_handed_to_resume_are_checked_before_anything_commits(
    given: Any, match: str
) -> None:
    """A misspelt key or an error that is not text was read as "it ran, output None"
    (and ``rerun: "no"`` as a re-run): the operator's word, misread and committed."""
    script = [[call("side_effect", {"key": "a"}, id="c")], "done"]
    _, _, kernel, paused = await _paused_on_uncertain_calls(script)
    assert paused.pause is not None
    assert paused.pause.reason == "uncertain_tool_calls"
    (attempt,) = [c["attempt"] for c in paused.pause.metadata["calls"]]
    doc = {"attempt": attempt, **given} if isinstance(given, dict) else given
    with pytest.raises(InvalidArgument, match=match):
        await kernel.resume(paused.run_id, value={"resolutions": {"c": doc}})
    with pytest.raises(InvalidArgument, match=r"'d' is not an uncertain call \(they are: c\)"):
        await kernel.resume(
            paused.run_id, value={"resolutions": {"d": {"attempt": 1, "output": 1}}}
        )
    late = {"attempt": attempt + 1, "error": "declined"}
    with pytest.raises(InvalidArgument, match=rf"answers attempt {attempt + 1}; the attempt"):
        await kernel.resume(paused.run_id, value={"resolutions": {"c": late}})
    assert (await kernel.get(paused.run_id)).revision == paused.revision  # nothing committed
    said = {"attempt": attempt, "error": "card declined"}
    await kernel.resume(paused.run_id, value={"resolutions": {"c": said}})
    await _drain(kernel, paused.run_id)
    final = await kernel.get(paused.run_id)
    assert final.state == "completed"
    (done,) = final.turns[0].completed
    assert (done.output, done.error, done.resolved) == (None, "card declined", True)
    await kernel.aclose()


# -- the harness's own contract ---------------------------------------------------------


def test_a_store_url_is_opened_for_the_check_and_closed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fuzz.db"
    before = set(threading.enumerate())
    report = asyncio.run(
        check_crash_resume(
            fuzz_agent(ONE_CALL),
            start={"model": "scripted/fuzz", "messages": ["go"]},
            schedule=[CrashAt("after_commit", 2)],
            store=url,
        )
    )
    assert report.final.state == "completed"
    assert report.crashes == (CrashAt("after_commit", 2),)
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=120)  # a store left open keeps its thread
        assert not thread.is_alive(), f"{thread.name} still runs after the check"


def test_a_run_left_by_an_earlier_check_is_refused(tmp_path: Path) -> None:
    """Two checks on one store (and one run id): the second says so, instead of failing
    an invariant it never tested."""

    async def twice() -> None:
        async with opened(f"sqlite:///{tmp_path}/fuzz.db") as store:
            for _ in range(2):
                await check_crash_resume(
                    fuzz_agent(ONE_CALL),
                    start={"model": "scripted/fuzz", "messages": ["go"]},
                    schedule=[CrashAt("after_commit", 2)],
                    store=lambda: store,
                )

    with pytest.raises(InvalidArgument, match=r"run 'fuzzed-run' is already in the store"):
        asyncio.run(twice())
