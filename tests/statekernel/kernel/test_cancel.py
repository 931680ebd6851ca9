"""``Kernel.cancel``: a run stopped by id ends failed with the ``Cancelled`` failure, on
every store; its drive (this kernel's or another one's) stops at the next safe point
without starting anything; calls cut off stay in flight for retry to decide, a call whose
intent landed but that never began gets an error result; children go with their parent;
a second cancel changes nothing. Between processes: ``test_cancel_processes``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import statekernel as sk
from statekernel._records.run import Cancellation, utcnow
from statekernel._storage.protocol import Lease, StoreWrapper
from statekernel.errors import CancelRequested, RunCancelled, RunNotFound, StoreError
from statekernel.middleware import ToolInvocation
from statekernel.stores import CancelsRuns, MemoryStore
from statekernel.testing import ManualClock, ScriptedProvider, call


class Ledger:
    """What the tools began and what saw its cancellation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.began = asyncio.Event()

    def tools(self) -> list[sk.Tool]:
        ledger = self

        @sk.tool
        async def pay(amount: int) -> str:
            """Pay (not idempotent).

            Args:
                amount: How much.
            """
            ledger.lines.append(f"start pay {amount}")
            ledger.began.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                ledger.lines.append(f"cancelled pay {amount}")
                raise
            return "paid"

        @sk.tool
        def note(text: str) -> str:
            """Note something.

            Args:
                text: What.
            """
            ledger.lines.append(f"note {text}")
            return text

        return [pay, note]


def _kernel(url: str, ledger: Ledger, script: list[object], **kw: Any) -> sk.Kernel:
    providers = {"scripted": ScriptedProvider(script)}
    return sk.Kernel(url, tools=ledger.tools(), providers=providers, **kw)


async def test_the_kernel_driving_a_run_stops_it_at_once(every_store_url: str) -> None:
    ledger = Ledger()
    script: list[object] = [call("pay", {"amount": 5}), call("note", {"text": "after"}), "done"]
    async with _kernel(every_store_url, ledger, script) as kernel:
        await kernel.start(model="scripted/m", messages=["go"], run_id="own")
        seen: list[str] = []

        async def drive() -> None:
            async for event in kernel.run("own", raise_on_failure=True):
                seen.append(event.type)

        driving = asyncio.ensure_future(drive())
        await ledger.began.wait()
        result = await kernel.cancel("own", "too slow", by="me")
        assert result.outcome == "requested"
        with pytest.raises(RunCancelled) as raised:
            await driving
        run = await kernel.get("own")
    assert raised.value.by == "me"
    assert raised.value.message == "too slow"
    assert ledger.lines == ["start pay 5", "cancelled pay 5"]  # note never began
    assert seen[-2:] == ["run_cancelled", "run_failed"]
    assert run.state == "failed"
    assert run.failure is not None
    assert run.failure.error == "Cancelled"
    assert run.failure.failed_in == "dispatching_tools"
    assert run.current_turn is not None
    assert [r.id for r in run.current_turn.in_flight] == ["call_0_0"]  # for retry to decide


async def test_another_kernel_stops_a_live_owner_through_the_store() -> None:
    ledger = Ledger()
    url = "memory://cancel-two-kernels"
    owner = _kernel(url, ledger, [call("pay", {"amount": 1}), "done"], lease_ttl=0.6)
    async with owner, sk.Kernel(url) as other:
        await owner.start(model="scripted/m", messages=["go"], run_id="theirs")
        driving = asyncio.ensure_future(_drain(owner, "theirs"))
        await ledger.began.wait()
        asked = await other.cancel("theirs", "stop", by="ops")
        assert asked.outcome == "requested"
        assert "stops it at its next safe point" in asked.detail
        again = await other.cancel("theirs", "stop twice", by="someone")
        assert again.outcome == "requested"
        assert "a cancel was asked for already (by ops" in again.detail
        await driving  # the owner's renewal found the request
        run = await owner.get("theirs")
        assert run.failure is not None
        assert run.failure.cancellation is not None
        assert run.failure.cancellation.by == "ops"  # the first request is the one obeyed
        retried = await owner.retry("theirs")
        await _drain(owner, "theirs")
        after = await owner.get("theirs")
    assert retried.state == "dispatching_tools"
    assert after.state == "paused"
    assert after.pause is not None
    assert after.pause.reason == "uncertain_tool_calls"  # pay is never run twice
    assert ledger.lines == ["start pay 1", "cancelled pay 1"]


async def _drain(kernel: sk.Kernel, run_id: str) -> None:
    async for _ in kernel.run(run_id):
        pass


async def test_a_call_whose_intent_landed_but_never_began_gets_an_error_result() -> None:
    """The cancel comes between the intent's commit and the effect (here from a
    middleware): the tool never runs, its result says so, and retry goes on from it."""
    ledger = Ledger()
    kernels: list[sk.Kernel] = []

    async def cancel_first(
        invocation: object, proceed: Callable[[object], Awaitable[object]]
    ) -> object:
        if isinstance(invocation, ToolInvocation) and kernels:  # the first call only
            await kernels.pop().cancel(invocation.run.run_id, "not now")
        return await proceed(invocation)

    script: list[object] = [call("note", {"text": "x"}), "fine without it"]
    async with _kernel("memory://", ledger, script, middleware=[cancel_first]) as kernel:
        kernels.append(kernel)
        await kernel.start(model="scripted/m", messages=["go"], run_id="early")
        await _drain(kernel, "early")
        run = await kernel.get("early")
        assert run.state == "failed"
        assert run.current_turn is not None
        (record,) = run.current_turn.completed
        assert record.error == "cancelled before it began: not now"
        await kernel.retry("early")  # goes on from the error result
        await _drain(kernel, "early")
        done = await kernel.get("early")
    assert ledger.lines == []  # never ran
    assert done.state == "completed"
    assert done.messages[-1].text == "fine without it"


async def test_a_run_at_rest_is_cancelled_at_once_and_a_second_cancel_says_so(
    every_store_url: str,
) -> None:
    ledger = Ledger()
    async with _kernel(every_store_url, ledger, ["hi"]) as kernel:
        await kernel.start(model="scripted/m", messages=["go"], run_id="fresh")
        first = await kernel.cancel("fresh", "changed my mind")
        second = await kernel.cancel("fresh")
        run = await kernel.get("fresh")
        events = [e.type for e in await kernel.events("fresh")]
        assert first.outcome == "cancelled"
        assert second.outcome == "unchanged"
        assert second.detail.startswith("already cancelled")
        assert run.state == "failed"
        assert run.failure is not None
        assert run.failure.failed_in == "init"
        assert events == ["run_started", "run_cancelled", "run_failed"] or events[-2:] == [
            "run_cancelled",
            "run_failed",
        ]
        back = await kernel.retry("fresh")
        assert back.state == "init"
        await _drain(kernel, "fresh")
        completed = await kernel.get("fresh")
        assert completed.state == "completed"
        unchanged = await kernel.cancel("fresh")
        assert unchanged.outcome == "unchanged"
        assert "completed" in unchanged.detail
        assert (await kernel.get("fresh")).revision == completed.revision
        with pytest.raises(RunNotFound):
            await kernel.cancel("no-such-run")


async def test_children_are_cancelled_with_their_parent_unless_asked_otherwise() -> None:
    class Approvals(sk.Hooks):
        def on_tool_call_started(self, run: sk.Run, record: sk.ToolCallRecord) -> sk.Decision:
            return sk.Pause("approval", {"call": record.id})

    ledger = Ledger()
    payer = sk.delegate(
        "payer", "Pay.", model="helper/small", tools=ledger.tools(), hooks=Approvals()
    )
    for children, child_state in ((True, "failed"), (False, "paused")):
        providers = {
            "scripted": ScriptedProvider([call("payer", {"task": "pay 5"}, id="p1"), "paid"]),
            "helper": ScriptedProvider([call("note", {"text": "t"}, id="t1"), "noted"]),
        }
        async with sk.Kernel("memory://", tools=[payer], providers=providers) as kernel:
            await kernel.start(model="scripted/lead", messages=["go"], run_id="boss")
            await _drain(kernel, "boss")
            assert (await kernel.get("boss")).state == "paused"
            result = await kernel.cancel("boss", "stop all", children=children)
            parent, child = await kernel.get("boss"), await kernel.get("boss.p1")
        assert result.outcome == "cancelled"
        assert parent.state == "failed"
        assert child.state == child_state
        assert [c.run_id for c in result.children] == (["boss.p1"] if children else [])
    assert ledger.lines == []


class PauseAtTurnEnd(sk.Hooks):
    def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision:
        return sk.Pause("approval", {})


def _pausing_kernel(url: str) -> sk.Kernel:
    """A kernel whose runs note something, then pause for an approval."""
    providers = {"scripted": ScriptedProvider([call("note", {"text": "a"}), "done"])}
    return sk.Kernel(url, tools=Ledger().tools(), providers=providers, hooks=PauseAtTurnEnd())


async def test_a_cancel_asked_as_the_drive_comes_to_rest_is_carried_out(
    every_store_url: str,
) -> None:
    """The caller cancels at the drive's last event (the run paused): no drive goes on to
    obey it, so it is carried out before the drive ends."""

    async with _pausing_kernel(every_store_url) as k:
        await k.start(model="scripted/m", messages=["go"], run_id="resting")
        outcomes: list[str] = []
        async for event in k.run("resting"):
            if event.type == "run_paused":
                outcomes.append((await k.cancel("resting", "at the pause")).outcome)
        run = await k.get("resting")
        assert run.state == "failed"
        assert run.failure is not None
        assert run.failure.failed_in == "paused"
        assert outcomes in (["requested"], ["cancelled"])
        assert not k.holds("resting")


async def test_a_request_nobody_carried_out_is_carried_out_by_the_next_command(
    every_store_url: str,
) -> None:
    """A canceller that kept its request and died before carrying it out: the next
    command on the run is refused with ``CancelRequested``, and the run is cancelled."""
    async with _pausing_kernel(every_store_url) as k:
        await k.start(model="scripted/m", messages=["go"], run_id="left")
        async for _ in k.run("left"):
            pass
        store = k.store
        assert isinstance(store, CancelsRuns)
        assert (
            await store.request_cancel("left", Cancellation("gone", "a dead process", utcnow()))
            is None
        )
        with pytest.raises(CancelRequested):
            await k.resume("left", value="yes")
        run = await k.get("left")
        assert run.state == "failed"
        assert run.failure is not None
        assert run.failure.cancellation is not None
        assert run.failure.cancellation.by == "a dead process"
        assert await store.cancel_request("left") is None
        await k.retry("left")
        await k.resume("left", value="yes")
        assert (await k.get("left")).state != "failed"


class RenewalFails(StoreWrapper):
    """A memory store whose next lease renewal fails (``fail_next``), and which keeps
    cancel requests (``CancelsRuns``) as the store under it does."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.fail_next = False

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        if self.fail_next:
            self.fail_next = False
            raise StoreError("the store did not answer the renewal")
        await self.inner.renew(lease, ttl=ttl)

    async def request_cancel(self, run_id: str, request: Cancellation) -> Cancellation | None:
        inner = self.inner
        assert isinstance(inner, CancelsRuns)
        return await inner.request_cancel(run_id, request)

    async def cancel_request(self, run_id: str) -> Cancellation | None:
        inner = self.inner
        assert isinstance(inner, CancelsRuns)
        return await inner.cancel_request(run_id)


async def test_an_intent_held_from_an_earlier_drive_never_starts_after_a_kept_request() -> None:
    """A drive whose call could not start (the lease check before it failed in the store)
    holds its landed intent for the next drive; a cancel request kept meanwhile stops
    that next drive before the call starts, and the call gets an error result saying so."""
    ledger = Ledger()
    store = RenewalFails()
    providers = {"scripted": ScriptedProvider([call("note", {"text": "late"}), "done"])}
    clock = ManualClock(start=0.0)  # the kernel's clock, which its lease checks follow
    outcome: list[str] = []

    async def stale_before_tools(invocation: object, proceed: Any) -> object:
        if isinstance(invocation, ToolInvocation) and not outcome:
            outcome.append("renewal refused")
            clock.advance(20)  # 10 s left, under the 15 s margin: renewed before it starts
            store.fail_next = True
        return await proceed(invocation)

    kernel = sk.Kernel(
        store,
        tools=ledger.tools(),
        providers=providers,
        middleware=[stale_before_tools],
        lease_ttl=30,
        lease_margin=15,
        clock=clock,
    )
    async with kernel:
        await kernel.start(model="scripted/m", messages=["go"], run_id="held")
        with pytest.raises(StoreError):
            await _drain(kernel, "held")
        assert outcome == ["renewal refused"]
        assert ledger.lines == []  # the call never began; its intent is committed
        asked = Cancellation("stop", "ops", utcnow())
        assert await store.request_cancel("held", asked) is None
        await _drain(kernel, "held")
        run = await kernel.get("held")
    assert ledger.lines == []  # nor did it begin after the request
    assert run.state == "failed"
    assert run.current_turn is not None
    (record,) = run.current_turn.completed
    assert record.error == "cancelled before it began: stop"


async def test_a_child_created_after_its_parent_was_cancelled_is_cancelled_with_it() -> None:
    """Another process kept the parent's cancel request and listed its children before a
    running delegate call created its child: the call finds the request and cancels the
    child before the child's model is ever called."""
    helper = ScriptedProvider(["helped"])
    providers = {
        "scripted": ScriptedProvider([call("helper", {"task": "help"}, id="h1"), "done"]),
        "helper": helper,
    }
    store = MemoryStore()

    async def cancelled_elsewhere(invocation: object, proceed: Any) -> object:
        if isinstance(invocation, ToolInvocation):  # as if another process cancelled now
            asked = Cancellation("stop everything", "ops", utcnow())
            await store.request_cancel(invocation.run.run_id, asked)
        return await proceed(invocation)

    helper_tool = sk.delegate("helper", "Help.", model="helper/small")
    kernel = sk.Kernel(
        store, tools=[helper_tool], providers=providers, middleware=[cancelled_elsewhere]
    )
    async with kernel:
        await kernel.start(model="scripted/lead", messages=["go"], run_id="boss")
        await _drain(kernel, "boss")
        parent, child = await kernel.get("boss"), await kernel.get("boss.h1")
    assert helper.requests == []  # the child never called its model
    assert child.state == "failed"
    assert child.failure is not None
    assert child.failure.cancellation is not None
    assert child.failure.cancellation.by == "ops"
    assert parent.state == "failed"
    assert parent.failure is not None
    assert parent.failure.error == "Cancelled"
