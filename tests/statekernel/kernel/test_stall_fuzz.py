"""A stalled owner, fuzzed with Hypothesis over the stores of one host.

Kernel A drives a fuzzed agent. At its ``stall_at``-th model or tool call (inside every
middleware, before the call starts), A stalls, as a frozen process does (A runs one call at
a time, so nothing else of A moves meanwhile): its lease expires on the shared clock,
kernel B takes the run over and drives it to the end (answering questions and
uncertain calls as an operator would), and only then does A go on. Whatever the script
and the stall point: A starts nothing once B has taken the run (its lease check stops
it with ``LeaseLost``), B brings the run to the same outcome as an undisturbed drive
(up to an answer A was still reading when it stalled after starting a call early: B
closes it as committed, ``answer_cut_off``), and the stored history reads back whole.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import statekernel as sk
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import LeaseLost, ProviderUnavailable
from statekernel.middleware import ModelCall, ToolInvocation
from statekernel.stores import FileStore, MemoryStore, SQLiteStore
from statekernel.testing import Fail, ManualClock, Reply, call, fuzz_agent
from statekernel.testing import strategies as sts
from statekernel.testing._fuzz import Ledger, _settle, run_history_ok, same_outcome

TTL = 3600.0
"""Long in real time, so no renewal loop runs during an example; the clock jumps it."""
KINDS = ["memory", "file", "sqlite"]
_n = itertools.count()
TWO_CALLS = Reply(
    tool_calls=(call("side_effect", {"key": "k0"}), call("side_effect", {"key": "k1"}))
)
CUT_OFF: list[object] = [Fail(ProviderUnavailable("overloaded"), times=1, then=TWO_CALLS), "done"]
"""A stalls starting the first call early while the answer still streams: B cuts it off."""


def a_store(kind: str, folder: Path, clock: ManualClock) -> CheckpointStore:
    n = next(_n)
    if kind == "memory":
        return MemoryStore(clock=clock)
    if kind == "file":
        return FileStore(f"file://{folder}/files-{n}", clock=clock)
    return SQLiteStore(f"sqlite:///{folder}/db-{n}.db", clock=clock)


def kernel(
    agent: Mapping[str, Any], store: CheckpointStore, ledger: Ledger, clock: ManualClock, *mw: Any
) -> sk.Kernel:
    options = dict(agent)
    tools = [ledger.wrap(t) for t in options.pop("tools", ())]
    middleware = [*mw, ledger.middleware()]
    return sk.Kernel(
        store,
        tools=tools,
        middleware=middleware,
        lease_ttl=TTL,
        clock=clock,
        busy_timeout=1.0,
        **options,
    )


async def to_the_end(k: sk.Kernel, run_id: str, ledger: Ledger) -> sk.Run:
    """Drive the run, acting as an operator whenever it rests, until it completes."""
    for _ in range(50):
        async for _event in k.run(run_id):
            pass
        run = await k.get(run_id)
        if not await _settle(k, run, ledger, lambda _: True):
            return run
    raise AssertionError("the run did not complete")


async def case(kind: str, folder: Path, script: list[object], stall_at: int, eager: bool) -> None:
    make = fuzz_agent(script, eager=eager, max_concurrent=1)  # a stall freezes all of A
    run_id = "stalled"
    baseline_ledger = Ledger()
    base_clock = ManualClock()
    base_store = MemoryStore(clock=base_clock)
    async with kernel(make(), base_store, baseline_ledger, base_clock) as solo:
        await solo.start(model="scripted/fuzz", messages=["go"], run_id=run_id)
        baseline = await to_the_end(solo, run_id, baseline_ledger)

    clock, ledger = ManualClock(), Ledger()
    store = a_store(kind, folder, clock)
    seen: dict[str, Any] = {"effects": 0}

    async def stall(call: Any, call_next: Any) -> Any:
        if isinstance(call, ModelCall | ToolInvocation):
            seen["effects"] += 1
            if seen["effects"] == stall_at:  # A freezes here; B takes over meanwhile
                clock.advance(TTL + 1)
                seen["b"] = asyncio.ensure_future(take_over())
                await asyncio.shield(seen["b"])  # B is not A's: nothing of A stops it
        return await call_next(call)

    async def take_over() -> sk.Run:
        async with kernel(make(), store, ledger, clock) as b:
            final = await to_the_end(b, run_id, ledger)
        seen["after_b"] = dict(ledger.executions)
        return final

    try:
        async with kernel(make(), store, ledger, clock, stall) as a:
            await a.start(model="scripted/fuzz", messages=["go"], run_id=run_id)
            try:
                final = await to_the_end(a, run_id, ledger)
            except LeaseLost:
                final = await seen["b"]
        if "after_b" in seen:
            assert dict(ledger.executions) == seen["after_b"], "A started a call after B took over"
        assert final.state == "completed"
        same_outcome(final, baseline, await store.events(run_id))
        await run_history_ok(store, run_id)
    finally:
        await store.aclose()


@settings(
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=sts.agent_scripts(max_turns=3), stall_at=st.integers(1, 8), eager=st.booleans())
@example(  # A stalls starting a call early while the answer still streams: B cuts it off
    script=[
        Fail(
            ProviderUnavailable("overloaded"),
            times=1,
            then=Reply(
                tool_calls=(call("side_effect", {"key": "k0"}), call("side_effect", {"key": "k1"}))
            ),
        ),
        "done",
    ],
    stall_at=3,
    eager=True,
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_stalled_owner_starts_nothing_once_another_took_its_run(
    kind: str, tmp_path: Path, script: list[object], stall_at: int, eager: bool
) -> None:
    asyncio.run(case(kind, tmp_path, script, stall_at, eager))
