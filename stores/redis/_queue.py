"""Run queues: a Redis Stream per queue, consumed by workers through one consumer group.

Keys (the queue name is the hash tag, so a queue's keys share one Cluster slot):
``<prefix>:queue:{name}`` (the stream; each entry names a run: fields ``run`` and
``at``, the submit time in ms), ``<prefix>:queue:{name}:delayed`` (entries submitted
with a delay: a sorted set scored by when they are due, on the server's clock, moved to
the stream by a read once due, in one script) and ``<prefix>:queue:{name}:dead``
(failures: runs that ended ``failed`` and entries that could not be driven, capped at
about 10,000).
Entries are deleted once acknowledged, so the stream holds only work not yet done:
new entries and the consumer group's pending list.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from statekernel._secrets import redact
from statekernel._storage.queues import DeadLetter, QueueEntry, checked_queue_name
from statekernel.errors import StoreError
from statekernel.stores.redis._fencing import RedisBacked
from statekernel.stores.redis._wire import FAILURES, transaction

__all__ = ["GROUP", "RedisRunQueue"]

T = TypeVar("T")
GROUP = "workers"
DEAD_MAXLEN = 10_000


_NOW_MS = "local t = redis.call('TIME')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

DELAY_SCRIPT = (
    _NOW_MS
    + """redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
return ARGV[2]"""
)
"""Keep a delayed entry (``ARGV[2]``: its JSON) until ``ARGV[1]`` ms from now."""

DUE_SCRIPT = (
    _NOW_MS
    + """local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, ARGV[1])
for _, member in ipairs(due) do
  local entry = cjson.decode(member)
  redis.call('XADD', KEYS[1], '*', 'run', entry[1], 'at', entry[2])
  redis.call('ZREM', KEYS[2], member)
end
return #due"""
)
"""Move up to ``ARGV[1]`` delayed entries that are due to the stream, in order."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(item: Any, deliveries: int = 1) -> QueueEntry:
    entry_id, fields = item
    fields = {_text(k): _text(v) for k, v in (fields or {}).items()}
    at = _number(fields.get("at", "0"))
    return QueueEntry(_text(entry_id), fields.get("run", ""), at, deliveries)


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
        self._delay = self.client.register_script(DELAY_SCRIPT)
        self._due = self.client.register_script(DUE_SCRIPT)

    async def _call(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except FAILURES as exc:
            raise StoreError(redact(f"queue {self.name!r}: {type(exc).__name__}: {exc}")) from exc

    async def submit(
        self, run_id: str, submitted_ms: int | None = None, *, delay_ms: int = 0
    ) -> str:
        """Append an entry for ``run_id`` (kept aside until ``delay_ms`` from now, on the
        server's clock); returns the entry id (a delayed entry's: ``delayed-<uuid>``)."""
        at = submitted_ms if submitted_ms is not None else int(time.time() * 1000)
        if delay_ms > 0:
            entry_id = f"delayed-{uuid.uuid4().hex}"
            member = json.dumps([run_id, at, entry_id], ensure_ascii=False)
            await self._call(self._delay(keys=[self.delayed_key], args=[delay_ms, member]))
            return entry_id
        fields: dict[Any, Any] = {"run": run_id, "at": at}
        return _text(await self._call(self.client.xadd(self.key, fields)))

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
        await self._call(self._due(keys=[self.key, self.delayed_key], args=[count]))
        streams: dict[Any, Any] = {self.key: ">"}
        reply: Any = await self._call(
            self.client.xreadgroup(GROUP, consumer, streams, count=count, block=block_ms)
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

    async def ack(self, entry: QueueEntry) -> None:
        """Acknowledge and delete an entry: its run is at rest."""
        pipe = await self._call(transaction(self.client))
        pipe.xack(self.key, GROUP, entry.id)
        pipe.xdel(self.key, entry.id)
        await self._call(pipe.execute())

    async def requeue(self, entry: QueueEntry) -> str:
        """Replace an entry by a new one at the end of the queue, atomically."""
        fields: dict[Any, Any] = {"run": entry.run_id, "at": entry.submitted_ms}
        pipe = await self._call(transaction(self.client))
        pipe.xadd(self.key, fields)
        pipe.xack(self.key, GROUP, entry.id)
        pipe.xdel(self.key, entry.id)
        new_id, *_ = await self._call(pipe.execute())
        return _text(new_id)

    async def dead(self, entry: QueueEntry, reason: str, detail: str, worker: str) -> None:
        """Record a failure on the dead-letter stream and acknowledge the entry, atomically."""
        fields: dict[Any, Any] = {"run": entry.run_id, "entry": entry.id, "reason": reason}
        fields |= {"detail": detail[:2000], "worker": worker, "at": int(time.time() * 1000)}
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
        delayed = int(await self._call(self.client.zcard(self.delayed_key)))
        return max(length - await self._pending_or_none(), 0) + delayed

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

    async def leave(self, consumer: str) -> None:
        """Remove ``consumer`` from the group if it has nothing pending."""
        if await self.pending(consumer) == 0:
            await self._call(self.client.xgroup_delconsumer(self.key, GROUP, consumer))

    async def aclose(self) -> None:
        """Nothing to give back: the store's client serves the queue."""
