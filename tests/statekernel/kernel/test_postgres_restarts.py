"""The PostgreSQL server crashes again and again under a kernel that drives and reads:
every error that reaches a caller is a ``StatekernelError`` (the driver's own, raised
by connections the crash left in doubt, are ``StoreError`` naming the store), and once
the server is back the same kernel and store work on.

The server is the test's own (``owned_server``): its postmaster is SIGKILLed while
drives are mid-run, then started again on the same data. Its sessions end on their
own then, each telling its client ``FATAL: terminating connection due to unexpected
postmaster exit`` first: a connection idle in the pool that read that message before
its end of stream is one asyncpg still holds "in progress", the case that leaked
``InternalClientError`` to ``Kernel.run`` and ``Kernel.get``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import StatekernelError, StoreError
from statekernel.testing import ScriptedProvider, call

from .test_postgres_server_faults import OwnedServer, _alive, _children, owned_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

__all__ = ["owned_server"]  # the fixture, used here

KILLS = int(os.environ.get("STATEKERNEL_PG_KILLS", "20"))
"""How many times the server is killed (the leak came with about 2 kills in 20)."""

DRIVES = 4
"""Runs driven at once by the kernel, each started again after it came to rest or failed."""

TURNS = 4
"""Tool turns of each run before its final answer."""

WAIT = 120.0
"""Seconds a step of the test may take before it fails (a bound, never a pause)."""

REAPED_WITHIN = 10.0
"""Seconds a killed postmaster may stay a zombie before the test stops waiting for an
init to reap it."""


@sk.tool(idempotent=True)
async def look(key: str) -> str:
    """Idempotent: re-run after a crash, never left uncertain."""
    return f"seen {key}"


def _script() -> list[object]:
    turns: list[object] = [[call("look", {"key": f"k{i}"})] for i in range(TURNS)]
    return [*turns, "done"]


def kill_postmaster(server: OwnedServer) -> None:
    """SIGKILL the server's postmaster alone (its other processes see it die and end on
    their own) and return once none of them is left. A postmaster that no init reaps
    (a zombie) would look alive to the next start: its lock files go."""
    pid_file = server.data / "postmaster.pid"
    postmaster = int(pid_file.read_text().split()[0])
    pids = [postmaster, *_children(postmaster)]
    os.kill(postmaster, signal.SIGKILL)
    deadline = time.monotonic() + WAIT
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "the server's processes outlived their postmaster"
        time.sleep(0.02)
    reaped = time.monotonic() + REAPED_WITHIN
    while Path(f"/proc/{postmaster}").exists():
        if time.monotonic() > reaped:
            pid_file.unlink(missing_ok=True)
            (server.folder / f".s.PGSQL.{server.port}.lock").unlink(missing_ok=True)
            return
        time.sleep(0.02)


class Traffic:
    """Drives and reads on ``kernel`` in ``DRIVES`` loops until cancelled: start a run,
    drive it to rest, read it back. Counts what succeeded and what failed; keeps every
    error that is not a ``StatekernelError`` and every ``StoreError`` that does not name
    the store."""

    def __init__(self, kernel: sk.Kernel) -> None:
        self.kernel = kernel
        self.succeeded = 0
        self.failed = 0
        self.wrong: list[str] = []
        self.last: BaseException | None = None
        self.cancelled_into: list[str] = []
        """What calls of a cancelled loop raised instead of the cancellation (or that they
        returned)."""
        self._changed = asyncio.Event()

    async def loop(self) -> None:
        """One drive loop, until its task is cancelled (a call that raised instead of the
        cancellation ends it too: ``cancelled_into`` keeps what it raised)."""
        task = asyncio.current_task()
        assert task is not None
        while True:
            ended = "it returned"
            try:
                await self._once()
            except StoreError as exc:
                self._failure(exc, "Postgres store" in str(exc))
                ended = repr(exc)
            except StatekernelError as exc:
                self._failure(exc, True)
                ended = repr(exc)
            except Exception as exc:
                self._failure(exc, False)
                ended = repr(exc)
            if task.cancelling():
                self.cancelled_into.append(ended)
                return

    async def _once(self) -> None:
        run = await self.kernel.start(model="scripted/restarts", messages=["go"])
        self._success()
        async for event in self.kernel.run(run.run_id):
            if event.persisted:
                self._success()
        await self.kernel.get(run.run_id)
        self._success()

    def _success(self) -> None:
        self.succeeded += 1
        self._changed.set()

    def _failure(self, exc: BaseException, right: bool) -> None:
        self.failed += 1
        self.last = exc
        if not right:
            self.wrong.append("".join(traceback.format_exception(exc)))
        self._changed.set()

    async def reach(self, what: str, *, succeeded: int = 0, failed: int = 0) -> None:
        """Return once ``succeeded`` calls in all have succeeded and ``failed`` failed."""
        try:
            async with asyncio.timeout(WAIT):
                while self.succeeded < succeeded or self.failed < failed:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"{what}: not within {WAIT:.0f} s") from None


async def test_driver_errors_after_server_crashes_are_typed(owned_server: OwnedServer) -> None:
    rng = random.Random(int(os.environ.get("STATEKERNEL_KILL_SEED", "7")))
    unhandled: list[str] = []

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, Exception) and not isinstance(exc, StatekernelError):
            unhandled.append("".join(traceback.format_exception(exc)))

    asyncio.get_running_loop().set_exception_handler(handler)
    url = f"{owned_server.url}?schema=restarts"
    provider = ScriptedProvider(_script())
    async with sk.Kernel(url, tools=[look], providers={"scripted": provider}) as kernel:
        traffic = Traffic(kernel)
        loops = [asyncio.create_task(traffic.loop()) for _ in range(DRIVES)]
        try:
            for kill in range(KILLS):
                mid_run = traffic.succeeded + rng.randint(1, 3 * TURNS)
                await traffic.reach(f"progress before kill {kill}", succeeded=mid_run)
                failed = traffic.failed
                await asyncio.to_thread(kill_postmaster, owned_server)
                await traffic.reach(f"kill {kill} seen by a caller", failed=failed + 1)
                await asyncio.to_thread(owned_server.start)
            back = traffic.succeeded + DRIVES * (TURNS + 2)
            await traffic.reach("work after the last restart", succeeded=back)
        finally:
            for task in loops:
                task.cancel()
            for task in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        assert traffic.wrong == [], traffic.wrong[0]
        assert traffic.cancelled_into == []  # every cancelled loop ended with its cancellation
        run = await kernel.start(model="scripted/restarts", messages=["go"])
        async for _ in kernel.run(run.run_id):
            pass
        assert (await kernel.get(run.run_id)).state == "completed"
    assert unhandled == [], unhandled[0]
