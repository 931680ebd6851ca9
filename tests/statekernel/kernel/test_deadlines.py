"""Deadlines: ``start(deadline=|timeout=)`` stops a run past its deadline at the next safe
point, as a cancel stops it, failing with ``DeadlineExceeded`` (``deadline_exceeded``, then
``run_failed``); a run paused past it fails when it is next touched; ``retry`` goes on
without the deadline; ``delegate(timeout=)`` gives a child run its own. The tests wait for
the deadline to pass, never for a number of seconds."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

import statekernel as sk
from statekernel.errors import DeadlineExceeded, InvalidArgument, InvalidTransition
from statekernel.testing import ScriptedProvider, call


async def _until(moment: datetime) -> None:
    """Return once the wall clock is past ``moment``."""
    await asyncio.sleep((moment - datetime.now(UTC)).total_seconds() + 0.01)
    assert datetime.now(UTC) > moment


async def _drive(kernel: sk.Kernel, run_id: str, seen: list[str]) -> None:
    async for event in kernel.run(run_id, raise_on_failure=True):
        seen.append(event.type)


class Blocking:
    """A tool that waits until it is cancelled, and what it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.began = asyncio.Event()

    def tool(self) -> sk.Tool:
        seen, began = self.seen, self.began

        @sk.tool
        async def wait_for_bank(amount: int) -> str:
            """Wait for the bank (not idempotent).

            Args:
                amount: How much.
            """
            seen.append("began")
            began.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            return "ok"

        return wait_for_bank


async def test_a_deadline_passing_mid_run_stops_it_and_fails_it(every_store_url: str) -> None:
    """A deadline that passes while the tool waits. On a slow machine it may pass before
    the tool begins (the run fails all the same, nothing began): the next attempt then
    gives the run twice the time."""
    timeout = 0.4
    while True:
        blocking = Blocking()
        script = ScriptedProvider([call("wait_for_bank", {"amount": 3}), "done"])
        tools, providers = [blocking.tool()], {"scripted": script}
        async with sk.Kernel(every_store_url, tools=tools, providers=providers) as kernel:
            run = await kernel.start(model="scripted/m", messages=["pay"], timeout=timeout)
            assert run.deadline is not None
            seen: list[str] = []
            with pytest.raises(DeadlineExceeded) as raised:
                await _drive(kernel, run.run_id, seen)
            failed = await kernel.get(run.run_id)
        assert datetime.now(UTC) >= run.deadline
        assert seen[-2:] == ["deadline_exceeded", "run_failed"]
        assert raised.value.error == "DeadlineExceeded"
        assert failed.failure is not None
        assert failed.failure.error == "DeadlineExceeded"
        assert failed.failure.cancellation is not None
        assert failed.failure.cancellation.by == "deadline"
        assert failed.failure.cancellation.at == run.deadline
        if blocking.seen:
            break
        assert timeout < 30, "the tool never began before the deadline"
        timeout *= 2
    assert blocking.seen == ["began", "cancelled"]  # began before it, stopped at it
    assert failed.failure.failed_in == "dispatching_tools"


class AskFirst(sk.Hooks):
    def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision | None:
        return None if run.resume_value == "yes" else sk.Pause("approval", {"ask": "go on?"})


@sk.tool(idempotent=True)
def look(key: str) -> str:
    """Look something up.

    Args:
        key: What.
    """
    return key


async def test_a_run_paused_past_its_deadline_fails_when_touched_and_retry_goes_on(
    every_store_url: str,
) -> None:
    """Two runs pause before their deadline (a slow machine gets twice the time on the
    next attempt); once it passed, a command and a drive each fail theirs."""

    def providers() -> dict[str, ScriptedProvider]:
        return {"scripted": ScriptedProvider([call("look", {"key": "k"}), "all done"])}

    kernel = sk.Kernel(every_store_url, tools=[look], hooks=AskFirst(), providers=providers())
    async with kernel:
        delay, attempt = 0.3, 0
        while True:
            attempt += 1
            soon = datetime.now(UTC) + timedelta(seconds=delay)
            ids = (f"by-resume-{attempt}", f"by-run-{attempt}")
            for run_id in ids:
                await kernel.start(
                    model="scripted/m", messages=["go"], run_id=run_id, deadline=soon
                )
                async for _ in kernel.run(run_id):
                    pass
            states = [(await kernel.get(run_id)).state for run_id in ids]
            if states == ["paused", "paused"]:
                break
            assert delay < 30, states
            delay *= 2
        by_resume, by_run = ids
        await _until(soon)
        with pytest.raises(InvalidTransition) as refused:
            await kernel.resume(by_resume, value="yes")
        assert "DeadlineExceeded" in str(refused.value)
        events = [e.type async for e in kernel.run(by_run)]
        assert events == ["deadline_exceeded", "run_failed"]
        for run_id in ids:
            failed = await kernel.get(run_id)
            assert failed.failure is not None
            assert failed.failure.error == "DeadlineExceeded"
            assert failed.failure.failed_in == "paused"
        back = await kernel.retry(by_run)
        assert back.state == "paused"
        assert back.deadline is None  # retried on purpose: it goes on without one
        await kernel.resume(by_run, value="yes")
        async for _ in kernel.run(by_run):
            pass
        assert (await kernel.get(by_run)).state == "completed"


async def test_deadline_and_timeout_are_checked() -> None:
    async with sk.Kernel("memory://", providers={"scripted": ScriptedProvider(["x"])}) as kernel:
        now = datetime.now(UTC)
        with pytest.raises(InvalidArgument, match="not both"):
            await kernel.start(model="scripted/m", deadline=now, timeout=1)
        with pytest.raises(InvalidArgument, match="timezone-aware"):
            await kernel.start(model="scripted/m", deadline=datetime(2030, 1, 1))
        with pytest.raises(InvalidArgument):
            await kernel.start(model="scripted/m", timeout=-1)
        past = await kernel.start(model="scripted/m", deadline=now - timedelta(seconds=1))
        events = [e.type async for e in kernel.run(past.run_id)]
        assert events == ["deadline_exceeded", "run_failed"]  # no model call was made
        failed = await kernel.get(past.run_id)
        assert failed.failure is not None
        assert failed.failure.failed_in == "init"


async def test_a_child_run_past_its_timeout_is_an_error_result_of_its_call() -> None:
    blocking = Blocking()
    helper = sk.delegate(
        "helper", "Help.", model="helper/small", tools=[blocking.tool()], timeout=0.3
    )
    providers = {
        "scripted": ScriptedProvider([call("helper", {"task": "pay 3"}, id="h1"), "gave up"]),
        "helper": ScriptedProvider([call("wait_for_bank", {"amount": 3}), "paid"]),
    }
    async with sk.Kernel("memory://", tools=[helper], providers=providers) as kernel:
        run = await kernel.start(model="scripted/lead", messages=["go"], run_id="lead")
        async for _ in kernel.run(run.run_id):
            pass
        parent, child = await kernel.get("lead"), await kernel.get("lead.h1")
    assert child.failure is not None
    assert child.failure.error == "DeadlineExceeded"
    assert blocking.seen in ([], ["began", "cancelled"])  # it may pass before the tool began
    assert parent.state == "completed"
    assert parent.turns[0].completed[0].error is not None
    assert "DeadlineExceeded" in parent.turns[0].completed[0].error


async def test_a_timeout_too_large_for_a_datetime_is_an_invalid_argument() -> None:
    async with sk.Kernel("memory://", providers={"scripted": ScriptedProvider(["x"])}) as kernel:
        with pytest.raises(InvalidArgument, match="timeout"):
            await kernel.start(model="scripted/m", timeout=1e12)
    with pytest.raises(InvalidArgument, match="timeout"):
        sk.delegate("helper", "Help.", model="helper/small", timeout=1e12)
