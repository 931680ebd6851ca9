"""A run that fails says so: a WARNING naming the error, ``RunFailed`` when the drive is
asked to raise, and commands refused on a failed (or completed) run name the way out."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import statekernel as sk
from statekernel.errors import AuthenticationFailed, InvalidArgument, InvalidTransition, RunFailed
from statekernel.testing import Fail, Reply, ScriptedProvider

NO_KEY = "no API key: set OPENAI_API_KEY"


def failing_kernel(tmp_path: Path) -> sk.Kernel:
    model = ScriptedProvider([Fail(AuthenticationFailed(NO_KEY), then=Reply("Hello."))])
    return sk.Kernel(f"sqlite:///{tmp_path}/runs.db", providers={"scripted": model})


async def failed_run(kernel: sk.Kernel) -> str:
    run = await kernel.start(model="scripted/x", messages=["Hi."])
    async for _ in kernel.run(run.run_id):
        pass
    return run.run_id


async def drive(kernel: sk.Kernel, run_id: str, *messages: str, seen: list[str]) -> None:
    async for event in kernel.run(run_id, *messages, raise_on_failure=True):
        seen.append(event.type)


async def step_until_rest(kernel: sk.Kernel, run_id: str) -> None:
    while await kernel.step(run_id, raise_on_failure=True):
        pass


async def command_on(kernel: sk.Kernel, run_id: str, command: str) -> None:
    if command == "send":
        await kernel.send(run_id, "Again?")
    elif command == "resume":
        await kernel.resume(run_id, value=True)
    elif command == "resolve":
        await kernel.resolve_tool_call(run_id, "call_1", rerun=True)
    else:
        async for _ in kernel.run(run_id, "Again?"):
            pass


async def test_a_failed_run_logs_a_warning_with_the_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="statekernel")
    async with failing_kernel(tmp_path) as kernel:
        run_id = await failed_run(kernel)
        assert (await kernel.get(run_id)).state == "failed"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    said = warnings[0].getMessage()
    assert run_id in said
    assert f"AuthenticationFailed: {NO_KEY}" in said
    assert "retry" in said


async def test_raise_on_failure_raises_once_the_failure_is_committed(tmp_path: Path) -> None:
    async with failing_kernel(tmp_path) as kernel:
        run = await kernel.start(model="scripted/x", messages=["Hi."])
        seen: list[str] = []
        with pytest.raises(RunFailed) as caught:
            await drive(kernel, run.run_id, seen=seen)
        assert seen[-1] == "run_failed"  # yielded before the error
        failed = caught.value
        assert (failed.run_id, failed.error, failed.message) == (
            run.run_id,
            "AuthenticationFailed",
            NO_KEY,
        )
        head = await kernel.get(run.run_id)
        assert head.state == "failed"
        assert failed.revision == head.revision
        assert failed.failed_in == head.failure.failed_in  # type: ignore[union-attr]
        assert "kernel.retry" in str(failed)
        await kernel.retry(run.run_id)  # the way out it names works
        async for _ in kernel.run(run.run_id, raise_on_failure=True):
            pass
        assert (await kernel.get(run.run_id)).output == "Hello."


async def test_the_default_drive_does_not_raise(tmp_path: Path) -> None:
    async with failing_kernel(tmp_path) as kernel:
        run_id = await failed_run(kernel)
        assert (await kernel.get(run_id)).state == "failed"


async def test_step_raises_on_failure_when_asked(tmp_path: Path) -> None:
    async with failing_kernel(tmp_path) as kernel:
        run = await kernel.start(model="scripted/x", messages=["Hi."])
        with pytest.raises(RunFailed, match="AuthenticationFailed"):
            await step_until_rest(kernel, run.run_id)
        assert await kernel.step(run.run_id) == []  # at rest, without the flag: no error


async def test_raise_on_failure_must_be_a_bool(tmp_path: Path) -> None:
    async with failing_kernel(tmp_path) as kernel:
        run = await kernel.start(model="scripted/x", messages=["Hi."])
        events = kernel.run(run.run_id, raise_on_failure=1)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="raise_on_failure"):
            await anext(events)


@pytest.mark.parametrize("command", ["send", "resume", "resolve", "run with input"])
async def test_a_command_refused_on_a_failed_run_names_the_failure_and_retry(
    tmp_path: Path, command: str
) -> None:
    async with failing_kernel(tmp_path) as kernel:
        run_id = await failed_run(kernel)
        with pytest.raises(InvalidTransition) as caught:
            await command_on(kernel, run_id, command)
        said = str(caught.value)
        assert "'failed'" in said
        assert f"AuthenticationFailed: {NO_KEY}" in said
        assert "kernel.retry(run_id)" in said
        assert caught.value.state == "failed"


async def test_a_long_failure_message_is_shortened(tmp_path: Path) -> None:
    model = ScriptedProvider([Fail(AuthenticationFailed("x" * 5000))])
    async with sk.Kernel(f"sqlite:///{tmp_path}/runs.db", providers={"scripted": model}) as kernel:
        run_id = await failed_run(kernel)
        with pytest.raises(InvalidTransition) as caught:
            await kernel.send(run_id, "Again?")
    assert len(str(caught.value)) < 500
    assert "…" in str(caught.value)


async def test_a_command_refused_on_a_completed_run_names_send(tmp_path: Path) -> None:
    model = ScriptedProvider(["Hello."])
    async with sk.Kernel(f"sqlite:///{tmp_path}/runs.db", providers={"scripted": model}) as kernel:
        run = await kernel.start(model="scripted/x", messages=["Hi."])
        async for _ in kernel.run(run.run_id):
            pass
        for refused in (
            kernel.retry(run.run_id),
            kernel.resume(run.run_id, value=True),
            kernel.resolve_tool_call(run.run_id, "call_1", rerun=True),
        ):
            with pytest.raises(InvalidTransition, match=r"kernel\.send\(run_id, message\)"):
                await refused
        assert (await kernel.send(run.run_id, "More?")).state == "preparing_turn"
