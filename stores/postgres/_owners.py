"""Owners of this process proven alive to every other client of the server.

As the SQLite store proves an owner alive with ``flock`` on a file, the Postgres store
does with a session-level advisory lock: while an owner of this process holds leases
in the store, one connection the store keeps for its owners holds
``pg_advisory_lock`` on a key of the owner's name. The server releases it the moment
that connection ends (the process died, or lost the server), so another process that
finds the lock free knows the owner is gone and takes its leases over at once, while
a live owner's lease is never taken, whatever any clock says. One lock per owner (not
per run) keeps the server's shared lock table small however many runs an owner holds.

Between owners of one process the lock proves nothing (``_owners.take``): there
a lease lasts until it expires, on the server's clock. Behind PgBouncer in transaction
mode no session lasts, so no lock is taken and every lease lasts until it expires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from statekernel.errors import StoreError
from statekernel.stores._owners import OwnerProofs
from statekernel.stores.postgres._keys import lock_key

__all__ = ["OwnerLocks"]


class OwnerLocks:
    """Advisory locks of this process's owners, on one connection from ``connect()``
    (given back with ``disconnect`` once no owner holds a lease); ``enabled`` False:
    counts only (PgBouncer)."""

    def __init__(
        self,
        schema: str,
        connect: Callable[[], Awaitable[Any]],
        disconnect: Callable[[Any], Awaitable[None]],
        *,
        enabled: bool = True,
    ) -> None:
        self.schema = schema
        self.enabled = enabled
        self._connect = connect
        self._disconnect = disconnect
        self._counts = OwnerProofs(None)  # counts this process's owners (local_owner)
        self._held: dict[str, int] = {}
        self._conn: Any = None
        self._mutex = asyncio.Lock()

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

    async def _lock(self, owner: str) -> None:
        if self._conn is not None and self._conn.is_closed():
            old, self._conn = self._conn, None  # the server ended the session: its locks
            await self._disconnect(old)  # are gone; the pool gets its connection back
            for held in list(self._held):
                await self._lock(held)
        if self._conn is None:
            self._conn = await self._connect()
        taken = await self._conn.fetchval(
            "SELECT pg_try_advisory_lock($1)", lock_key("owner", self.schema, owner)
        )
        if not taken:
            raise StoreError(
                f"owner {owner!r} is held by another live session of the server"
                " (owner names must be unique)"
            )

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
                if not conn.is_closed():
                    key = lock_key("owner", self.schema, owner)
                    await conn.fetchval("SELECT pg_advisory_unlock($1)", key)
                return
            self._conn = None
            await self._disconnect(conn)  # ends the session's locks with it

    async def close(self) -> None:
        """Release every lock (the store closes)."""
        async with self._mutex:
            self._counts.close()
            self._held.clear()
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._disconnect(conn)
