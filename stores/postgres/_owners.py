"""Owners of this process proven alive to every other client of the server.

As the SQLite store proves an owner alive with ``flock`` on a file, the Postgres store
does with a session-level advisory lock: while an owner of this process holds leases
in the store, one connection the store keeps for its owners holds
``pg_advisory_lock`` on a key of the owner's name. One lock per owner (not per run)
keeps the server's shared lock table small however many runs an owner holds.

Unlike a file lock, the lock can end while its owner lives: the server restarts or
fails over, ``pg_terminate_backend`` or ``idle_session_timeout`` ends the session, a
proxy drops the connection. So a free lock never proves an owner dead at once
(``_leases``): it only starts a grace that the owner ends by locking again. The moment
the connection is lost (asyncpg's termination listener), this process takes every
lock it held again on a new connection, trying again every few tens of milliseconds
until the server answers; a lock still held by the old session (a dropped connection
the server has not noticed yet) is taken as soon as that session ends. The session is
exempt from ``idle_session_timeout``.

Between owners of one process the lock proves nothing (``_leases.decide``): there a
lease lasts until it expires, on the server's clock. Behind PgBouncer in transaction
mode no session lasts, so no lock is taken and every lease lasts until it expires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from statekernel.errors import StatekernelError, StoreError
from statekernel.stores._host.owners import OwnerProofs
from statekernel.stores.postgres._keys import lock_key

__all__ = ["OwnerLocks"]

RETRY_FIRST = 0.02
"""Seconds before the first new attempt at the locks after their connection was lost."""

RETRY_MOST = 0.2
"""The longest wait between attempts (well within ``_leases.GRACE``)."""


class OwnerLocks:
    """Advisory locks of this process's owners, on one connection from ``connect()``
    (given back with ``disconnect`` once no owner holds a lease); ``enabled`` False:
    counts only (PgBouncer). ``errors``: what the driver raises for a lost server."""

    def __init__(
        self,
        schema: str,
        connect: Callable[[], Awaitable[Any]],
        disconnect: Callable[[Any], Awaitable[None]],
        *,
        enabled: bool = True,
        errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.schema = schema
        self.enabled = enabled
        self._connect = connect
        self._disconnect = disconnect
        self._errors: tuple[type[BaseException], ...] = (*errors, StatekernelError)
        self._counts = OwnerProofs(None)  # counts this process's owners (local_owner)
        self._held: dict[str, int] = {}
        self._locked: set[str] = set()  # owners whose lock the connection holds
        self._conn: Any = None
        self._dead = False  # the server ended the locks' connection
        self._mutex = asyncio.Lock()
        self._again: asyncio.Task[None] | None = None
        self.relocked = 0
        """How many times the locks were taken again after their connection was lost."""

    def key(self, owner: str) -> int | None:
        """The lock key proving ``owner`` alive (None: owners are not proven by locks)."""
        if not self.enabled:
            return None
        return lock_key("owner", self.schema, owner)

    async def hold(self, owner: str) -> None:
        """Count one more lease of ``owner``; take its lock with the first one."""
        async with self._mutex:
            count = self._held.get(owner, 0)
            if count == 0 and self.enabled:
                await self._lock(owner)
            self._held[owner] = count + 1
            self._counts.hold(owner)

    async def _session(self) -> Any:
        """The locks' connection, a new one when the server ended the last one."""
        if self._conn is not None and (self._dead or _closed(self._conn)):
            old, self._conn, self._locked = self._conn, None, set()
            with contextlib.suppress(*self._errors):
                await self._let_go(old)  # the pool gets its place back
        if self._conn is None:
            self._dead = False
            conn = await self._connect()
            try:
                if conn.get_server_version().major >= 14:  # never ended for idling
                    await conn.execute("SET idle_session_timeout = 0")
            except BaseException:
                await self._disconnect(conn)
                raise
            conn.add_termination_listener(self._lost)
            self._conn = conn
        return self._conn

    async def _lock(self, owner: str) -> None:
        conn = await self._session()
        for held in [o for o in self._held if o not in self._locked and o != owner]:
            await self._try(conn, held)  # taken again with the new connection
        if owner in self._locked:
            return  # held on this session already: a second lock would stack
        if not await self._try(conn, owner):
            raise StoreError(
                f"owner {owner!r} is held by another live session of the server"
                " (owner names must be unique)"
            )

    async def _try(self, conn: Any, owner: str) -> bool:
        try:
            taken = bool(
                await conn.fetchval(
                    "SELECT pg_try_advisory_lock($1)", lock_key("owner", self.schema, owner)
                )
            )
        except BaseException:
            self._dead = True  # whether the server took the lock is unknown: a new session
            raise
        if taken:
            self._locked.add(owner)
        return taken

    async def _let_go(self, conn: Any) -> None:
        """Give the locks' connection back (its session's locks end with it)."""
        with contextlib.suppress(Exception):
            conn.remove_termination_listener(self._lost)
        await self._disconnect(conn)

    def _lost(self, conn: Any) -> None:
        """The locks' connection ended: take the locks again at once (a listener called
        late for a connection already replaced is ignored)."""
        if conn is not self._conn:  # asyncpg gives the pool's proxy, as ``_connect`` did
            return
        self._dead = True
        if self._held and self.enabled and (self._again is None or self._again.done()):
            self._again = asyncio.get_running_loop().create_task(self._lock_again())

    async def _lock_again(self) -> None:
        """Take every held owner's lock again, until each is held or none is needed."""
        delay = RETRY_FIRST
        while True:
            async with self._mutex:
                if not self._held:
                    return
                try:
                    conn = await self._session()
                    for owner in [o for o in self._held if o not in self._locked]:
                        await self._try(conn, owner)
                except self._errors:
                    pass  # the server is not back yet
                if self._conn is not None and self._locked >= set(self._held):
                    self.relocked += 1
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)

    async def drop(self, owner: str) -> None:
        """Count one lease of ``owner`` less; release its lock with the last one."""
        async with self._mutex:
            count = self._held.get(owner, 0)
            if count == 0:
                return
            self._counts.drop(owner)
            if count > 1:
                self._held[owner] = count - 1
                return
            del self._held[owner]
            conn = self._conn
            if conn is None or not self.enabled:
                return
            if self._held:
                try:
                    if owner in self._locked and not self._dead and not _closed(conn):
                        key = lock_key("owner", self.schema, owner)
                        await conn.fetchval("SELECT pg_advisory_unlock($1)", key)
                finally:
                    self._locked.discard(owner)
                return
            self._conn, self._locked = None, set()
            await self._let_go(conn)

    async def close(self) -> None:
        """Release every lock (the store closes)."""
        async with self._mutex:
            again, self._again = self._again, None
            if again is not None:
                again.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await again
            self._counts.close()
            self._held.clear()
            conn, self._conn, self._locked = self._conn, None, set()
            if conn is not None:
                await self._let_go(conn)


def _closed(conn: Any) -> bool:
    """Whether a connection of the pool has ended (a pool's proxy of a connection the
    server closed is detached from it and refuses every call)."""
    try:
        return bool(conn.is_closed())
    except Exception:
        return True
