"""Following a run from any process: its committed events, read from the store after
each commit notice, and its live events (``text_delta`` ...) as the process that drives
it publishes them (``_storage.live``, ``_storage.publishing``).

Live events cross processes on the stores with a feed (Redis, PostgreSQL); on the
others (SQLite, file, memory) a reader gets them only from a drive of its own process
through the same store object. A reader that falls behind drops live events (at most
``capacity`` kept), never committed ones: those are read from the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import TracebackType

from statekernel._records.events import Event
from statekernel._storage.live import (
    READER_CAPACITY,
    LiveFeed,
    forget_local,
    local_feeds,
    source_of,
    transport_of,
)
from statekernel._storage.protocol import CheckpointStore
from statekernel._storage.watching import Feed, fed_by, watch
from statekernel.errors import InvalidArgument

__all__ = ["LOOK_EVERY", "Following", "follow", "live_feed"]

LOOK_EVERY = 5.0
"""Seconds a follower waits for a notice or a live event before it reads the store
all the same (notices may be missed)."""


@contextlib.asynccontextmanager
async def live_feed(
    store: CheckpointStore,
    run_id: str,
    *,
    capacity: int = READER_CAPACITY,
    notices: bool = True,
) -> AsyncIterator[LiveFeed]:
    """A feed of ``run_id``'s live events from now on (the drives of this process
    through ``store``, and of other processes through the store's feed where it has
    one), and with ``notices`` of its commit notices (``LiveFeed.notify``; without,
    the caller calls ``notify`` itself), for the length of the block.

    Raises:
        StoreError: the store failed to subscribe.
    """
    if type(capacity) is not int or capacity < 1:
        raise InvalidArgument(f"capacity must be a whole number >= 1, not {capacity!r}")
    feed = LiveFeed(run_id, ignore=source_of(store), capacity=capacity)
    local_feeds(store, run_id).add(feed)
    try:
        async with contextlib.AsyncExitStack() as stack:
            transport = transport_of(store)
            if transport is not None:
                await stack.enter_async_context(transport.subscribe(run_id, feed.put_payload))
            if notices:
                commits = await stack.enter_async_context(watch(store, run_id))
                await stack.enter_async_context(fed_by(commits, _pump(commits, feed)))
            yield feed
    finally:
        forget_local(store, run_id, feed)


async def _pump(notices: Feed, feed: LiveFeed) -> None:
    async for _notice in notices:
        feed.notify()


class Following:
    """``follow``'s context: iterate it for the run's events."""

    def __init__(
        self, store: CheckpointStore, run_id: str, after: int, until_rest: bool, capacity: int
    ) -> None:
        self.store, self.run_id, self.after = store, run_id, after
        self.until_rest, self.capacity = until_rest, capacity
        self._stack = contextlib.AsyncExitStack()
        self._feed: LiveFeed | None = None

    @property
    def dropped(self) -> int:
        """Live events dropped for this reader (it fell behind, or a payload was damaged)."""
        return 0 if self._feed is None else self._feed.dropped

    async def __aenter__(self) -> Following:
        self._feed = await self._stack.enter_async_context(
            live_feed(self.store, self.run_id, capacity=self.capacity)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        feed = self._feed
        if feed is None:
            raise RuntimeError("follow(...) is iterated inside `async with`")
        while True:
            run = await self.store.load(self.run_id)  # first: the events reach its revision
            committed = await self.store.events(self.run_id, after_revision=self.after)
            while (live := feed.take()) is not None:  # sent before those commits
                yield live
            for event in committed:
                self.after = max(self.after, event.revision)
                yield event
            if self.until_rest and run.is_terminal and run.revision <= self.after:
                return
            while (live := await feed.next(LOOK_EVERY)) is not None:
                yield live


def follow(
    store: CheckpointStore,
    run_id: str,
    *,
    after_revision: int = -1,
    until_rest: bool = True,
    capacity: int = READER_CAPACITY,
) -> Following:
    """The events of ``run_id``, from any process: the committed ones after
    ``after_revision``, each after its commit, and the live ones (``text_delta`` ...)
    as the process that drives the run publishes them::

        async with follow(store, run_id) as events:
            async for event in events:
                ...

    Live events come from another process on the stores with a feed (Redis,
    PostgreSQL); elsewhere only from drives of this process through the same store
    object. At most ``capacity`` live events wait for a reader that falls behind; what
    does not fit is dropped (``Following.dropped``), committed events never are. With
    ``until_rest`` the iteration ends once the run is paused, failed or completed and
    every committed event was given.

    Returns:
        A context manager: entering it subscribes (live events sent from then on are
            given) and gives what to iterate.

    Raises:
        StoreError: on entering, the store failed to subscribe; while iterating, to
            read the run.
        RunNotFound: while iterating, no run has this id.
    """
    if type(after_revision) is not int:
        raise InvalidArgument(f"after_revision must be a whole number, not {after_revision!r}")
    return Following(store, run_id, after_revision, until_rest, capacity)
