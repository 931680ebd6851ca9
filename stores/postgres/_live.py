"""The live events of a PostgreSQL store's runs (``statekernel._storage.live``): sent with
``NOTIFY`` on a channel of the run (``statekernel_l_`` and a digest of schema and run
id), received with ``LISTEN`` on one connection of the pool that the store's readers
share while any reads.

``NOTIFY`` keeps nothing past its delivery, and takes payloads under 8000 bytes: a
longer batch of live events is split in parts (``PAYLOAD_LIMIT``) sent in one
statement, which the reader puts back together. Behind PgBouncer (``pgbouncer=1``) a
session cannot listen: live events are still sent, but read only by readers with a
direct connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from statekernel._secrets import logger
from statekernel._storage.live import carries_live
from statekernel._storage.shielding import shielded
from statekernel.errors import StatekernelError
from statekernel.stores._common import checked_run_id
from statekernel.stores.postgres._connections import DRIVER_ERRORS, discard, lost
from statekernel.stores.postgres._store import PostgresStore

__all__ = ["PAYLOAD_LIMIT", "PostgresLive", "live_channel"]

log = logger("statekernel.stores")

PAYLOAD_LIMIT = 7_900
"""The largest payload sent with ``NOTIFY`` (the server takes less than 8000 bytes)."""

_SEND = "SELECT pg_notify($1, p) FROM unnest($2::text[]) WITH ORDINALITY AS u(p, i) ORDER BY i"


def live_channel(schema: str, run_id: str) -> str:
    """The ``NOTIFY`` channel of ``run_id``'s live events in the store of ``schema``."""
    text = f"{schema}\0{run_id}".encode("utf-8", "surrogatepass")
    return "statekernel_l_" + hashlib.blake2b(text, digest_size=12).hexdigest()


async def _notify(conn: Any, _t: Any, channel: str, payloads: list[str]) -> None:
    await conn.execute(_SEND, channel, payloads)


class PostgresLive:
    """Carries the live events of ``store``'s runs on ``LISTEN/NOTIFY``."""

    limit: int | None = PAYLOAD_LIMIT

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._puts: dict[str, set[Callable[[str], None]]] = {}
        self._conn: Any = None
        self._lock = asyncio.Lock()
        self._again: asyncio.Task[None] | None = None

    async def send(self, run_id: str, payloads: list[str]) -> None:
        """``NOTIFY`` the payloads on the run's channel, in one statement."""
        await self.store._run(_notify, live_channel(self.store.schema, run_id), payloads)

    @contextlib.asynccontextmanager
    async def subscribe(self, run_id: str, put: Callable[[str], None]) -> AsyncIterator[None]:
        """``LISTEN`` on the run's channel (on the shared connection) while the block
        runs; each payload received goes to ``put``."""
        checked_run_id(run_id)
        if self.store.pgbouncer:
            yield
            return
        channel = live_channel(self.store.schema, run_id)
        async with self._lock:
            await self._listen(channel, put)
        try:
            yield
        finally:
            await shielded(self._unlisten(channel, put))

    def _notified(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        for put in list(self._puts.get(channel, ())):
            put(payload)

    async def _listen(self, channel: str, put: Callable[[str], None]) -> None:
        if self._conn is None:
            conn = await self.store._listener_conn()
            conn.add_termination_listener(self._ended)
            self._conn = conn
        puts = self._puts.setdefault(channel, set())
        if not puts:
            try:
                await self._conn.add_listener(channel, self._notified)
            except BaseException as exc:
                del self._puts[channel]
                await self._give_back_if_idle(broken=True)
                typed = self.store._driver_error(exc)
                if typed is exc:
                    raise
                raise typed from exc
        puts.add(put)

    async def _unlisten(self, channel: str, put: Callable[[str], None]) -> None:
        async with self._lock:
            puts = self._puts.get(channel)
            if puts is None:
                return
            puts.discard(put)
            if puts:
                return
            del self._puts[channel]
            conn = self._conn
            if conn is not None and not lost(conn):
                with contextlib.suppress(*DRIVER_ERRORS):
                    await conn.remove_listener(channel, self._notified)
            await self._give_back_if_idle(broken=False)

    async def _give_back_if_idle(self, *, broken: bool) -> None:
        conn = self._conn
        if conn is None or self._puts:
            return
        self._conn = None
        with contextlib.suppress(*DRIVER_ERRORS):
            conn.remove_termination_listener(self._ended)
        if broken:
            discard(conn)
        await self.store._listener_done(conn)

    def _ended(self, _conn: Any) -> None:
        if self._again is None or self._again.done():
            self._again = asyncio.get_running_loop().create_task(self._listen_again())

    async def _listen_again(self) -> None:
        """After the server ended the listening session: listen on another connection
        to every channel read (what was sent meanwhile is missed)."""
        async with self._lock:
            old, self._conn = self._conn, None
            if old is not None:
                await self.store._listener_done(old)
            delay = 0.1
            while self._puts and self._conn is None:
                conn = None
                try:
                    conn = await self.store._listener_conn()
                    for channel in self._puts:
                        await conn.add_listener(channel, self._notified)
                    conn.add_termination_listener(self._ended)
                    self._conn = conn
                except (StatekernelError, *DRIVER_ERRORS) as exc:
                    if conn is not None:
                        discard(conn)
                        await self.store._listener_done(conn)
                    log.warning("live events of %r: %s; listening again", self.store, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)


carries_live(PostgresStore, PostgresLive)
