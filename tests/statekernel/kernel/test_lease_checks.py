"""Effects start only under a live lease; commands never cut a live drive; delete takes
the lease. In one process, on every store (the process tests are in
``test_stalled_owner.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import statekernel as sk
from statekernel._storage.protocol import CheckpointStore, Lease, StoreWrapper
from statekernel.errors import LeaseLost, StoreError
from statekernel.middleware import ModelCall, ToolInvocation
from statekernel.testing import ManualClock, ScriptedProvider

from .test_ownership import (
    SCRIPT,
    Ledger,
    clock,
    clocked_store,
    drain,
    kernel_on,
    opened,
    store_url,
)

__all__ = ["clock", "clocked_store", "store_url"]  # fixtures shared with test_ownership

TTL = 30.0


def stealing(
    store: CheckpointStore,
    clock: ManualClock,
    kind: type[ModelCall] | type[ToolInvocation],
    taken: list[object],
) -> Any:
    """Middleware that, at the first call of ``kind``, lets the kernel's lease expire on
    ``clock`` and gives the run to another owner, then lets the call go on."""

    async def steal(invocation: Any, call_next: Any) -> Any:
        if isinstance(invocation, kind) and not taken:
            clock.advance(TTL + 1)
            run_id = invocation.run.run_id
            taken.append(await store.acquire(run_id, "other", ttl=TTL))
        return await call_next(invocation)

    return steal


async def test_a_tool_never_starts_once_the_lease_moved_on(
    clocked_store: CheckpointStore, clock: ManualClock
) -> None:
    store, ledger = clocked_store, Ledger()
    taken: list[object] = []
    steal = stealing(store, clock, ToolInvocation, taken)
    kernel = kernel_on(store, ledger, middleware=[steal], lease_ttl=TTL, clock=clock)
    run = await kernel.start(model="scripted/x", messages=["pay"])
    with pytest.raises(LeaseLost):
        await drain(kernel, run.run_id)
    assert taken, "the lease was given to another owner"
    assert ledger.started == [], "a call started under a lease that had moved on"
    head = await store.load(run.run_id)
    assert head.current_turn is not None
    assert [r.name for r in head.current_turn.in_flight] == ["charge"]  # its intent stays
    await kernel.aclose()


async def test_a_model_call_never_starts_once_the_lease_moved_on(
    clocked_store: CheckpointStore, clock: ManualClock
) -> None:
    store = clocked_store
    taken: list[object] = []
    provider = ScriptedProvider(SCRIPT)
    steal = stealing(store, clock, ModelCall, taken)
    kernel = sk.Kernel(
        store,
        tools=Ledger().tools(),
        providers={"scripted": provider},
        middleware=[steal],
        lease_ttl=TTL,
        clock=clock,
    )
    run = await kernel.start(model="scripted/x", messages=["pay"])
    with pytest.raises(LeaseLost):
        await drain(kernel, run.run_id)
    assert taken
    assert provider.requests == [], "the model was called under a lease that had moved on"
    assert (await store.load(run.run_id)).state == "calling_model"
    await kernel.aclose()


async def test_an_owner_that_stalled_renews_before_it_starts_a_call(
    clocked_store: CheckpointStore, clock: ManualClock
) -> None:
    """A stall that outlasts the margin but in which nobody took the run over: the lease is
    renewed before the call, which then runs."""
    store, ledger = clocked_store, Ledger()

    async def stall(invocation: Any, call_next: Any) -> Any:
        if isinstance(invocation, ToolInvocation):
            clock.advance(TTL - 1)  # less than the margin is left, the lease still holds
        return await call_next(invocation)

    kernel = kernel_on(store, ledger, middleware=[stall], lease_ttl=TTL, clock=clock)
    run = await kernel.start(model="scripted/x", messages=["pay"])
    await drain(kernel, run.run_id)
    assert (await store.load(run.run_id)).state == "completed"
    assert len(ledger.started) == 2
    await kernel.aclose()


async def test_tools_get_the_fencing_token_and_it_grows_with_every_owner(
    store_url: str,
) -> None:
    tokens: list[int | None] = []

    @sk.tool
    async def note(text: str, ctx: sk.ToolContext) -> str:
        """Notes the token the call started under."""
        tokens.append(ctx.fencing_token)
        return "noted"

    script = [sk.testing.call("note", {"text": "a"}), "ok", sk.testing.call("note", {"text": "b"})]
    async with opened(store_url) as store:
        kernel = sk.Kernel(store, tools=[note], providers={"scripted": ScriptedProvider(script)})
        run = await kernel.start(model="scripted/x", messages=["one"])
        await drain(kernel, run.run_id)
        await kernel.aclose()
        other = sk.Kernel(
            store, tools=[note], providers={"scripted": ScriptedProvider([*script, "done"])}
        )
        async for _ in other.run(run.run_id, "two"):
            pass
        await other.aclose()
    assert len(tokens) == 2
    assert all(type(t) is int for t in tokens)
    first, second = tokens
    assert first is not None
    assert second is not None
    assert second > first


async def test_update_context_never_cuts_a_running_call(store_url: str) -> None:
    ledger = Ledger()
    async with opened(store_url) as store:
        kernel = kernel_on(store, ledger, hold=True)
        run = await kernel.start(model="scripted/x", messages=["pay"])
        driving = asyncio.create_task(drain(kernel, run.run_id))
        while not ledger.started:  # noqa: ASYNC110 - waits for the call to be in its effect
            await asyncio.sleep(0.005)
        updated = await kernel.update_context(run.run_id, lambda c: {**c, "note": 1})
        assert updated.context == {"note": 1}
        assert not driving.done()
        ledger.gate.set()
        await driving  # no conflict, no cancellation
        final = await store.load(run.run_id)
        assert final.state == "completed"
        assert final.context == {"note": 1}
        kinds = [e.type for e in await store.events(run.run_id)]
        assert "run_paused" not in kinds
        assert kinds.count("tool_call_completed") == 2
        assert ledger.running == dict.fromkeys(ledger.running, 0)
        assert len(ledger.started) == 2
        assert all(r.error is None for t in final.turns for r in t.completed), "a call was cut off"
        await kernel.aclose()


async def test_every_command_on_a_live_drive_of_its_kernel_is_refused_or_lands_never_cuts(
    store_url: str,
) -> None:
    """``send``, ``resume``, ``retry``, ``resolve_tool_call``, ``update_context`` and
    ``fork`` while the kernel's own drive runs a payment: each is refused with a typed
    error (the lifecycle does not allow it now) or lands between the drive's commits; the
    payment runs once and completes."""
    ledger = Ledger()
    async with opened(store_url) as store:
        kernel = kernel_on(store, ledger, hold=True)
        run = await kernel.start(model="scripted/x", messages=["pay"])
        driving = asyncio.create_task(drain(kernel, run.run_id))
        while not ledger.started:  # noqa: ASYNC110 - waits for the call to be in its effect
            await asyncio.sleep(0.005)
        rid = run.run_id
        refused = {
            "send": kernel.send(rid, "more"),
            "resume": kernel.resume(rid),
            "retry": kernel.retry(rid),
            "resolve_tool_call": kernel.resolve_tool_call(rid, "call_0_0", rerun=True),
        }
        for name, command in refused.items():
            with pytest.raises(sk.InvalidTransition):
                await command
            assert not driving.done(), name
        await kernel.update_context(rid, lambda c: {**c, "note": 1})
        forked = await kernel.fork(rid)
        assert forked.state == "dispatching_tools"
        ledger.gate.set()
        await driving
        final = await store.load(rid)
        assert final.state == "completed"
        assert final.context == {"note": 1}
        assert len(ledger.started) == 2  # each call once, none cut off
        assert all(r.error is None for t in final.turns for r in t.completed)
        await kernel.aclose()


async def test_delete_waits_for_a_live_drive_and_never_cuts_it(store_url: str) -> None:
    ledger = Ledger()
    async with opened(store_url) as store:
        kernel = kernel_on(store, ledger, hold=True, busy_timeout=0.1)
        run = await kernel.start(model="scripted/x", messages=["pay"])
        driving = asyncio.create_task(drain(kernel, run.run_id))
        while not ledger.started:  # noqa: ASYNC110 - waits for the call to be in its effect
            await asyncio.sleep(0.005)
        other = sk.Kernel(store, busy_timeout=0.1)
        with pytest.raises(sk.RunBusy) as busy:
            await other.delete(run.run_id)
        assert busy.value.owner == kernel.owner
        with pytest.raises(sk.RunBusy):  # the same kernel waits for its own drive too
            await kernel.delete(run.run_id)
        assert (await store.load(run.run_id)).run_id == run.run_id  # nothing deleted
        ledger.gate.set()
        await driving
        assert (await store.load(run.run_id)).state == "completed"
        assert await other.delete(run.run_id) == [run.run_id]
        with pytest.raises(sk.RunNotFound):
            await store.load(run.run_id)
        await other.aclose()
        await kernel.aclose()


async def test_deleting_a_tree_while_a_delegate_call_starts_leaves_no_orphan(
    store_url: str,
) -> None:
    """``delete(parent, children=True)`` while the parent's delegate call is about to
    create its child: the delete waits for the drive and is refused (``RunBusy``), so the
    child is created under a parent that still exists; once the drive ended, the delete
    takes the whole tree, and no run is left behind."""
    gate, entered = asyncio.Event(), asyncio.Event()

    async def held(invocation: Any, call_next: Any) -> Any:
        if isinstance(invocation, ToolInvocation):  # its intent is committed
            entered.set()
            await gate.wait()
        return await call_next(invocation)

    helper = sk.delegate("helper", "Ask the helper.", model="helper/small")
    providers = {
        "scripted": ScriptedProvider([sk.testing.call("helper", {"task": "sum"}), "42"]),
        "helper": ScriptedProvider(["the sum is 42"]),
    }
    async with opened(store_url) as store:
        kernel = sk.Kernel(store, tools=[helper], providers=providers, middleware=[held])
        other = sk.Kernel(store, busy_timeout=0.1)
        run = await kernel.start(model="scripted/x", messages=["go"])
        driving = asyncio.create_task(drain(kernel, run.run_id))
        await entered.wait()
        with pytest.raises(sk.RunBusy) as busy:
            await other.delete(run.run_id, children=True)
        assert busy.value.owner == kernel.owner
        assert (await store.load(run.run_id)).run_id == run.run_id  # nothing deleted
        gate.set()
        await driving
        parent = await store.load(run.run_id)
        assert parent.state == "completed"
        (child,) = await kernel.children(run.run_id)
        assert child.parent_run_id == run.run_id
        assert await other.delete(run.run_id, children=True) == [child.run_id, run.run_id]
        for run_id in (run.run_id, child.run_id):
            with pytest.raises(sk.RunNotFound):
                await store.load(run_id)
        assert (await store.list_runs()).runs == ()
        await other.aclose()
        await kernel.aclose()


class RenewFailsOnce(StoreWrapper):
    """The first renewal fails in the store; later ones go through."""

    failed = False

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        if not self.failed:
            self.failed = True
            raise StoreError("connection reset")
        await self.inner.renew(lease, ttl=ttl)


async def test_a_call_a_retrying_middleware_starts_after_a_refusal_runs_once(
    clocked_store: CheckpointStore, clock: ManualClock
) -> None:
    """The lease check refuses the first attempt (the store failed), a middleware calls
    ``next`` again, the check passes and the call runs: its result stands, and no later
    drive runs it again."""
    store, ledger = RenewFailsOnce(clocked_store), Ledger()
    attempts: list[str] = []

    async def retry(invocation: Any, call_next: Any) -> Any:
        if not isinstance(invocation, ToolInvocation):
            return await call_next(invocation)
        if not attempts:
            clock.advance(TTL - 1)  # less than the margin left: the check renews
        for _ in range(2):
            attempts.append(invocation.call.id)
            try:
                return await call_next(invocation)
            except StoreError:
                continue
        raise AssertionError("unreachable")

    kernel = kernel_on(store, ledger, middleware=[retry], lease_ttl=TTL, clock=clock)
    run = await kernel.start(model="scripted/x", messages=["pay"])
    await drain(kernel, run.run_id)
    assert store.failed
    assert (await store.load(run.run_id)).state == "completed"
    assert sorted(ledger.started) == sorted(set(ledger.started)), "a call ran twice"
    assert len(ledger.started) == 2
    await kernel.aclose()


async def test_input_a_command_overtook_is_refused_not_dropped(store_url: str) -> None:
    """``run(run_id, "A")`` stages A; a hook sends B meanwhile (a command of the same
    kernel): B lands, and the drive says its A no longer applies instead of losing it."""
    holder: dict[str, sk.Kernel] = {}

    class SendsMeanwhile(sk.Hooks):
        sent = False

        async def on_turn_prepared(self, run: sk.Run, request: Any) -> Any:
            if not self.sent and len(run.turns) == 1:
                self.sent = True
                await holder["k"].send(run.run_id, "B")
            return None

    async with opened(store_url) as store:
        kernel = sk.Kernel(
            store,
            providers={"scripted": ScriptedProvider(["one", "two", "three"])},
            hooks=SendsMeanwhile(),
        )
        holder["k"] = kernel
        run = await kernel.start(model="scripted/x", messages=["first"])
        await drain(kernel, run.run_id)
        with pytest.raises(sk.ConflictError):
            async for _ in kernel.run(run.run_id, "A"):
                pass
        texts = [m.text for m in (await store.load(run.run_id)).messages if m.role == "user"]
        assert texts == ["first", "B"]
        await drain(kernel, run.run_id)  # B's turn goes on
        done = await store.load(run.run_id)
        assert done.state == "completed"
        assert [m.text for m in done.messages if m.role == "user"] == ["first", "B"]
        await kernel.aclose()
