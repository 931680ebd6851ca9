"""Cancellation and resume: nothing half-committed, no `failed`, resumable from the last commit."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest

import statekernel as sk
from statekernel.testing import Reply, ScriptedProvider, call

from ..conftest import MakeKernel, RecordingStore, drain, start

EFFECTS: list[tuple[str, str]] = []
GATE: dict[str, asyncio.Event] = {}


ROUNDS = 60
"""Drives cancelled at a random moment, per store."""


@sk.tool(idempotent=True)
async def look(what: str) -> str:
    """Look at something (idempotent)."""
    return f"saw {what}"


def setup_function() -> None:
    EFFECTS.clear()
    GATE.clear()


@sk.tool
async def charge(amount: int, ctx: sk.ToolContext) -> str:
    """Charge a card (not idempotent)."""
    EFFECTS.append(("charge", ctx.idempotency_key))
    await GATE.setdefault("tool", asyncio.Event()).wait()
    return f"charged {amount}"


@sk.tool(idempotent=True)
async def lookup(key: str, ctx: sk.ToolContext) -> str:
    """Look something up (idempotent)."""
    EFFECTS.append(("lookup", ctx.idempotency_key))
    await GATE.setdefault("tool", asyncio.Event()).wait()
    return f"value of {key}"


@sk.tool
async def upload(name: str) -> str:
    """Upload a file; on cancellation it takes a few loop turns to clean up."""
    EFFECTS.append(("upload", name))
    try:
        await GATE.setdefault("tool", asyncio.Event()).wait()
    finally:
        for _ in range(5):
            await asyncio.sleep(0)
        EFFECTS.append(("upload ended", name))
    return f"uploaded {name}"


class Blocking:
    """A sync (thread) tool that blocks until released; notes when it starts and ends."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.ended = threading.Event()

        @sk.tool
        def transfer(amount: int) -> str:
            """Transfer money (not idempotent, blocking)."""
            self.started.set()
            self.release.wait(5)
            self.ended.set()
            return f"transferred {amount}"

        self.tool = transfer

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, 5)


async def still_running(task: asyncio.Future[Any]) -> bool:
    """True if ``task`` has not ended after the loop had a while to end it."""
    done, _ = await asyncio.wait({task}, timeout=0.05)
    return not done


async def run_until(kernel: sk.Kernel, run_id: str, event_type: str) -> list[sk.Event]:
    """Iterate until ``event_type`` is yielded, then close the generator."""
    seen = []
    gen = cast("AsyncGenerator[sk.Event, None]", kernel.run(run_id))  # an async generator
    async for event in gen:
        seen.append(event)
        if event.type == event_type:
            break
    await gen.aclose()
    return seen


async def cancel_when(kernel: sk.Kernel, run_id: str, ready: Any) -> None:
    task = asyncio.create_task(drain(kernel, run_id))
    while not ready():  # noqa: ASYNC110 - polls what the tool under test records
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def no_failed(store: RecordingStore, run_id: str) -> None:
    assert "failed" not in store.states(run_id)


async def test_cancel_during_the_model_call(make_kernel: MakeKernel) -> None:
    kernel, store, provider = make_kernel([Reply(text="slow answer", delay=30)])
    run = await start(kernel)
    await cancel_when(kernel, run.run_id, lambda: provider.requests)
    head = await kernel.get(run.run_id)
    assert head.state == "calling_model"
    assert head == store.checkpoints[-1].run  # the last commit is intact
    no_failed(store, run.run_id)
    kernel2 = sk.Kernel(store, providers={"scripted": sk.testing.ScriptedProvider(["fast"])})
    events = await drain(kernel2, run.run_id)
    kinds = [e.type for e in events if e.persisted]
    assert kinds[0] == "model_restarted"
    assert (await kernel2.get(run.run_id)).messages[-1].text == "fast"


async def test_closing_the_generator_stops_cleanly(make_kernel: MakeKernel) -> None:
    kernel, store, _ = make_kernel([Reply(text="abcdef", chunk=1)])
    run = await start(kernel)
    seen = await run_until(kernel, run.run_id, "text_delta")
    head = await kernel.get(run.run_id)
    assert head.revision == seen[-2].revision  # model_started is the last commit
    assert head.state == "calling_model"
    no_failed(store, run.run_id)
    await drain(kernel, run.run_id)
    assert (await kernel.get(run.run_id)).state == "completed"


async def test_cancel_during_a_non_idempotent_tool_pauses_until_resolved(
    make_kernel: MakeKernel,
) -> None:
    kernel, store, _ = make_kernel([call("charge", {"amount": 5}), "paid"], tools=[charge])
    run = await start(kernel)
    await cancel_when(kernel, run.run_id, lambda: EFFECTS)
    head = await kernel.get(run.run_id)
    assert head.state == "dispatching_tools"
    assert head.current_turn is not None
    assert [r.id for r in head.current_turn.in_flight] == ["call_0_0"]
    no_failed(store, run.run_id)

    GATE["tool"].set()
    events = await drain(kernel, run.run_id)
    assert [e.type for e in events] == ["run_paused"]
    paused = await kernel.get(run.run_id)
    assert paused.pause is not None
    assert paused.pause.reason == "uncertain_tool_calls"
    assert paused.pause.metadata["calls"] == [
        {"id": "call_0_0", "name": "charge", "input": {"amount": 5}, "attempt": 1}
    ]
    assert len(EFFECTS) == 1  # never re-run on its own

    with pytest.raises(sk.errors.InvalidArgument):
        await kernel.resolve_tool_call(run.run_id, "call_0_0")
    await kernel.resolve_tool_call(run.run_id, "call_0_0", output="charged 5 (confirmed)")
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert final.turns[0].completed[0].output == "charged 5 (confirmed)"
    assert len(EFFECTS) == 1


async def test_resolve_with_rerun_runs_the_call_again(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel([call("charge", {"amount": 5}), "paid"], tools=[charge])
    run = await start(kernel)
    await cancel_when(kernel, run.run_id, lambda: EFFECTS)
    GATE["tool"].set()
    await drain(kernel, run.run_id)
    await kernel.resolve_tool_call(run.run_id, "call_0_0", rerun=True)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert final.turns[0].completed[0].attempt == 2
    assert [("charge", f"{run.run_id}:call_0_0")] * 2 == EFFECTS


async def test_in_flight_idempotent_tools_rerun_with_the_same_key(make_kernel: MakeKernel) -> None:
    kernel, store, _ = make_kernel([call("lookup", {"key": "k"}), "found"], tools=[lookup])
    run = await start(kernel)
    await cancel_when(kernel, run.run_id, lambda: EFFECTS)
    no_failed(store, run.run_id)
    GATE["tool"].set()
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert [("lookup", f"{run.run_id}:call_0_0")] * 2 == EFFECTS
    assert final.turns[0].completed[0].attempt == 2


async def test_resolve_needs_an_uncertain_call(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel(["x"])
    run = await start(kernel)
    with pytest.raises(sk.InvalidTransition):
        await kernel.resolve_tool_call(run.run_id, "c", output=1)


async def test_partial_resolution_waits_for_every_uncertain_call(make_kernel: MakeKernel) -> None:
    calls = [call("charge", {"amount": 1}), call("charge", {"amount": 2})]
    kernel, _, _ = make_kernel([calls, "ok"], tools=[charge])
    run = await start(kernel)
    await cancel_when(kernel, run.run_id, lambda: len(EFFECTS) == 2)
    GATE["tool"].set()
    await drain(kernel, run.run_id)
    paused = await kernel.get(run.run_id)
    assert [c["id"] for c in paused.pause.metadata["calls"]] == ["call_0_0", "call_0_1"]  # type: ignore[union-attr]
    with pytest.raises(sk.InvalidTransition, match=r"call_0_0.*resolve_tool_call"):
        await kernel.send(run.run_id, "never mind")  # may have run: never "not run"
    still = await kernel.resolve_tool_call(run.run_id, "call_0_0", error="card declined")
    assert still.state == "paused"
    done = await kernel.resolve_tool_call(run.run_id, "call_0_1", output="ok")
    assert done.state == "dispatching_tools"
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    by_id = {r.id: r for r in final.turns[0].completed}
    assert by_id["call_0_0"].error == "card declined"
    assert by_id["call_0_1"].output == "ok"
    assert by_id["call_0_0"].resolved
    assert by_id["call_0_1"].resolved
    assert len(EFFECTS) == 2
    events = await kernel.events(run.run_id)
    answers = [e.data for e in events if e.type == "tool_call_resolved"]
    assert answers == [
        {"call_id": "call_0_0", "resolution": {"error": "card declined", "attempt": 1}},
        {"call_id": "call_0_1", "resolution": {"output": "ok", "attempt": 1}},
    ]
    completed = [e.data for e in events if e.type == "tool_call_completed"]
    assert all(d.get("resolved") is True for d in completed)


async def test_a_failure_of_the_model_work_while_stopping_is_raised() -> None:
    from statekernel._kernel.drive import RunDriver
    from statekernel._kernel.model_call import pump

    kernel = sk.Kernel(RecordingStore(), providers={"scripted": ScriptedProvider([])})
    run = await start(kernel)
    driver = RunDriver(kernel, run)
    stopped = asyncio.Event()

    async def work() -> None:
        driver.queue.put_nowait(sk.Event("text_delta", run.run_id, 0))
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
            raise RuntimeError("the model call failed while stopping")

    live = cast("AsyncGenerator[sk.Event, None]", pump(driver.queue, work()))  # an async generator
    async for _ in live:
        break
    with pytest.raises(RuntimeError, match="while stopping"):
        await live.aclose()
    assert stopped.is_set()


async def test_cancelling_run_awaits_its_tool_tasks(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel([call("upload", {"name": "a"}), "ok"], tools=[upload])
    run = await start(kernel)
    await cancel_when(kernel, run.run_id, lambda: EFFECTS)
    assert EFFECTS == [("upload", "a"), ("upload ended", "a")]


async def test_closing_the_generator_awaits_its_tool_tasks(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel([call("upload", {"name": "a"}), "ok"], tools=[upload])
    run = await start(kernel)
    gen = cast("AsyncGenerator[sk.Event, None]", kernel.run(run.run_id))  # an async generator
    async for event in gen:
        if event.type == "tool_call_started":
            break
    while not EFFECTS:  # noqa: ASYNC110 - lets the tool task start
        await asyncio.sleep(0)
    await gen.aclose()
    assert EFFECTS == [("upload", "a"), ("upload ended", "a")]


async def test_aclose_awaits_background_tool_tasks(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel([call("upload", {"name": "a"}), "ok"], tools=[upload])
    run = await start(kernel)
    while (await kernel.get(run.run_id)).state != "dispatching_tools":
        await kernel.step(run.run_id)  # the answer and the call's intent: it runs on
    while not EFFECTS:  # noqa: ASYNC110 - lets the tool task start
        await asyncio.sleep(0)
    await kernel.aclose()
    assert EFFECTS == [("upload", "a"), ("upload ended", "a")]


async def test_a_cancelled_drive_waits_for_a_sync_tool_thread(make_kernel: MakeKernel) -> None:
    blocking = Blocking()
    kernel, store, _ = make_kernel([call("transfer", {"amount": 5}), "ok"], tools=[blocking.tool])
    run = await start(kernel)
    task = asyncio.create_task(drain(kernel, run.run_id))
    await blocking.wait_started()
    task.cancel()
    assert await still_running(task)  # the call is still executing: the drive has not stopped
    blocking.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert blocking.ended.is_set()
    head = await kernel.get(run.run_id)
    assert [r.id for r in head.current_turn.in_flight] == ["call_0_0"]  # type: ignore[union-attr]
    no_failed(store, run.run_id)


async def test_a_drive_cancelled_twice_still_waits_for_the_thread(
    make_kernel: MakeKernel,
) -> None:
    blocking = Blocking()
    kernel, _, _ = make_kernel([call("transfer", {"amount": 5}), "ok"], tools=[blocking.tool])
    run = await start(kernel)
    task = asyncio.create_task(drain(kernel, run.run_id))
    await blocking.wait_started()
    task.cancel()
    assert await still_running(task)
    task.cancel()
    assert await still_running(task)
    blocking.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert blocking.ended.is_set()


async def test_aclose_waits_for_a_sync_tool_thread(make_kernel: MakeKernel) -> None:
    blocking = Blocking()
    kernel, _, _ = make_kernel([call("transfer", {"amount": 5}), "ok"], tools=[blocking.tool])
    run = await start(kernel)
    while (await kernel.get(run.run_id)).state != "dispatching_tools":
        await kernel.step(run.run_id)  # the answer and the call's intent: it runs on
    await blocking.wait_started()
    closing = asyncio.create_task(kernel.aclose())
    assert await still_running(closing)
    blocking.release.set()
    await closing
    assert blocking.ended.is_set()


async def test_a_drive_cancelled_at_any_moment_stops_with_the_cancellation(
    every_store_url: str,
) -> None:
    """Drives cancelled after a random number of loop turns, on every store: each one
    either ended before the cancellation or raises it, never goes on as if not
    cancelled (a cancellation lost in a store's client let a drive run to the end of
    its run). The stores' own tests cancel in every turn of one call; this one covers
    the calls a drive makes."""
    rng = random.Random(5)
    script: list[object] = []
    for _ in range(ROUNDS):
        script += [call("look", {"what": "x"}), "seen"]
    providers = {"scripted": ScriptedProvider(script)}
    async with sk.Kernel(every_store_url, tools=[look], providers=providers) as kernel:
        lost: list[str] = []

        async def drive() -> None:
            task = asyncio.current_task()
            assert task is not None
            run = await kernel.start(model="scripted/m", messages=["go"])
            async for event in kernel.run(run.run_id):
                if task.cancelling():
                    lost.append(f"{event.type} yielded after the cancellation")
                    return
            if task.cancelling():
                lost.append("the drive ended as if not cancelled")

        cancelled = 0
        for _ in range(ROUNDS):
            task = asyncio.create_task(drive())
            for _ in range(rng.randrange(200)):
                await asyncio.sleep(0)
            if task.cancel():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                cancelled += 1
            else:
                await task
        assert lost == []
        assert cancelled > 0
