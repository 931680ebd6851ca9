"""Publishing a drive's live events: to the readers of this process at once, and to the
store's feed (``_storage.live``) from a task of its own, so that the drive never waits
for it.

The drive hands each live event to ``Publisher.publish``, which never blocks: the
readers of this process keep it in their bounded feeds, and the feed's sender takes it
from a bounded buffer (``BUFFERED``). When the buffer is full, or the store fails to
send, live events are dropped and counted (``Publisher.dropped``), never a commit:
commits reach readers as commit notices, and their events are read from the store.

Before a commit the drive gives the sender up to ``FLUSH_WITHIN`` seconds to send the
live events it still holds (``settled``; usually none: they are sent as they come), so
that readers get them before the commit's notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from statekernel._records.events import Event
from statekernel._secrets import logger
from statekernel._storage.live import Transport, encode, local_feeds, source_of, transport_of

__all__ = ["BUFFERED", "FLUSH_WITHIN", "Publisher", "publishing", "settled"]

log = logger("statekernel.stores")

BUFFERED = 1_000
"""Live events waiting to be sent to the store's feed; more are dropped."""
BATCH = 200
"""Live events sent in one payload at most."""
FLUSH_WITHIN = 1.0
"""Seconds a commit, and the end of a drive, give the sender to send what it holds."""

_publishers: weakref.WeakKeyDictionary[Any, dict[str, Publisher]] = weakref.WeakKeyDictionary()


class Publisher:
    """Publishes the live events of one drive of ``run_id`` through ``store``."""

    def __init__(self, store: object, run_id: str, transport: Transport | None) -> None:
        self.store, self.run_id, self.transport = store, run_id, transport
        self.dropped = 0
        """Live events not sent to the store's feed (buffer full, or the store failed)."""
        self._buffer: deque[Event] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._sender: asyncio.Task[None] | None = None
        self._source = source_of(store)
        self._number = 0
        self._sending = 0  # live events of the batch being sent
        self._idle = asyncio.Event()
        self._idle.set()

    def publish(self, event: Event) -> None:
        """Give the live ``event`` to this process's readers, and queue it for the
        store's feed (dropped when the buffer is full). Never blocks."""
        for feed in list(local_feeds(self.store, self.run_id)):
            feed.put(event)
        if self.transport is None or self._closing:
            return
        if len(self._buffer) >= BUFFERED:
            self.dropped += 1
            return
        self._buffer.append(event)
        self._idle.clear()
        self._wake.set()
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        transport = self.transport
        assert transport is not None
        while True:
            if not self._buffer:
                self._idle.set()
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [self._buffer.popleft() for _ in range(min(BATCH, len(self._buffer)))]
            self._number += 1
            payloads = encode(self._source, self._number, self.run_id, batch, transport.limit)
            self._sending = len(batch)
            try:
                await transport.send(self.run_id, payloads)
            except Exception as exc:  # the store failed: these live events are gone
                self.dropped += len(batch)
                log.debug("publishing live events of run %r: %s", self.run_id, exc)
            self._sending = 0

    async def settled(self) -> None:
        """Return once what the buffer held is sent, or after ``FLUSH_WITHIN`` seconds."""
        if not self._idle.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_WITHIN):
                    await self._idle.wait()

    async def close(self) -> None:
        """Send what the buffer holds (for ``FLUSH_WITHIN`` seconds at most), then stop."""
        self._closing = True
        self._wake.set()
        sender, self._sender = self._sender, None
        if sender is None:
            return
        try:
            await asyncio.wait({sender}, timeout=FLUSH_WITHIN)
        finally:
            if not sender.done():
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
                self.dropped += self._sending + len(self._buffer)
                self._buffer.clear()
            if self.dropped:
                log.info(
                    "%d live events of run %r were not published (buffer full or store failed)",
                    self.dropped,
                    self.run_id,
                )


@contextlib.asynccontextmanager
async def publishing(store: object, run_id: str) -> AsyncIterator[Publisher]:
    """A publisher of ``run_id``'s live events for the length of the block."""
    publisher = Publisher(store, run_id, transport_of(store))
    try:
        running = _publishers.setdefault(store, {})
    except TypeError:  # takes no weak reference: nothing to settle before its commits
        running = {}
    running[run_id] = publisher
    try:
        yield publisher
    finally:
        if running.get(run_id) is publisher:
            del running[run_id]
        await publisher.close()


async def settled(store: object, run_id: str) -> None:
    """Before a commit of ``run_id`` through ``store``: wait (``FLUSH_WITHIN`` seconds at
    most) for the live events its drive published to be sent."""
    try:
        publisher = _publishers.get(store, {}).get(run_id)
    except TypeError:
        return
    if publisher is not None:
        await publisher.settled()
