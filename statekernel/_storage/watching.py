"""Watching commits: an async iterator of notices, one per commit seen, for one run or all.

A store may declare a feed of its own (``Watches``): PostgreSQL sends a notice from a
trigger on its runs table (``LISTEN/NOTIFY``), Redis publishes one from its commit
script. Elsewhere ``watch`` polls the listing for runs updated since it last looked.

A notice says that a run reached a revision; it is a wake-up, not the record. Notices
can come coalesced (revision 9 after 7: two commits seen as one) and, on a feed, can be
missed while the connection to the server is lost; a reader that must see every commit
reads the store (``events(run_id, after_revision=...)``) after each notice, and at least
every few seconds without one. A watch reports the commits made once it is entered
(``async with``: the subscription is in place when the block starts).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

import attrs

from statekernel._records.run import StateId
from statekernel._secrets import logger
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import StatekernelError

__all__ = ["CommitNotice", "Feed", "Watches", "fed_by", "poll_watch", "watch"]

log = logger("statekernel.stores")

POLL_SECONDS = 0.5
"""How often ``watch`` looks at a store without a feed of its own."""
OVERLAP = timedelta(seconds=5)
"""How far back each poll looks before the newest update it saw (commits of other
processes whose clocks run a little behind are not missed; revisions seen are not
reported twice)."""


@attrs.frozen
class CommitNotice:
    """A run reached ``revision`` (in ``state``) by a commit."""

    run_id: str
    revision: int
    state: StateId | str


class Feed:
    """The notices a subscription receives, iterated by its reader (at most ``MAX_QUEUED``
    kept: when the reader falls behind, the oldest go, as notices may)."""

    def __init__(self, run_id: str | None) -> None:
        self.run_id = run_id
        self._notices: asyncio.Queue[CommitNotice] = asyncio.Queue()

    def put(self, notice: CommitNotice) -> None:
        """Queue ``notice`` for the reader when it is about the run watched."""
        if self.run_id is not None and notice.run_id != self.run_id:
            return
        if self._notices.qsize() >= MAX_QUEUED:
            self._notices.get_nowait()
        self._notices.put_nowait(notice)

    def __aiter__(self) -> Feed:
        return self

    async def __anext__(self) -> CommitNotice:
        return await self._notices.get()


MAX_QUEUED = 10_000
"""Notices a feed keeps for a reader that falls behind."""


@runtime_checkable
class Watches(Protocol):
    """What a store may offer beyond ``CheckpointStore``: a feed of commit notices from
    the server (``watch`` uses it instead of polling)."""

    def watch(self, run_id: str | None = None) -> AbstractAsyncContextManager[Feed]:
        """Subscribe (on entering) to the notices of the commits of ``run_id``, or of
        every run; iterate what it gives.

        Returns:
            A context manager whose entering subscribes and gives the feed of notices.
        """
        ...


def watch(
    store: CheckpointStore, run_id: str | None = None, *, poll: float = POLL_SECONDS
) -> AbstractAsyncContextManager[Feed]:
    """Notices of the commits of ``run_id`` (or of every run) made once the context is
    entered, from the store's own feed where it declares one (``Watches``), else by
    polling its listing every ``poll`` seconds::

        async with watch(store, run_id) as notices:
            async for notice in notices:
                ...

    Returns:
        A context manager: entering it starts watching and gives the feed, an async
            iterator of ``CommitNotice``; leaving it stops. While polling, a store that
            fails for a while is logged and looked at again at the next poll.

    Raises:
        StoreError: on entering, the store failed (the first look of a polling watch,
            or the subscription of a store's own feed).
    """
    if isinstance(store, Watches):
        return store.watch(run_id)
    return poll_watch(store, run_id, poll=poll)


@contextlib.asynccontextmanager
async def poll_watch(
    store: CheckpointStore, run_id: str | None = None, *, poll: float = POLL_SECONDS
) -> AsyncIterator[Feed]:
    """Notices found by listing the runs updated since the last look, every ``poll``
    seconds (any store)."""
    feed = Feed(run_id)
    seen: dict[str, tuple[int, datetime]] = {}  # run id: revision and update seen
    since = await _look(store, feed, seen, datetime.now(UTC) - OVERLAP, report=False)

    async def polling() -> None:
        nonlocal since
        while True:
            await asyncio.sleep(poll)
            try:
                since = await _look(store, feed, seen, since, report=True)
            except StatekernelError as exc:  # the store is unreachable for a while
                log.warning("watching %r: %s", store, exc)

    async with fed_by(feed, polling()):
        yield feed


@contextlib.asynccontextmanager
async def fed_by(feed: Feed, work: Coroutine[Any, Any, None]) -> AsyncIterator[Feed]:
    """``feed`` while ``work`` (which puts notices on it) runs in a task of its own,
    cancelled and awaited when the block ends."""
    task = asyncio.create_task(work)
    try:
        yield feed
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _look(
    store: CheckpointStore,
    feed: Feed,
    seen: dict[str, tuple[int, datetime]],
    since: datetime,
    *,
    report: bool,
) -> datetime:
    """List the runs updated after ``since``, report those with a new revision; the
    ``since`` of the next look."""
    newest = since
    cursor: str | None = None
    while True:
        page = await store.list_runs(updated_after=since, limit=500, cursor=cursor)
        for summary in page.runs:
            newest = max(newest, summary.updated_at)
            before = seen.get(summary.run_id)
            seen[summary.run_id] = (summary.revision, summary.updated_at)
            if report and (before is None or summary.revision > before[0]):
                feed.put(CommitNotice(summary.run_id, summary.revision, summary.state))
        cursor = page.next_cursor
        if cursor is None:
            break
    since = newest - OVERLAP
    for gone in [k for k, (_, at) in seen.items() if at <= since]:
        del seen[gone]  # not listed again until updated, and then its revision is new
    return since
