"""Run queues: a Redis Stream per queue, consumed by workers through one consumer group.

Keys (the queue name is the hash tag, so a queue's keys share one Cluster slot):
``<prefix>:queue:{name}`` (the stream; each entry names a run: fields ``run`` and
``at``, the submit time in ms; a keyed one also ``key`` and ``limit``; one submitted
under a span also ``tp`` and ``ts``, its W3C ``traceparent`` and ``tracestate``), the
delayed and keyed entries waiting aside (``_queue_scripts``: a read moves those that may
go to the stream) and ``<prefix>:queue:{name}:dead`` (failures: runs that ended
``failed`` and entries that could not be driven, with the entry's ``tp`` and ``ts``,
capped at about 10,000). Entries written without ``tp`` (by an earlier release) read as
entries without a trace context.
Entries are deleted once acknowledged, so the stream holds only work not yet done:
new entries and the consumer group's pending list.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from statekernel._records.run import TraceParent
from statekernel._secrets import redact
from statekernel._storage.queues import (
    DeadLetter,
    QueueDepth,
    QueuedRun,
    QueueEntry,
    checked_queue_name,
    queue_key,
)
from statekernel.errors import StoreError
from statekernel.stores.redis import _queue_admin as admin
from statekernel.stores.redis import _queue_scripts as scripts
from statekernel.stores.redis._fencing import RedisBacked
from statekernel.stores.redis._wire import FAILURES, transaction

__all__ = ["GROUP", "RedisRunQueue"]

T = TypeVar("T")
GROUP = scripts.GROUP
DEAD_MAXLEN = 10_000
READY_KEYS = 100
"""Waiting keys a read looks at for entries to move to the stream (oldest keys first)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(item: Any, deliveries: int = 1) -> QueueEntry:
    entry_id, raw = item
    raw = {_text(k): v for k, v in (raw or {}).items()}
    fields = {k: _text(v) for k, v in raw.items() if k not in ("tp", "ts")}
    at = _number(fields.get("at", "0"))
    key, limit = fields.get("key"), max(_number(fields.get("limit", "1")), 1)
    trace = _read_trace(raw.get("tp"), raw.get("ts"))
    run_id = fields.get("run", "")
    return QueueEntry(_text(entry_id), run_id, at, deliveries, key, limit, trace)


def _read_trace(traceparent: Any, tracestate: Any) -> TraceParent | None:
    """The trace context of an entry's ``tp`` and ``ts`` (None without ``tp``); text that
    is not UTF-8 is read with replacement characters (a worker ignores what does not
    parse as a trace context)."""
    if not traceparent:
        return None
    state = admin.loose_text(tracestate) if tracestate else None
    return TraceParent(admin.loose_text(traceparent), state)


def _trace_fields(trace: TraceParent | None) -> dict[Any, Any]:
    """The stream fields of an entry's trace context (none without one)."""
    if trace is None:
        return {}
    fields = {"tp": trace.traceparent}
    return fields if trace.tracestate is None else fields | {"ts": trace.tracestate}


def _waiting_member(
    run_id: str, at: int, entry_id: str, key: str | None, limit: int, trace: TraceParent | None
) -> str:
    """The JSON of an entry kept aside (``_queue_scripts``): ``[run, at, id, key,
    limit]``, and ``traceparent`` and ``tracestate`` after them when it has a trace
    context."""
    member: list[Any] = [run_id, at, entry_id, key, limit]
    if trace is not None:
        member += [trace.traceparent, trace.tracestate]
    return json.dumps(member, ensure_ascii=False)


def _number(value: str) -> int:
    return int(value) if value.isdigit() else 0


class RedisRunQueue:
    """The queue ``name`` of a Redis store: submit, take, acknowledge, hand back
    (a ``statekernel.stores.RunQueue``)."""

    def __init__(self, store: RedisBacked, name: str) -> None:
        self.name = checked_queue_name(name)
        self.client = store.client
        self.key = f"{store.prefix}:queue:{{{name}}}"
        self.dead_key = self.key + ":dead"
        self.delayed_key = self.key + ":delayed"
        self._delay = self.client.register_script(scripts.DELAY)
        self._keyed = self.client.register_script(scripts.KEYED)
        self._ready = self.client.register_script(scripts.READY)
        self._settle = self.client.register_script(scripts.SETTLE)
        self._waiting = self.client.register_script(scripts.WAITING)

    async def _call(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except FAILURES as exc:
            raise StoreError(redact(f"queue {self.name!r}: {type(exc).__name__}: {exc}")) from exc

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
        """Append an entry for ``run_id`` (kept aside until ``delay_ms`` from now, on the
        server's clock; with a ``key``, in its key's list until fewer than ``key_limit``
        of that key are in flight; carrying ``trace``); returns the entry id (one kept
        aside: ``waiting-<uuid>``)."""
        at = submitted_ms if submitted_ms is not None else int(time.time() * 1000)
        limit = queue_key(key, key_limit)
        if delay_ms <= 0 and key is None:
            fields: dict[Any, Any] = {"run": run_id, "at": at, **_trace_fields(trace)}
            return _text(await self._call(self.client.xadd(self.key, fields)))
        entry_id = f"waiting-{uuid.uuid4().hex}"
        member = _waiting_member(run_id, at, entry_id, key, limit, trace)
        if delay_ms > 0:
            await self._call(self._delay(keys=[self.delayed_key], args=[delay_ms, member]))
        else:
            await self._call(self._keyed(keys=[self.key], args=[member]))
        return entry_id

    async def prepare(self) -> None:
        """Create the consumer group (and the stream) if needed; it sees every entry."""
        from redis.exceptions import ResponseError

        try:
            await self.client.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise StoreError(f"queue {self.name!r}: {exc}") from exc
        except FAILURES as exc:
            raise StoreError(redact(f"queue {self.name!r}: {type(exc).__name__}: {exc}")) from exc

    async def read(self, consumer: str, count: int, block_ms: int) -> list[QueueEntry]:
        """Up to ``count`` new entries, waiting up to ``block_ms`` for the first one
        (delayed entries that are due join the stream first)."""
        await self._call(self._ready(keys=[self.key], args=[count, READY_KEYS]))
        streams: dict[Any, Any] = {self.key: ">"}
        reply: Any = await self._call(
            # BLOCK 0 would wait for ever: 0 (or less) asks for what is there now
            self.client.xreadgroup(
                GROUP, consumer, streams, count=count, block=block_ms if block_ms > 0 else None
            )
        )
        return [_entry(item) for _, items in reply or [] for item in items]

    async def reclaim(
        self, consumer: str, count: int, min_idle_ms: int, cursor: str = "0-0"
    ) -> tuple[str, list[QueueEntry]]:
        """Take over up to ``count`` entries pending longer than ``min_idle_ms`` (their
        worker stopped refreshing them); returns the next cursor and the entries with
        their delivery counts."""
        reply = await self._call(
            self.client.xautoclaim(self.key, GROUP, consumer, min_idle_ms, cursor, count=count)
        )
        next_cursor, items = _text(reply[0]), [i for i in reply[1] if i and i[1] is not None]
        if not items:
            return next_cursor, []
        pipe = self.client.pipeline(transaction=False)
        for entry_id, _ in items:
            pipe.xpending_range(self.key, GROUP, min=entry_id, max=entry_id, count=1)
        counts = [rows[0]["times_delivered"] if rows else 1 for rows in await pipe.execute()]
        return next_cursor, [_entry(i, n) for i, n in zip(items, counts, strict=True)]

    async def refresh(self, consumer: str, ids: Sequence[str]) -> None:
        """Reset the idle time of entries this consumer is working on (not reclaimable)."""
        if ids:
            claim = self.client.xclaim(self.key, GROUP, consumer, 0, list(ids), justid=True)
            await self._call(claim)

    async def _settle_keyed(self, entry: QueueEntry, *how: Any) -> None:
        """Settle a keyed entry (``ack``, ``dead`` or ``requeue`` and their arguments):
        its key's place in flight is given back once."""
        args = [GROUP, entry.id, entry.key, *how]
        await self._call(self._settle(keys=[self.key], args=args))

    async def ack(self, entry: QueueEntry) -> None:
        """Acknowledge and delete an entry: its run is at rest."""
        if entry.key is not None:
            await self._settle_keyed(entry, "ack")
            return
        pipe = await self._call(transaction(self.client))
        pipe.xack(self.key, GROUP, entry.id)
        pipe.xdel(self.key, entry.id)
        await self._call(pipe.execute())

    async def requeue(self, entry: QueueEntry) -> str:
        """Replace an entry by a new one at the end of the queue (a keyed one: of its
        key's list), with its trace context, atomically."""
        if entry.key is not None:
            entry_id = f"waiting-{uuid.uuid4().hex}"
            again = _waiting_member(
                entry.run_id, entry.submitted_ms, entry_id, entry.key, entry.key_limit, entry.trace
            )
            await self._settle_keyed(entry, "requeue", again)
            return entry_id
        fields: dict[Any, Any] = {"run": entry.run_id, "at": entry.submitted_ms}
        fields |= _trace_fields(entry.trace)
        pipe = await self._call(transaction(self.client))
        pipe.xadd(self.key, fields)
        pipe.xack(self.key, GROUP, entry.id)
        pipe.xdel(self.key, entry.id)
        new_id, *_ = await self._call(pipe.execute())
        return _text(new_id)

    async def dead(self, entry: QueueEntry, reason: str, detail: str, worker: str) -> None:
        """Record a failure on the dead-letter stream (with the entry's trace context, which
        putting it back keeps) and acknowledge the entry, atomically."""
        fields: dict[Any, Any] = {"run": entry.run_id, "entry": entry.id, "reason": reason}
        fields |= {"detail": detail[:2000], "worker": worker, "at": int(time.time() * 1000)}
        fields |= _trace_fields(entry.trace)
        if entry.key is not None:
            flat = [part for pair in fields.items() for part in pair]
            await self._settle_keyed(entry, "dead", DEAD_MAXLEN, *flat)
            return
        pipe = await self._call(transaction(self.client))
        pipe.xadd(self.dead_key, fields, maxlen=DEAD_MAXLEN, approximate=True)
        pipe.xack(self.key, GROUP, entry.id)
        pipe.xdel(self.key, entry.id)
        await self._call(pipe.execute())

    async def pending(self, consumer: str | None = None) -> int:
        """How many entries are delivered and not yet acknowledged (of ``consumer``)."""
        if consumer is None:
            summary = await self._call(self.client.xpending(self.key, GROUP))
            return int(summary["pending"])
        rows = await self._call(
            self.client.xpending_range(self.key, GROUP, "-", "+", 1, consumername=consumer)
        )
        return len(rows)

    async def waiting(self) -> int:
        """Entries not delivered yet (the stream holds these and the pending ones; the
        delayed ones wait apart)."""
        length = int(await self._call(self.client.xlen(self.key)))
        aside = int(await self._call(self._waiting(keys=[self.key])))
        return max(length - await self._pending_or_none(), 0) + aside

    async def pending_or_none(self) -> int:
        """Entries delivered and not settled (0 before the consumer group exists)."""
        return await self._pending_or_none()

    async def _pending_or_none(self) -> int:
        from redis.exceptions import ResponseError

        try:
            return await self.pending()
        except StoreError as exc:
            if isinstance(exc.__cause__, ResponseError) and "NOGROUP" in str(exc):
                return 0
            raise

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead letters, oldest first."""
        rows: Any = await self._call(self.client.xrevrange(self.dead_key, count=limit))
        found = []
        for _, raw in reversed(rows or []):
            fields = {_text(k): _text(v) for k, v in (raw or {}).items()}
            found.append(
                DeadLetter(
                    fields.get("run", ""),
                    fields.get("entry", ""),
                    fields.get("reason", ""),
                    fields.get("detail", ""),
                    fields.get("worker", ""),
                    _number(fields.get("at", "0")),
                )
            )
        return found

    async def depth(self) -> QueueDepth:
        """How many entries wait, are taken and are dead letters, and the oldest wait."""
        return await self._call(admin.depth(self))

    async def entries(self, limit: int = 100) -> list[QueuedRun]:
        """The entries not settled (waiting, delayed, taken), oldest first."""
        return await self._call(admin.entries(self, limit))

    async def revive(self, run_id: str | None = None) -> int:
        """Put the runs of the dead letters (of ``run_id``, or all) back on the queue."""
        return await self._call(admin.revive(self, run_id))

    async def drop(self, run_id: str) -> int:
        """Remove ``run_id``'s entries not taken and its dead letters."""
        return await self._call(admin.drop(self, run_id))

    async def leave(self, consumer: str) -> None:
        """Remove ``consumer`` from the group if it has nothing pending."""
        if await self.pending(consumer) == 0:
            await self._call(self.client.xgroup_delconsumer(self.key, GROUP, consumer))

    async def aclose(self) -> None:
        """Nothing to give back: the store's client serves the queue."""
