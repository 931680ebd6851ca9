"""Following a run from another process: its committed events and its live events
(text deltas) as the process that drives it publishes them, on the stores with a feed
(Redis, PostgreSQL); a reader that stalls drops live events, never commits, and never
holds the drive up; in the driving process a reader sees each live event once."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from asyncio.subprocess import DEVNULL, PIPE, Process
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import pytest

import statekernel as sk
from statekernel import Event
from statekernel.blocking import SyncKernel
from statekernel.stores import follow, open_store, watch
from statekernel.testing import Reply, ScriptedProvider

from .live_driver import ANSWER

DRIVER = Path(__file__).resolve().parent / "live_driver.py"


@asynccontextmanager
async def driven_elsewhere(
    url: str, run_id: str, folder: Path, chunk: int = 4, mode: str = "run"
) -> AsyncIterator[tuple[Process, Path]]:
    """A process driving ``run_id`` on ``url`` (with ``Kernel.run``, or ``Kernel.step``
    calls when ``mode`` is ``step``), holding in its first turn until the test writes a
    line on the pipe it is given with the process."""
    pipe = folder / f"{run_id}.pipe"
    os.mkfifo(pipe)
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    driver = await asyncio.create_subprocess_exec(
        *(sys.executable, "-P", str(DRIVER), url, run_id, str(pipe), str(chunk), mode),
        env=env,
        stdout=PIPE,
    )
    try:
        assert driver.stdout is not None
        line = await asyncio.wait_for(driver.stdout.readline(), 120)
        assert line == b"HOLDING\n", line
        yield driver, pipe
    finally:
        if driver.returncode is None:
            driver.kill()
        await driver.wait()


async def go_on(pipe: Path) -> None:
    """Let the held run go on (the driver reads the pipe)."""
    await asyncio.to_thread(pipe.write_text, "go\n")


async def done(driver: Process) -> list[str]:
    """What the driver says at its end: ``DONE``, the state, the live events it drove."""
    assert driver.stdout is not None
    line = await asyncio.wait_for(driver.stdout.readline(), 120)
    words = line.decode().split()
    assert words[:2] == ["DONE", "completed"], line
    return words


def texts(events: list[Event]) -> str:
    return "".join(str(e.data["text"]) for e in events if e.type == "text_delta")


async def test_a_reader_in_another_process_sees_the_deltas_before_the_commit(
    feed_store_url: str, tmp_path: Path
) -> None:
    async with (
        driven_elsewhere(feed_store_url, "streamed", tmp_path) as (driver, pipe),
        aclosing(open_store(feed_store_url)) as store,
        follow(store, "streamed") as events,
    ):
        await go_on(pipe)
        seen = [event async for event in events]
        await done(driver)
        stored = await store.events("streamed")
        run = await store.load("streamed")
    deltas = [e for e in seen if e.type == "text_delta"]
    assert len(deltas) > 100  # the answer came in many small deltas
    assert texts(seen) == ANSWER == run.output
    completed = [i for i, e in enumerate(seen) if e.type == "run_completed"]
    assert completed == [len(seen) - 1]
    last_delta = max(i for i, e in enumerate(seen) if e.type == "text_delta")
    assert last_delta < completed[0]
    assert all(not e.persisted and e.seq == -1 for e in deltas)
    assert [e for e in seen if e.persisted] == list(stored)
    assert all(e.persisted for e in stored)  # no live event was stored
    assert events.dropped == 0


async def test_a_reader_in_another_process_sees_the_deltas_of_steps(
    feed_store_url: str, tmp_path: Path
) -> None:
    async with (
        driven_elsewhere(feed_store_url, "stepped", tmp_path, mode="step") as (driver, pipe),
        aclosing(open_store(feed_store_url)) as store,
        follow(store, "stepped") as events,
    ):
        await go_on(pipe)
        seen = [event async for event in events]
        words = await done(driver)
        stored = await store.events("stepped")
    deltas = [e for e in seen if e.type == "text_delta"]
    assert len(deltas) > 100
    assert int(words[2]) >= len(deltas)  # published by the steps
    assert texts(seen) == ANSWER
    last_delta = max(i for i, e in enumerate(seen) if e.type == "text_delta")
    answered = max(i for i, e in enumerate(seen) if e.type == "model_completed")
    assert last_delta < answered  # the deltas came before the commit of the answer
    assert [e for e in seen if e.persisted] == list(stored)
    assert events.dropped == 0


async def test_a_stalled_reader_drops_deltas_not_commits_and_never_holds_the_drive(
    feed_store_url: str, tmp_path: Path
) -> None:
    async with (
        driven_elsewhere(feed_store_url, "stalled", tmp_path) as (driver, pipe),
        aclosing(open_store(feed_store_url)) as store,
        follow(store, "stalled", capacity=5) as events,
        watch(store, "stalled") as notices,
    ):
        await go_on(pipe)
        async for notice in notices:  # the reader reads nothing meanwhile
            if notice.state == "completed":
                break
        words = await done(driver)  # the drive ended while the reader was stalled
        seen = [event async for event in events]
        stored = await store.events("stalled")
    assert int(words[2]) > 100  # the driver published every delta
    deltas = [e for e in seen if e.type == "text_delta"]
    assert len(deltas) <= 5  # what did not fit was dropped ...
    assert events.dropped > 0  # ... and counted
    assert [e for e in seen if e.persisted] == list(stored)  # every commit all the same
    assert seen[-1].type == "run_completed"


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def any_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    return str(request.getfixturevalue(f"{request.param}_store_url"))


async def test_a_reader_in_the_driving_process_sees_each_delta_once(any_store_url: str) -> None:
    answer = "one two three four five six seven eight nine ten"
    provider = ScriptedProvider([Reply(text=answer, chunk=2)])
    async with sk.Kernel(any_store_url, providers={"scripted": provider}) as kernel:
        await kernel.start(model="scripted/x", messages=["go"], run_id="here")
        async with follow(kernel.store, "here") as events:
            driven = [e async for e in kernel.run("here")]
            seen = [e async for e in events]
    assert texts(driven) == answer
    assert texts(seen) == answer  # from the drive itself, not again from the feed
    assert seen[-1].type == "run_completed"


async def test_a_reader_of_another_store_object_in_the_process_sees_each_delta_once(
    feed_store_url: str,
) -> None:
    answer = "alpha beta gamma delta epsilon zeta eta theta"
    provider = ScriptedProvider([Reply(text=answer, chunk=3)])
    async with (
        sk.Kernel(feed_store_url, providers={"scripted": provider}) as kernel,
        aclosing(open_store(feed_store_url)) as other,
    ):
        await kernel.start(model="scripted/x", messages=["go"], run_id="there")
        async with follow(other, "there") as events:
            async for _ in kernel.run("there"):
                pass
            seen = [e async for e in events]
    assert texts(seen) == answer  # from the feed (the same process, another store)


async def test_follow_checks_its_arguments() -> None:
    async with aclosing(open_store("memory://")) as store:
        with pytest.raises(sk.errors.InvalidArgument, match="after_revision"):
            follow(store, "r", after_revision="1")  # type: ignore[arg-type]
        with pytest.raises(sk.errors.InvalidArgument, match="capacity"):
            async with follow(store, "r", capacity=0):
                pass


async def test_a_run_a_worker_process_drives_streams_its_deltas(
    feed_store_url: str, tmp_path: Path
) -> None:
    exe = shutil.which("statekernel")
    assert exe is not None
    pipe = tmp_path / "go"
    os.mkfifo(pipe)
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DRIVER.parent), env.get("PYTHONPATH")]))
    env["SK_LIVE_PIPE"] = str(pipe)
    async with sk.Kernel(feed_store_url, providers={"scripted": ScriptedProvider([])}) as kernel:
        await kernel.start(model="scripted/w", messages=["go"], run_id="worked")
        async with follow(kernel.store, "worked") as events:
            await kernel.submit("worked", queue="live")
            args = ["worker", "--store", feed_store_url, "--queue", "live"]
            worker = await asyncio.create_subprocess_exec(
                exe, *args, "--agent", "live_agent:make", env=env, stdout=DEVNULL
            )
            try:
                seen: list[Event] = []
                async for event in events:
                    seen.append(event)
                    if event.type == "tool_call_started":  # the worker holds in the tool
                        await go_on(pipe)
            finally:
                worker.send_signal(signal.SIGTERM)
                await asyncio.wait_for(worker.wait(), 120)
    assert texts(seen) == ANSWER
    assert seen[-1].type == "run_completed"


async def test_kernel_watch_and_its_sync_twin_see_the_deltas_of_a_run_driven_elsewhere(
    feed_store_url: str, tmp_path: Path
) -> None:
    """``Kernel.watch`` (and ``SyncKernel.watch`` from a thread) give what ``follow``
    gives; they subscribe when first iterated, so each reads one event before the
    driver goes on."""
    providers = {"scripted": ScriptedProvider([])}
    async with (
        driven_elsewhere(feed_store_url, "watched", tmp_path) as (driver, pipe),
        sk.Kernel(feed_store_url, providers=providers) as kernel,
    ):
        events = kernel.watch("watched")
        seen = [await anext(events)]
        await go_on(pipe)
        seen += [event async for event in events]
        await done(driver)
        stored = await kernel.events("watched")
    assert texts(seen) == ANSWER
    assert len([e for e in seen if e.type == "text_delta"]) > 100
    assert [e for e in seen if e.persisted] == list(stored)

    async with driven_elsewhere(feed_store_url, "watched-sync", tmp_path) as (driver, pipe):
        with SyncKernel(lambda: sk.Kernel(feed_store_url, providers=providers)) as blocking:
            watched = blocking.watch("watched-sync")
            first = await asyncio.to_thread(next, watched)
            await go_on(pipe)
            rest = await asyncio.to_thread(list, watched)
            await done(driver)
            stored = blocking.events("watched-sync")
    assert texts([first, *rest]) == ANSWER
    assert [e for e in [first, *rest] if e.persisted] == list(stored)
