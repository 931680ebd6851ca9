"""Crash/resume of worker-driven runs that delegate, fuzzed with Hypothesis.

A worker drives a fuzzed agent whose first turn hands a task to a child run
(``delegate``); simulated process deaths land in model calls, mid-stream and right after
tool effects (``statekernel.testing.CrashAt``). A crashed drive leaves its queue entry
pending; the worker reclaims it once the lease ended, as another process would. A run
that comes to rest is answered as an operator would and submitted again. Whatever the
script and the crashes: the run completes with the outcome of an undisturbed drive, no
side effect that is not idempotent runs twice, its child run completed under the
parent's call, and every stored history reads back whole.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import statekernel as sk
from statekernel.stores import MemoryStore
from statekernel.testing import CrashAt, call, fuzz_agent
from statekernel.testing import strategies as sts
from statekernel.testing._faults import FaultPlan, FaultyProvider
from statekernel.testing._fuzz import Ledger, _settle, run_history_ok, run_outcome

STORES = [
    pytest.param("redis_store_url", marks=pytest.mark.redis),
    pytest.param("postgres_store_url", marks=pytest.mark.postgres),
]
DELEGATES: list[object] = [[call("helper", {"task": "first"})]]
REST = ("paused", "completed", "failed")


def with_faults(make: Any, ledger: Ledger, plan: FaultPlan | None) -> Mapping[str, Any]:
    options = dict(make())
    options["tools"] = [ledger.wrap(t) for t in options["tools"]]
    middleware = [] if plan is None else [plan.middleware()]
    options["middleware"] = [*middleware, ledger.middleware()]
    if plan is not None:
        providers = options["providers"]
        options["providers"] = {n: FaultyProvider(p, plan) for n, p in providers.items()}
    return options


async def settled(kernel: sk.Kernel, run_id: str, ledger: Ledger, drive: Any) -> sk.Run:
    """Drive with ``drive`` and answer as an operator until the run completes."""
    for _ in range(40):
        run = await kernel.get(run_id)
        if run.state not in REST:  # an answer may pause the run again at once
            await drive()
            run = await kernel.get(run_id)
        if not await _settle(kernel, run, ledger, lambda _: True):
            return run
    raise AssertionError("the run did not complete")


async def case(url: str, script: list[object], schedule: list[CrashAt]) -> None:
    make = fuzz_agent([*DELEGATES, *script])
    base_ledger = Ledger()
    async with sk.Kernel(MemoryStore(), **with_faults(make, base_ledger, None)) as solo:
        await solo.start(model="scripted/fuzz", messages=["go"], run_id="baseline")

        async def solo_drive() -> None:
            async for _ in solo.run("baseline"):
                pass

        baseline = await settled(solo, "baseline", base_ledger, solo_drive)

    ledger, plan = Ledger(), FaultPlan(schedule)
    run_id = uuid.uuid4().hex
    queue = f"q{run_id[:8]}"
    async with sk.Kernel(url, providers=dict(make()["providers"])) as kernel:
        await kernel.start(model="scripted/fuzz", messages=["go"], run_id=run_id)
        worker = sk.Worker(
            kernel.store,
            queue=queue,
            agent=lambda: with_faults(make, ledger, plan),
            lease_ttl=0.5,
            block=0.05,
            grace=5.0,
        )
        serving = asyncio.create_task(worker.serve())

        async def on_workers() -> None:
            await kernel.submit(run_id, queue=queue)
            deadline = asyncio.get_running_loop().time() + 300  # only a hang reaches it
            while (await kernel.get(run_id)).state not in REST:
                assert asyncio.get_running_loop().time() < deadline, "the run never rested"
                await asyncio.sleep(0.01)  # a crashed drive is reclaimed once its lease ended

        try:
            final = await settled(kernel, run_id, ledger, on_workers)
        finally:
            worker.stop()
            await serving
        assert run_outcome(final) == run_outcome(baseline)
        tools = {t.name: t for t in make()["tools"]}
        names = {f"{run_id}:{r.id}": r.name for t in final.turns for r in t.completed}
        for key, count in ledger.executions.items():
            tool = tools.get(names.get(key, ""))
            if tool is not None and not tool.idempotent:
                assert count <= 1, f"{key} ({tool.name}) ran {count} times"
        await run_history_ok(kernel.store, run_id)
        children = [
            await kernel.get(s.run_id)
            for s in (await kernel.store.list_runs(limit=1000)).runs
            if s.run_id.startswith(f"{run_id}.")
        ]
        assert children, "the parent's first call started no child run"
        for child in children:
            assert child.parent_run_id == run_id
            assert child.state == "completed"
            await run_history_ok(kernel.store, child.run_id)


@pytest.mark.parametrize("store_fixture", STORES)
@settings(
    deadline=None,
    max_examples=12,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=sts.agent_scripts(max_turns=2), schedule=sts.process_crash_schedules())
def test_a_worker_driven_parent_that_delegates_survives_crashes(
    store_fixture: str,
    request: pytest.FixtureRequest,
    script: list[object],
    schedule: list[CrashAt],
) -> None:
    """On each store with run queues: Redis Streams and PostgreSQL's ``SKIP LOCKED``."""
    asyncio.run(case(str(request.getfixturevalue(store_fixture)), script, schedule))
