"""A Hypothesis state machine over the public API: start, drive until an event, crash,
cancel, two kernels driving one run at once, resume, resolve, retry, send input, fork,
update context; with the crash/resume invariants checked after every step."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import defaultdict
from collections.abc import AsyncGenerator
from typing import Any, cast

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import statekernel as sk
from statekernel.middleware import ToolInvocation
from statekernel.stores import MemoryStore
from statekernel.testing import (
    CRASH_POINTS,
    Crash,
    CrashAt,
    FaultPlan,
    FaultyProvider,
    FaultyStore,
    ScriptedProvider,
)
from statekernel.testing import strategies as sts
from statekernel.testing._fuzz import Ledger, run_history_ok

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"


def _uncertain(run: sk.Run) -> bool:
    return run.pause is not None and run.pause.reason == "uncertain_tool_calls"


class KernelMachine(RuleBasedStateMachine):
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.ledger = Ledger()
        self.scripts: dict[str, list[object]] = {}
        self.acked: dict[str, int] = defaultdict(lambda: -1)
        self.non_idempotent: set[str] = set()
        self.reruns: set[str] = set()
        self.ids = itertools.count()
        self.running: dict[str, int] = defaultdict(int)
        self.overlaps: list[str] = []

    # -- plumbing -----------------------------------------------------------------

    def overlap_watch(self) -> Any:
        """Middleware noting a call that starts while another execution of it runs."""

        async def watch(call: Any, nxt: Any) -> Any:
            if not isinstance(call, ToolInvocation):
                return await nxt(call)
            key = f"{call.run.run_id}:{call.call.id}"
            self.running[key] += 1
            if self.running[key] > 1:
                self.overlaps.append(key)
            try:
                await asyncio.sleep(0.005)  # a window for the other driver, if it can get in
                return await nxt(call)
            finally:
                self.running[key] -= 1

        return watch

    def kernel(self, run_id: str, plan: FaultPlan | None = None, **options: Any) -> sk.Kernel:
        from statekernel.testing import fuzz_agent

        kwargs = dict(fuzz_agent(self.scripts[run_id])())
        provider: Any = ScriptedProvider(self.scripts[run_id], repeat_last=True)
        store: Any = self.store
        middleware: list[Any] = []
        if plan is not None:
            provider, store = FaultyProvider(provider, plan), FaultyStore(store, plan)
            middleware.append(plan.middleware())
        middleware += [self.ledger.middleware(), self.overlap_watch()]
        tools = [self.ledger.wrap(t) for t in kwargs["tools"]]
        kwargs.update(
            providers={"scripted": provider}, middleware=middleware, tools=tools, **options
        )
        self.non_idempotent = {t.name for t in kwargs["tools"] if not t.idempotent}
        return sk.Kernel(store, **kwargs)

    def act(self, run_id: str, fn: Any, plan: FaultPlan | None = None) -> Any:
        async def go() -> Any:
            kernel = self.kernel(run_id, plan)
            try:
                return await fn(kernel)
            except (Crash, sk.InvalidTransition, sk.ConflictError):
                return None
            finally:
                await kernel.aclose()

        return asyncio.run(go())

    def head(self, run_id: str) -> sk.Run:
        return asyncio.run(self.store.load(run_id))

    # -- rules --------------------------------------------------------------------

    @rule(target=runs, script=sts.agent_scripts(max_turns=3), text=st.sampled_from(["hi", "go"]))
    def start(self, script: list[object], text: str) -> str:
        run_id = f"run{next(self.ids)}"
        self.scripts[run_id] = script
        self.act(run_id, lambda k: k.start(model="scripted/sm", messages=[text], run_id=run_id))
        self.acked[run_id] = 0
        return run_id

    @rule(run_id=runs, events=st.integers(1, 30))
    def drive_until_an_event(self, run_id: str, events: int) -> None:
        """Drive for a number of events, then close the generator (a cancellation)."""

        async def drive(kernel: sk.Kernel) -> None:
            seen = 0
            gen = cast("AsyncGenerator[sk.Event, None]", kernel.run(run_id))  # an async generator
            try:
                async for event in gen:
                    if event.persisted:
                        self.acked[run_id] = max(self.acked[run_id], event.revision)
                    seen += 1
                    if seen >= events:
                        break
            finally:
                await gen.aclose()

        self.act(run_id, drive)

    @rule(run_id=runs, point=st.sampled_from(CRASH_POINTS), nth=st.integers(1, 6))
    def crash(self, run_id: str, point: str, nth: int) -> None:
        plan = FaultPlan([CrashAt(point, nth)])  # type: ignore[arg-type]

        async def drive(kernel: sk.Kernel) -> None:
            async for event in kernel.run(run_id):
                if event.persisted:
                    self.acked[run_id] = max(self.acked[run_id], event.revision)

        self.act(run_id, drive, plan)

    @rule(run_id=runs, lag=st.integers(0, 15), wait=st.sampled_from([0.02, 5.0]))
    def two_drivers_at_once(self, run_id: str, lag: int, wait: float) -> None:
        """Two kernels (two processes) drive the run to rest at the same time, the second
        starting ``lag`` ms later: one owns the run; the other waits for it (``wait`` s)
        or gives up with RunBusy. Neither takes the other's calls for crash remnants."""
        before = self.head(run_id)

        async def drive(kernel: sk.Kernel, ms: int) -> None:
            await asyncio.sleep(ms / 1000)
            try:
                async for event in kernel.run(run_id):
                    if event.persisted:
                        self.acked[run_id] = max(self.acked[run_id], event.revision)
            except (sk.RunBusy, sk.InvalidTransition):
                pass

        async def go() -> None:
            kernels = [self.kernel(run_id, busy_timeout=wait) for _ in range(2)]
            try:
                await asyncio.gather(drive(kernels[0], 0), drive(kernels[1], lag))
            finally:
                for kernel in kernels:
                    await kernel.aclose()

        asyncio.run(go())
        after = self.head(run_id)
        in_flight = before.current_turn is not None and before.current_turn.in_flight
        if not in_flight and not _uncertain(before):
            assert not _uncertain(after), "a live owner's call was taken for a crash remnant"

    @rule(run_id=runs, value=st.none() | st.booleans())
    def resume(self, run_id: str, value: bool | None) -> None:
        run = self.head(run_id)
        if run.state == "paused" and run.pause and run.pause.reason != "uncertain_tool_calls":
            self.act(run_id, lambda k: k.resume(run_id, value=value))

    @rule(run_id=runs)
    def resolve(self, run_id: str) -> None:
        run = self.head(run_id)
        if run.state != "paused" or not run.pause or run.pause.reason != "uncertain_tool_calls":
            return

        async def resolve_all(kernel: sk.Kernel) -> None:
            assert run.pause is not None
            for c in run.pause.metadata["calls"]:
                done = self.ledger.outcomes.get(f"{run_id}:{c['id']}")
                if done is None:
                    self.reruns.add(f"{run_id}:{c['id']}")
                    await kernel.resolve_tool_call(run_id, c["id"], rerun=True)
                elif done[0]:
                    await kernel.resolve_tool_call(run_id, c["id"], output=done[1])
                else:
                    await kernel.resolve_tool_call(run_id, c["id"], error=str(done[1]))

        self.act(run_id, resolve_all)

    @rule(run_id=runs)
    def retry(self, run_id: str) -> None:
        if self.head(run_id).state == "failed":
            self.act(run_id, lambda k: k.retry(run_id))

    @rule(run_id=runs, text=st.sampled_from(["more", "and?"]))
    def send_input(self, run_id: str, text: str) -> None:
        if self.head(run_id).state in ("completed", "paused"):
            self.act(run_id, lambda k: k.send(run_id, text))

    @rule(target=runs, run_id=runs, data=st.data())
    def fork(self, run_id: str, data: st.DataObject) -> str:
        head = self.head(run_id)
        at = data.draw(st.integers(0, head.revision))
        new_id = f"{run_id}f{at}x{next(self.ids)}"
        self.scripts[new_id] = self.scripts[run_id]
        self.act(run_id, lambda k: k.fork(run_id, at_revision=at, new_run_id=new_id))
        self.acked[new_id] = 0
        return new_id

    @rule(run_id=runs, n=st.integers(0, 9))
    def update_context(self, run_id: str, n: int) -> None:
        self.act(run_id, lambda k: k.update_context(run_id, lambda c: {**c, "n": n}))

    @rule(run_id=consumes(runs))
    def delete(self, run_id: str) -> None:
        deleted = asyncio.run(self.store.delete(run_id))
        assert deleted
        self.scripts.pop(run_id)

    # -- invariants ---------------------------------------------------------------

    @invariant()
    def histories_are_declared_transitions(self) -> None:
        for run_id in self.scripts:
            asyncio.run(run_history_ok(self.store, run_id))

    @invariant()
    def nothing_acknowledged_is_lost(self) -> None:
        for run_id in self.scripts:
            assert self.head(run_id).revision >= self.acked[run_id]

    @invariant()
    def side_effects_at_most_once(self) -> None:
        """A non-idempotent call runs again only when an operator chose ``rerun``."""
        for key, count in self.ledger.executions.items():
            if key in self.reruns:
                continue
            run_id, _, call_id = key.rpartition(":")
            if run_id not in self.scripts:
                continue
            head = self.head(run_id)
            turns = [*head.turns, *([head.current_turn] if head.current_turn else [])]
            names = {r.id: r.name for t in turns for r in (*t.completed, *t.in_flight)}
            if names.get(call_id) in self.non_idempotent:
                assert count <= 1, f"{key} ran {count} times"

    @invariant()
    def one_execution_of_a_call_at_a_time(self) -> None:
        assert not self.overlaps, f"calls ran twice at once: {self.overlaps}"

    @invariant()
    def crashes_never_write_failed(self) -> None:
        for run_id in self.scripts:
            failure = self.head(run_id).failure
            assert failure is None or failure.error == "ProviderUnavailable"


KernelMachine.TestCase.settings = settings(
    max_examples=150 if LONG else 25,
    stateful_step_count=30 if LONG else 15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestKernelMachine = KernelMachine.TestCase
