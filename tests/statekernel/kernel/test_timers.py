"""Pause timers, on every store: a question or a hook's pause that times out, a durable
sleep, fired by whoever touches the run once it is due (a drive, a command) or by
``fire_due``: once, whoever races for it; ``on_timeout=FAIL`` fails the run with
``PauseTimedOut``, which ``retry`` returns to its pause without the timer. Fired by
workers with nobody else watching: ``tests/statekernel/workers/test_worker_timers.py``."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel._kernel.due import due_runs, fire_due
from statekernel._records.run import utcnow
from statekernel.errors import ConfigError, InvalidArgument, InvalidTransition, PauseTimedOut
from statekernel.testing import ScriptedProvider, call

from .console import EXE, runs_show

ASK = call("ask_user", {"question": "Ship it?"})


def _kernel(url: str, script: list[object], tools: list[sk.Tool], **kw: Any) -> sk.Kernel:
    return sk.Kernel(url, tools=tools, providers={"scripted": ScriptedProvider(script)}, **kw)


async def _paused(kernel: sk.Kernel) -> sk.Run:
    run = await kernel.start(model="scripted/m", messages=["go"])
    async for _ in kernel.run(run.run_id):
        pass
    paused = await kernel.get(run.run_id)
    assert paused.state == "paused"
    return paused


async def _ids(kernel: sk.Kernel) -> list[str]:
    return [run_id async for run_id in due_runs(kernel.store)]


async def test_a_question_that_times_out_takes_its_answer_when_the_run_is_next_driven(
    every_store_url: str,
) -> None:
    ask = sk.ask_user(timeout=0, on_timeout="no answer came")
    kernel = _kernel(every_store_url, [ASK, "shipped"], [ask])
    try:
        paused = await _paused(kernel)
        assert paused.pause is not None
        timer = paused.pause.timer
        assert timer is not None
        assert timer.value == "no answer came"
        assert paused.pause.metadata["timeout"]["on_timeout"] == "no answer came"
        assert await _ids(kernel) == [paused.run_id]  # the listing says it is due
        events = [e async for e in kernel.run(paused.run_id)]
        fired = [e for e in events if e.type == "timer_fired"]
        assert len(fired) == 1
        assert fired[0].data["reason"] == "input_required"
        done = await kernel.get(paused.run_id)
        assert done.state == "completed"
        record = done.turns[0].completed[0]
        assert record.output == "no answer came"
        assert await _ids(kernel) == []
    finally:
        await kernel.aclose()


async def test_a_timer_fires_once_however_many_race_for_it(every_store_url: str) -> None:
    ask = sk.ask_user(timeout=0, on_timeout="late")
    kernels = [_kernel(every_store_url, [ASK, "ok"], [ask]) for _ in range(3)]
    try:
        paused = await _paused(kernels[0])
        if every_store_url == "memory://":
            kernels = kernels[:1]  # a memory store is its kernel's alone
        fired = await asyncio.gather(*(fire_due(k, paused.run_id) for k in kernels * 2))
        assert sum(run is not None for run in fired) == 1
        events = await kernels[0].events(paused.run_id)
        assert [e.type for e in events].count("timer_fired") == 1
        assert [e.type for e in events].count("run_resumed") == 1
    finally:
        for k in kernels:
            await k.aclose()


async def test_a_command_after_the_timeout_finds_the_timer_fired_first(
    every_store_url: str,
) -> None:
    class Gate(sk.Hooks):
        def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision | None:
            if not run.turns[:-1]:  # after the first turn only
                return sk.Pause("review", {"what": "draft"}, timeout=0, on_timeout="auto")
            return None

    kernel = _kernel(every_store_url, ["draft", "final"], [], hooks=Gate())
    try:
        paused = await _paused(kernel)
        with pytest.raises(InvalidTransition):  # the timer fired first: it is not paused
            await kernel.resume(paused.run_id, value="by hand")
        run = await kernel.get(paused.run_id)
        assert run.state == "preparing_turn"
        assert run.resume_value == "auto"
    finally:
        await kernel.aclose()


async def test_on_timeout_fail_fails_the_run_and_retry_waits_without_the_timer(
    every_store_url: str,
) -> None:
    ask = sk.ask_user(timeout=0, on_timeout=sk.FAIL)
    kernel = _kernel(every_store_url, [ASK, "ok"], [ask])
    try:
        paused = await _paused(kernel)
        with pytest.raises(PauseTimedOut) as info:
            async for _ in kernel.run(paused.run_id, raise_on_failure=True):
                pass
        assert info.value.failed_in == "paused"
        assert "input_required" in info.value.message
        await kernel.retry(paused.run_id)
        again = await kernel.get(paused.run_id)
        assert again.state == "paused"
        assert again.pause is not None
        assert again.pause.timer is None
        await kernel.resume(paused.run_id, value="yes")
        async for _ in kernel.run(paused.run_id):
            pass
        assert (await kernel.get(paused.run_id)).state == "completed"
    finally:
        await kernel.aclose()


async def test_a_durable_sleep_wakes_no_earlier_than_asked(every_store_url: str) -> None:
    until = utcnow() + timedelta(milliseconds=200)

    @sk.tool
    def wait_a_bit() -> str:
        """Sleep a little."""
        sk.sleep_until(until, result="rested")

    kernel = _kernel(every_store_url, [call("wait_a_bit", {}), "awake"], [wait_a_bit])
    try:
        paused = await _paused(kernel)
        while await fire_due(kernel, paused.run_id) is None:  # not due yet: nothing fires
            assert (await kernel.get(paused.run_id)).state == "paused"
            await asyncio.sleep(0.05)
        assert utcnow() >= until
        async for _ in kernel.run(paused.run_id):
            pass
        done = await kernel.get(paused.run_id)
        assert done.turns[0].completed[0].output == "rested"
    finally:
        await kernel.aclose()


async def test_timeouts_that_are_not_one_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        sk.Pause("x", timeout=-1)
    with pytest.raises(InvalidArgument, match="not both"):
        sk.Pause("x", timeout=1, until=utcnow())
    with pytest.raises(InvalidArgument, match="aware datetime"):
        sk.Pause("x", until=utcnow().replace(tzinfo=None))
    with pytest.raises(InvalidArgument, match="needs timeout"):
        sk.Pause("x", on_timeout=1)
    with pytest.raises(ConfigError, match="on_timeout"):
        sk.ask_user(answer_schema={"type": "boolean"}, timeout=5, on_timeout="maybe")
    with pytest.raises(ConfigError, match="timeout"):
        sk.ask_user(timeout=float("nan"))
    with pytest.raises(InvalidArgument, match="not JSON"):
        sk.Pause("x", timeout=1, on_timeout={1, 2})


@pytest.mark.skipif(EXE is None, reason="no console script")
def test_runs_show_says_when_a_pause_times_out(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    ask = sk.ask_user(timeout=3600, on_timeout=sk.FAIL)

    async def paused() -> str:
        async with _kernel(url, [ASK], [ask]) as kernel:
            return (await _paused(kernel)).run_id

    run_id = asyncio.run(paused())
    shown = runs_show(run_id, url)
    assert "times out" in shown
    assert "the run fails" in shown
