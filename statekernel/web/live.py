"""Live pages: one watch of the store (its own feed, or polling) for the whole view,
fanned out to every page that streams (Server-Sent Events).

However many pages stream, the view holds one subscription to the store's commits;
each page reads what changed from the store after a notice (notices are wake-ups, and
may be missed: a page also looks every ``LOOK_EVERY`` seconds without one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from statekernel.errors import StatekernelError
from statekernel.stores import CheckpointStore, CommitNotice, watch

__all__ = ["LOOK_EVERY", "Hub", "next_notice", "sse"]

LOOK_EVERY = 5.0
"""Seconds a streaming page waits for a notice before it reads the store all the same."""


def sse(event: str, data: str, *, event_id: str | None = None) -> str:
    """One Server-Sent Event (``data`` may hold newlines: each line is sent as one).
    ``event_id`` is what a reconnecting browser sends back as ``Last-Event-ID``."""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    head = f"event: {event}\n" if event_id is None else f"event: {event}\nid: {event_id}\n"
    return f"{head}{lines}\n"


class Hub:
    """One watch of every run's commits, shared by the subscribers (started with the
    first, stopped after the last)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self._subscribers: set[asyncio.Queue[CommitNotice | None]] = set()
        self._task: asyncio.Task[None] | None = None
        self.watches = 0
        """How many watches of the store the hub has opened (one at a time)."""

    @property
    def subscribers(self) -> int:
        """Pages streaming now."""
        return len(self._subscribers)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[CommitNotice | None]]:
        """A queue of the notices of every commit from now on (None: the feed broke)."""
        queue: asyncio.Queue[CommitNotice | None] = asyncio.Queue(maxsize=1000)
        self._subscribers.add(queue)
        if self._task is None or self._task.done():
            ready = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._watching(ready))
            await ready.wait()
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)
            if not self._subscribers:
                await self._stop()

    async def _watching(self, ready: asyncio.Event) -> None:
        try:
            async with watch(self.store) as notices:
                self.watches += 1
                ready.set()
                async for notice in notices:
                    for queue in list(self._subscribers):
                        if queue.full():
                            queue.get_nowait()
                        queue.put_nowait(notice)
        except StatekernelError:  # the pages fall back to looking every LOOK_EVERY s
            for queue in list(self._subscribers):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)
        finally:
            ready.set()

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def aclose(self) -> None:
        """Stop watching."""
        self._subscribers.clear()
        await self._stop()


async def next_notice(
    queue: asyncio.Queue[CommitNotice | None], run_id: str | None, wait: float = LOOK_EVERY
) -> None:
    """Wait for a notice about ``run_id`` (any run: None), or ``wait`` seconds."""
    loop = asyncio.get_running_loop()
    until = loop.time() + wait
    while (left := until - loop.time()) > 0:
        try:
            async with asyncio.timeout(left):
                notice = await queue.get()
        except TimeoutError:
            return
        if notice is None or run_id is None or notice.run_id == run_id:
            return
