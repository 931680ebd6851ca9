"""Run queues in PostgreSQL: a table read with ``FOR UPDATE SKIP LOCKED``, woken by
``LISTEN/NOTIFY``.

An entry is a row of ``queue_entries`` (``schema``): new while its ``consumer`` is
NULL, and ready once its ``ready_at`` (a delayed submit's) has passed on the server's
clock. A read takes the oldest ready new rows of the queue in one ``UPDATE ... WHERE id IN
(SELECT ... FOR UPDATE SKIP LOCKED)``, so workers reading at once never take the same
entry and never wait for each other; it sets the consumer, the claim time (the
server's ``now()``) and counts the delivery. A worker refreshes the claim time of the
entries it works on; an entry whose claim time is older than the idle limit belongs
to a worker that stopped, and a reclaim takes it over the same way. Acknowledging
deletes the row; handing back deletes it and inserts a new one at the end; a dead
letter is inserted and the entry deleted in one transaction. An entry carries the trace
context of its submit (``traceparent``, ``tracestate``; NULL: none) to the worker;
handing it back and a dead letter keep it, and so does the entry that puts the dead
letter back.

A submit notifies the queue's channel in its own transaction (the notice is sent when
it commits). A reader that found nothing waits for a notice on a connection that
listens (one per queue object, taken from the store's pool at the first read); behind
PgBouncer in transaction mode, where a session cannot listen, it looks again every
``POLL_SECONDS`` instead. A notice that comes while the reader queries is not lost:
the reader clears its wake-up flag before the query and looks again when it is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from statekernel._records.run import TraceParent
from statekernel._storage.queues import (
    DeadLetter,
    QueueDepth,
    QueuedRun,
    QueueEntry,
    checked_queue_name,
    queue_key,
)
from statekernel._storage.shielding import shielded
from statekernel.stores.postgres import _queue_admin as admin
from statekernel.stores.postgres._connections import discard, lost
from statekernel.stores.postgres._keys import lock_key
from statekernel.stores.postgres._ops import Tables, run_key

__all__ = ["DEAD_MAX", "POLL_SECONDS", "PostgresRunQueue", "channel_of"]

DEAD_MAX = 10_000
"""Dead letters kept per queue (the oldest go first)."""
POLL_SECONDS = 0.25
"""How often a reader that cannot listen looks for new entries while it waits."""

Run = Callable[..., Awaitable[Any]]
"""The store's ``fn(connection, tables, *args)`` runner (typed errors, shielded)."""
Acquire = Callable[[], Awaitable[Any]]
Release = Callable[[Any], Awaitable[None]]
Typed = Callable[[BaseException], BaseException]
"""The store's error for what the driver raised (a ``StoreError``), or the error as is."""


def channel_of(schema: str, name: str) -> str:
    """The ``NOTIFY`` channel of queue ``name`` in ``schema`` (an identifier of 38
    characters, whatever the names' lengths)."""
    text = f"{schema}\0{name}".encode("utf-8", "surrogatepass")
    return "statekernel_q_" + hashlib.blake2b(text, digest_size=12).hexdigest()


def _entry(row: Any) -> QueueEntry:
    run_id = bytes(row["run_id"]).decode("utf-8", "replace")
    at, deliveries, limit = int(row["submitted_ms"]), int(row["deliveries"]), row["key_limit"]
    trace = _trace(row["traceparent"], row["tracestate"])
    key = row["key"]
    return QueueEntry(str(row["id"]), run_id, at, deliveries, key, int(limit or 1), trace)


def _trace(traceparent: str | None, tracestate: str | None) -> TraceParent | None:
    """The trace context of a row's columns (None without ``traceparent``)."""
    return TraceParent(traceparent, tracestate or None) if traceparent else None


def _trace_columns(trace: TraceParent | None) -> tuple[str | None, str | None]:
    return (None, None) if trace is None else (trace.traceparent, trace.tracestate)


def _entry_id(entry: QueueEntry) -> int:
    return int(entry.id) if entry.id.isdigit() else -1


class PostgresRunQueue:
    """The queue ``name`` of a Postgres store (a ``statekernel.stores.RunQueue``)."""

    def __init__(
        self,
        name: str,
        tables: Tables,
        run: Run,
        *,
        acquire: Acquire,
        release: Release,
        listens: bool,
        typed: Typed = lambda exc: exc,
    ) -> None:
        self.name = checked_queue_name(name)
        self.channel = channel_of(tables.schema, name)
        self._take_lock = lock_key("queue", tables.schema, name)
        self._t = tables
        self._run = run
        self._acquire = acquire
        self._release = release
        self._listens = listens
        self._typed = typed
        self._listener: Any = None
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()

    # -- submitting -------------------------------------------------------------------

    async def submit(
        self,
        run_id: str,
        submitted_ms: int | None = None,
        *,
        delay_ms: int = 0,
        key: str | None = None,
        key_limit: int = 1,
        trace: TraceParent | None = None,
    ) -> str:
        """Append an entry for ``run_id`` (taken no sooner than ``delay_ms`` from now, on
        the server's clock; with a ``key``, while fewer than ``key_limit`` entries of it
        are taken; carrying ``trace``) and notify the readers; the entry id."""
        at = submitted_ms if submitted_ms is not None else int(time.time() * 1000)
        limit = queue_key(key, key_limit)
        new = _New(self.name, run_key(run_id), at, delay_ms, key, limit, trace)
        found = await self._run(_insert, new, self.channel, False)
        return str(found)

    async def submit_existing(
        self,
        run_id: str,
        delay_ms: int = 0,
        key: str | None = None,
        key_limit: int = 1,
        trace: TraceParent | None = None,
    ) -> int | None:
        """Append an entry if the run exists (one statement); its id, or None."""
        at = int(time.time() * 1000)
        new = _New(self.name, run_key(run_id), at, delay_ms, key, key_limit, trace)
        found: int | None = await self._run(_insert, new, self.channel, True)
        return found

    # -- reading ----------------------------------------------------------------------

    async def prepare(self) -> None:
        """Start listening for new entries (where the connection can)."""
        await self._listen()

    async def read(self, consumer: str, count: int, block_ms: int) -> list[QueueEntry]:
        """Up to ``count`` new entries for ``consumer``, waiting up to ``block_ms`` for
        the first one (woken by a notice, or looking again every ``POLL_SECONDS``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(block_ms, 0) / 1000
        while True:
            listening = await self._listen()
            self._wake.clear()
            rows = await self._run(_take_new, self.name, consumer, count, self._take_lock)
            if rows or block_ms <= 0:
                return [_entry(r) for r in rows]
            left = deadline - loop.time()
            if left <= 0:
                return []
            with contextlib.suppress(TimeoutError):
                wait = left if listening else min(left, POLL_SECONDS)
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def reclaim(
        self, consumer: str, count: int, min_idle_ms: int, cursor: str = "0-0"
    ) -> tuple[str, list[QueueEntry]]:
        """Take over up to ``count`` entries whose claim is older than ``min_idle_ms``
        on the server's clock (the cursor is not needed here and comes back as is)."""
        rows = await self._run(_take_idle, self.name, consumer, count, min_idle_ms / 1000)
        return cursor, [_entry(r) for r in rows]

    async def refresh(self, consumer: str, ids: Sequence[str]) -> None:
        """Move the claim time of ``consumer``'s entries ``ids`` to the server's now."""
        numbers = [int(i) for i in ids if i.isdigit()]
        if numbers:
            await self._run(_refresh, self.name, consumer, numbers)

    # -- settling ---------------------------------------------------------------------

    async def ack(self, entry: QueueEntry) -> None:
        """Delete the entry: its run is at rest."""
        await self._run(_delete, _entry_id(entry))

    async def requeue(self, entry: QueueEntry) -> str:
        """Replace the entry by a new one at the end of the queue, in one transaction."""
        new_id = await self._run(_requeue, self.name, entry, self.channel)
        return str(new_id)

    async def dead(self, entry: QueueEntry, reason: str, detail: str, worker: str) -> None:
        """Record a dead letter and delete the entry, in one transaction."""
        letter = DeadLetter(
            entry.run_id, entry.id, reason, detail[:2000], worker, int(time.time() * 1000)
        )
        await self._run(_bury, self.name, _entry_id(entry), letter, entry.trace)

    # -- looking ----------------------------------------------------------------------

    async def pending(self, consumer: str | None = None) -> int:
        """Entries delivered and not yet settled (of ``consumer``, or of anyone)."""
        found: int = await self._run(_count, self.name, consumer, True)
        return found

    async def waiting(self) -> int:
        """Entries not delivered yet."""
        found: int = await self._run(_count, self.name, None, False)
        return found

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead letters, oldest first."""
        rows = await self._run(_dead_letters, self.name, limit)
        return [
            DeadLetter(
                bytes(r["run_id"]).decode("utf-8", "replace"),
                r["entry"],
                r["reason"],
                r["detail"],
                r["worker"],
                int(r["at_ms"]),
            )
            for r in reversed(rows)
        ]

    async def depth(self) -> QueueDepth:
        """How many entries wait, are taken and are dead letters, and the oldest wait."""
        found: QueueDepth = await self._run(admin.depth, self.name)
        return found

    async def entries(self, limit: int = 100) -> list[QueuedRun]:
        """The entries not settled (waiting, delayed, taken), oldest first."""
        found: list[QueuedRun] = await self._run(admin.entries, self.name, limit)
        return found

    async def revive(self, run_id: str | None = None) -> int:
        """Put the runs of the dead letters (of ``run_id``, or all) back on the queue."""
        found: int = await self._run(admin.revive, self.name, run_id, self.channel)
        return found

    async def drop(self, run_id: str) -> int:
        """Remove ``run_id``'s entries not taken and its dead letters."""
        found: int = await self._run(admin.drop, self.name, run_id)
        return found

    async def leave(self, consumer: str) -> None:
        """Nothing is kept of a consumer here."""

    # -- listening --------------------------------------------------------------------

    async def _listen(self) -> bool:
        """True when a connection listens for this queue's notices (taken on first use,
        taken again after the server ended its session)."""
        if not self._listens:
            return False
        async with self._lock:
            conn = self._listener
            if conn is not None and not lost(conn):
                return True
            if conn is not None:
                self._listener = None
                await self._release(conn)
            conn = await self._acquire()
            try:
                await conn.add_listener(self.channel, self._notified)
            except BaseException as exc:
                discard(conn)  # its state is in doubt
                await self._release(conn)
                typed = self._typed(exc)
                if typed is exc:
                    raise
                raise typed from exc  # a dead connection (a restarted server): StoreError
            self._listener = conn
            self._wake.set()  # entries may have come while nobody listened
            return True

    def _notified(self, *_: Any) -> None:
        self._wake.set()

    async def aclose(self) -> None:
        """Stop listening and give the connection back to the store's pool (to the end,
        even if the caller is cancelled meanwhile)."""
        await shielded(self._unlisten())

    async def _unlisten(self) -> None:
        async with self._lock:
            conn, self._listener = self._listener, None
            if conn is None:
                return
            with contextlib.suppress(Exception):
                if not lost(conn):
                    await conn.remove_listener(self.channel, self._notified)
            await self._release(conn)


@attrs.frozen
class _New:
    """A new entry's row: queue, run key, submit time, delay, key (with its limit) and
    trace context."""

    queue: str
    run: bytes
    at: int
    delay_ms: int = 0
    key: str | None = None
    key_limit: int = 1
    trace: TraceParent | None = None


async def _insert(conn: Any, t: Tables, new: _New, channel: str, checked: bool) -> int | None:
    exists = f" WHERE EXISTS (SELECT 1 FROM {t.runs} WHERE run_id = $2)" if checked else ""
    ready = "CASE WHEN $5::bigint > 0 THEN now() + make_interval(secs => $5::bigint / 1000.0) END"
    sql = (
        f"WITH e AS (INSERT INTO {t.queue} (queue, run_id, submitted_ms, ready_at, key,"
        f" key_limit, traceparent, tracestate) SELECT $1, $2, $3, {ready}, $6::text,"
        f" $7::integer, $8::text, $9::text{exists} RETURNING id)"
        " SELECT id, pg_notify($4, '') FROM e"
    )
    key_limit = new.key_limit if new.key is not None else None
    args = (new.queue, new.run, new.at, channel, new.delay_ms, new.key, key_limit)
    row = await conn.fetchrow(sql, *args, *_trace_columns(new.trace))
    return None if row is None else int(row[0])


_TAKEN = "RETURNING id, run_id, submitted_ms, deliveries, key, key_limit, traceparent, tracestate"

_TAKE_NEW = """
WITH busy AS (
    SELECT key, count(*) AS n FROM {q} WHERE queue = $1 AND key IS NOT NULL
    AND consumer IS NOT NULL GROUP BY key
), candidates AS (
    SELECT e.id, e.key, e.key_limit FROM {q} e
    WHERE e.queue = $1 AND e.consumer IS NULL AND (e.ready_at IS NULL OR e.ready_at <= now())
    AND (e.key IS NULL OR NOT EXISTS (
        SELECT 1 FROM busy b WHERE b.key = e.key AND b.n >= e.key_limit))
    ORDER BY e.id LIMIT $4
), chosen AS (
    SELECT c.id FROM (
        SELECT id, key, key_limit, row_number() OVER (PARTITION BY key ORDER BY id) AS rank
        FROM candidates
    ) c LEFT JOIN busy b ON b.key = c.key
    WHERE c.key IS NULL OR coalesce(b.n, 0) + c.rank <= c.key_limit
    ORDER BY c.id LIMIT $3
)
UPDATE {q} SET consumer = $2, claimed_at = now(), deliveries = deliveries + 1
WHERE id IN (SELECT id FROM {q} WHERE id IN (SELECT id FROM chosen) FOR UPDATE SKIP LOCKED)
"""
"""Take up to ``$3`` ready entries, oldest first, none of a key beyond its limit of
entries taken (counting the ones this take adds); ``$4`` candidates are looked at, after
the keys at their limit are left out."""


async def _take_new(
    conn: Any, t: Tables, queue: str, consumer: str, count: int, lock: int
) -> list[Any]:
    """The take, under the queue's advisory lock: two readers that counted a key's
    entries in flight at once would take one too many of it."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock)
        sql = _TAKE_NEW.format(q=t.queue) + _TAKEN
        rows = await conn.fetch(sql, queue, consumer, count, count * 4)
    return sorted(rows, key=lambda r: r["id"])


async def _take_idle(
    conn: Any, t: Tables, queue: str, consumer: str, count: int, idle_s: float
) -> list[Any]:
    sql = (
        f"UPDATE {t.queue} SET consumer = $2, claimed_at = now(), deliveries = deliveries + 1"
        f" WHERE id IN (SELECT id FROM {t.queue} WHERE queue = $1 AND consumer IS NOT NULL"
        " AND claimed_at < now() - make_interval(secs => $4)"
        f" ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) {_TAKEN}"
    )
    rows = await conn.fetch(sql, queue, consumer, count, idle_s)
    return sorted(rows, key=lambda r: r["id"])


async def _refresh(conn: Any, t: Tables, queue: str, consumer: str, ids: list[int]) -> None:
    await conn.execute(
        f"UPDATE {t.queue} SET claimed_at = now()"
        " WHERE queue = $1 AND consumer = $2 AND id = ANY($3::bigint[])",
        queue,
        consumer,
        ids,
    )


async def _delete(conn: Any, t: Tables, entry_id: int) -> None:
    await conn.execute(f"DELETE FROM {t.queue} WHERE id = $1", entry_id)


async def _requeue(conn: Any, t: Tables, queue: str, entry: QueueEntry, channel: str) -> int:
    async with conn.transaction():
        await conn.execute(f"DELETE FROM {t.queue} WHERE id = $1", _entry_id(entry))
        run, at = run_key(entry.run_id), entry.submitted_ms
        again = _New(queue, run, at, 0, entry.key, entry.key_limit, entry.trace)
        new_id = await _insert(conn, t, again, channel, False)
    assert new_id is not None
    return new_id


async def _bury(
    conn: Any, t: Tables, queue: str, entry_id: int, letter: DeadLetter, trace: TraceParent | None
) -> None:
    async with conn.transaction():
        await conn.execute(
            f"INSERT INTO {t.dead} (queue, run_id, entry, reason, detail, worker, at_ms,"
            " traceparent, tracestate) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            queue,
            run_key(letter.run_id),
            letter.entry,
            letter.reason,
            letter.detail,
            letter.worker,
            letter.at_ms,
            *_trace_columns(trace),
        )
        await conn.execute(f"DELETE FROM {t.queue} WHERE id = $1", entry_id)
        await conn.execute(
            f"DELETE FROM {t.dead} WHERE queue = $1 AND id <= (SELECT id FROM {t.dead}"
            " WHERE queue = $1 ORDER BY id DESC OFFSET $2 LIMIT 1)",
            queue,
            DEAD_MAX,
        )


async def _count(conn: Any, t: Tables, queue: str, consumer: str | None, taken: bool) -> int:
    if not taken:
        sql = f"SELECT count(*) FROM {t.queue} WHERE queue = $1 AND consumer IS NULL"
        return int(await conn.fetchval(sql, queue))
    if consumer is None:
        sql = f"SELECT count(*) FROM {t.queue} WHERE queue = $1 AND consumer IS NOT NULL"
        return int(await conn.fetchval(sql, queue))
    sql = f"SELECT count(*) FROM {t.queue} WHERE queue = $1 AND consumer = $2"
    return int(await conn.fetchval(sql, queue, consumer))


async def _dead_letters(conn: Any, t: Tables, queue: str, limit: int) -> list[Any]:
    sql = (
        f"SELECT run_id, entry, reason, detail, worker, at_ms FROM {t.dead}"
        " WHERE queue = $1 ORDER BY id DESC LIMIT $2"
    )
    return list(await conn.fetch(sql, queue, limit))
