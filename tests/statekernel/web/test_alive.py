"""What is alive: the runs list and a run's page say who drives a run that is not at
rest, or that its owner is gone (a SIGKILLed process, an expired or released lease),
with a line of the run's timeline where the owner was lost; read without writing, and
nothing where the store cannot tell."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import sys
from asyncio.subprocess import PIPE, Process
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from starlette.testclient import TestClient

import statekernel as sk
from statekernel.stores import Checkpoint, CheckpointStore, MemoryStore, SQLiteStore, open_store
from statekernel.stores._alive import owner_of
from statekernel.testing import ManualClock, ScriptedProvider, call
from statekernel.testing._store_cases import sample_run
from statekernel.web import create_app

from .clients import local_client

DRIVER = Path(__file__).resolve().parents[1] / "cli" / "follow_driver.py"
WAIT = 60.0
"""Seconds a step may take before the test fails (a bound, never a pause)."""


@contextlib.asynccontextmanager
async def viewing(url: str) -> AsyncIterator[TestClient]:
    """A read-only view (no agent) of the store at ``url``, entered off the test's
    loop: the kernels the test runs go on while the view answers."""
    client = local_client(create_app(url))
    await asyncio.to_thread(client.__enter__)
    try:
        yield client
    finally:
        await asyncio.to_thread(client.__exit__, None, None, None)


async def page(client: TestClient, path: str) -> str:
    """The text of the page at ``path`` (status 200)."""
    answer = await asyncio.to_thread(client.get, path)
    assert answer.status_code == 200, answer.text
    return answer.text


async def _until(proc: Process, word: str) -> None:
    """Read ``proc``'s stdout until a line starts with ``word``."""
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        if line.decode().startswith(word):
            return
    assert proc.stderr is not None
    raise AssertionError(f"the driver ended before {word}: {(await proc.stderr.read()).decode()}")


async def test_a_sigkilled_owner_is_shown_gone_in_the_list_and_on_its_page(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    pipe = tmp_path / "go"
    os.mkfifo(pipe)  # never written: the driver's tool waits until it is killed
    args = [str(DRIVER), url, "held", str(pipe)]
    driver = await asyncio.create_subprocess_exec(sys.executable, *args, stdout=PIPE, stderr=PIPE)
    owner = f"{socket.gethostname()}/{driver.pid}/"
    try:
        await asyncio.wait_for(_until(driver, "HOLDING"), WAIT)
        async with viewing(url) as view:
            listed = await page(view, "/")
            assert f"driven by {owner}" in listed
            assert "owner gone" not in listed
            shown = await page(view, "/runs/held")
            assert f"driven by {owner}" in shown
            assert 'id="owner-lost"' not in shown
            driver.send_signal(signal.SIGKILL)
            assert await asyncio.wait_for(driver.wait(), WAIT) == -signal.SIGKILL
            listed = await page(view, "/")
            assert f"owner gone: {owner}" in listed
            assert "(its process is gone)" in listed
            assert "driven by" not in listed
            shown = await page(view, "/runs/held")
            assert f"owner gone: {owner}" in shown
            revision = (await _head("held", url)).revision
            assert f"lost after revision {revision} (its process is gone)" in shown
            assert 'id="owner-lost"' in shown
            old = await page(view, f"/runs/held?revision={revision - 1}")
            assert 'id="owner-lost"' not in old  # the timeline of a revision before it
    finally:
        if driver.returncode is None:
            driver.kill()
            await driver.wait()


async def _head(run_id: str, url: str) -> sk.Run:
    store = SQLiteStore(url, read_only=True)
    try:
        return await store.load(run_id)
    finally:
        await store.aclose()


async def test_a_run_this_process_drives_is_shown_driven(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    started, release = asyncio.Event(), asyncio.Event()

    @sk.tool
    async def hold() -> str:
        """Wait for the test."""
        started.set()
        await release.wait()
        return "released"

    provider = ScriptedProvider([call("hold", {}), "all done"])
    async with sk.Kernel(url, tools=[hold], providers={"scripted": provider}) as kernel:
        await kernel.start(model="scripted/m", messages=["go"], run_id="live")
        driving = asyncio.create_task(_drive(kernel, "live"))
        await asyncio.wait_for(started.wait(), WAIT)
        async with viewing(url) as view:
            assert f"driven by {kernel.owner}" in await page(view, "/")
            shown = await page(view, "/runs/live")
            assert f"driven by {kernel.owner}" in shown
            assert "owner gone" not in shown
            release.set()
            assert await asyncio.wait_for(driving, WAIT) == "completed"
            listed = await page(view, "/")
            assert "driven by" not in listed  # at rest: nobody is asked about it
            assert "<th>owner</th>" not in listed
            assert "owner gone" not in await page(view, "/runs/live")


async def _drive(kernel: sk.Kernel, run_id: str) -> str:
    async for _ in kernel.run(run_id):
        pass
    return (await kernel.get(run_id)).state


HOLDERS = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
]


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "memory":
        return f"memory://alive-{id(request)}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    if kind == "file":
        return f"file://{tmp_path}/runs"
    return str(request.getfixturevalue(f"{kind}_store_url"))


async def _stored(store: CheckpointStore) -> None:
    """``adrift`` (calling the model, at revision 0) and ``done`` (completed)."""
    await store.commit(Checkpoint.between(None, sample_run("adrift")))
    done = attrs.evolve(sample_run("done"), state="completed", current_turn=None)
    await store.commit(Checkpoint.between(None, done))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_an_expired_lease_is_shown_gone(kind: str, tmp_path: Path) -> None:
    clock = ManualClock()
    store: MemoryStore | SQLiteStore
    if kind == "memory":
        store = MemoryStore(clock=clock)
    else:
        store = SQLiteStore(f"sqlite:///{tmp_path / 'runs.db'}", clock=clock)
    with local_client(create_app(store)) as view:
        assert view.portal is not None
        on_view = view.portal.call  # the store is used on the view's loop alone
        try:
            on_view(_stored, store)
            on_view(functools.partial(store.acquire, "adrift", "owner-x", ttl=5.0))
            assert "driven by owner-x" in view.get("/").text
            clock.advance(65.0)
            listed = view.get("/").text
            assert "owner gone: owner-x (lease expired 60 s ago)" in listed
            assert listed.count("owner gone") == 1  # the completed run is not asked about
            shown = view.get("/runs/adrift").text
            assert "owner gone: owner-x (lease expired 60 s ago)" in shown
            assert "owner owner-x lost after revision 0 (lease expired 60 s ago)" in shown
            assert "owner gone" not in view.get("/runs/done").text
        finally:
            on_view(store.aclose)


@pytest.mark.parametrize("kind", HOLDERS)
async def test_a_held_then_released_lease(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, tmp_path, request)
    store = open_store(url)
    try:
        await _stored(store)
        lease = await store.acquire("adrift", "owner-y", ttl=600.0)
        async with viewing(url) as view:
            listed = await page(view, "/")
            assert "driven by owner-y" in listed
            assert listed.count("driven by") == 1  # the completed run is not asked about
            shown = await page(view, "/runs/adrift")
            assert "driven by owner-y" in shown
            assert "owner gone" not in shown

            await store.release(lease)
            gone = "owner gone (its last owner let go of its lease)"
            assert gone in await page(view, "/")
            shown = await page(view, "/runs/adrift")
            assert gone in shown
            assert "its owner lost after revision 0 (its last owner let go of its lease)" in shown
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", ["file", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_store_that_cannot_tell_shows_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, tmp_path, request)
    store = open_store(url)
    try:
        await _stored(store)
        await store.acquire("adrift", "owner-x", ttl=600.0)
        assert await owner_of(store, "adrift", "calling_model", 0) is None
        async with viewing(url) as view:
            listed = await page(view, "/")
            assert "<th>owner</th>" not in listed
            assert "owner-x" not in listed
            assert "owner-x" not in await page(view, "/runs/adrift")
    finally:
        await store.aclose()
