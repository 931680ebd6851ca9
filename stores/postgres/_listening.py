"""A Postgres store's watches: one connection of its pool that listens for commit notices
and puts them on the feeds of the store's watches.

While it listens, it holds the ``WATCHING`` advisory lock shared, so the commits' notice
trigger (layout 5, ``_schema.NOTIFY_WHEN_WATCHED``) notifies; when it starts, it waits
for the commits that found no watcher to end. When the server ends its session, another
connection takes over (notices of the gap are missed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from statekernel._secrets import logger
from statekernel._storage.watching import CommitNotice, Feed
from statekernel.errors import StatekernelError
from statekernel.stores.postgres._connections import DRIVER_ERRORS, discard, lost
from statekernel.stores.postgres._keys import lock_key
from statekernel.stores.postgres._schema import COMMITTING, WATCHING


class Host(Protocol):
    """What the listening connection uses of its store (``PostgresStore``)."""

    @property
    def schema(self) -> str:
        """The store's schema (its channel's and advisory locks' name)."""
        ...

    async def _listener_conn(self) -> Any: ...

    async def _listener_done(self, conn: Any) -> None: ...

    def _driver_error(self, exc: BaseException) -> BaseException: ...

    async def _run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any: ...


__all__ = ["STOP_WITHIN", "Host", "Listening"]

log = logger("statekernel.stores")

STOP_WITHIN = 5.0
"""Seconds each step of stopping a watch's listening connection may take, and closing
the pool the store opened."""


_BY_DIGEST = "SELECT run_id FROM {t} WHERE md5(run_id) = $1"


async def _run_ids_by_digest(conn: Any, t: Any, digest: str) -> list[Any]:
    return list(await conn.fetch(_BY_DIGEST.format(t=t.runs), digest))


class Listening:
    """A connection of the store's pool that listens for commit notices and puts them
    on the ``feeds`` of the store's watches; when the server ends its session, another
    one takes over."""

    def __init__(self, store: Host, channel: str) -> None:
        self.store, self.channel = store, channel
        self.feeds: set[Feed] = set()
        self._conn: Any = None
        self._again: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen on a connection of the pool (a dead one is a ``StoreError``), and say so
        to the commits' notice trigger (layout 5, ``NOTIFY_WHEN_WATCHED``): hold the
        ``WATCHING`` lock shared on this session, then wait, by taking ``COMMITTING``
        once, for the commits that found no watcher to end."""
        conn = await self.store._listener_conn()
        schema = self.store.schema
        try:
            await conn.add_listener(self.channel, self._notified)
            conn.add_termination_listener(self._ended)
            await conn.execute("SELECT pg_advisory_lock_shared($1)", lock_key(WATCHING, schema))
            committing = lock_key(COMMITTING, schema)
            await conn.execute("SELECT pg_advisory_lock($1)", committing)
            await conn.execute("SELECT pg_advisory_unlock($1)", committing)
        except BaseException as exc:
            discard(conn)  # its state is in doubt
            await self.store._listener_done(conn)
            typed = self.store._driver_error(exc)
            if typed is exc:
                raise
            raise typed from exc
        self._conn = conn

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        notice = _notice(payload)
        if notice is not None:
            self._put(notice)
        elif payload.count(" ") >= 2:  # a run id too long for a notice: found by its digest
            task = asyncio.create_task(self._by_digest(payload))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _by_digest(self, payload: str) -> None:
        revision, state, digest = payload.split(" ", 3)[:3]
        with contextlib.suppress(StatekernelError):
            found = await self.store._run(_run_ids_by_digest, digest)
            if found:
                run_id = bytes(found[0][0]).decode("utf-8", "surrogatepass")
                self._put(CommitNotice(run_id, int(revision), state))

    def _put(self, notice: CommitNotice) -> None:
        for feed in list(self.feeds):
            feed.put(notice)

    def _ended(self, _conn: Any) -> None:
        if self._again is None or self._again.done():
            self._again = asyncio.create_task(self._listen_again())

    async def _listen_again(self) -> None:
        old, self._conn = self._conn, None
        if old is not None:
            await self.store._listener_done(old)
        delay = 0.1
        while self._conn is None:
            try:
                await self.start()
            except StatekernelError as exc:
                log.warning("watching %r: %s; listening again in %.1f s", self.store, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def stop(self) -> None:
        """Stop listening and give the connection back, within ``STOP_WITHIN`` seconds a
        step: a connection that does not answer is closed instead (only ``LISTEN`` ends
        with it). A stop that waited on a step for ever kept its caller, a watch's exit,
        from ending, and an event loop shutting down cancelled it again and again."""
        tasks = [task for task in (self._again, *self._tasks) if task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WITHIN)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            with contextlib.suppress(*DRIVER_ERRORS):
                conn.remove_termination_listener(self._ended)
                if not lost(conn):
                    unlisten = conn.remove_listener(self.channel, self._notified)
                    async with asyncio.timeout(STOP_WITHIN):
                        await unlisten
                    watching = lock_key(WATCHING, self.store.schema)
                    unlock = conn.execute("SELECT pg_advisory_unlock_shared($1)", watching)
                    async with asyncio.timeout(STOP_WITHIN):
                        await unlock
            async with asyncio.timeout(STOP_WITHIN):
                await self.store._listener_done(conn)
        except TimeoutError:
            discard(conn)


def _notice(payload: str) -> CommitNotice | None:
    """The notice of a payload (``revision state md5 hex-id``); None without the id."""
    revision, state, _digest, hex_id = [*payload.split(" ", 3), "", "", ""][:4]
    if not revision.isdigit() or not hex_id:
        return None
    try:
        run_id = bytes.fromhex(hex_id).decode("utf-8", "surrogatepass")
    except ValueError:
        return None
    return CommitNotice(run_id, int(revision), state)
