"""What an operator does with a Redis run queue (``_queue``): list the queues, look at
their depth and entries, put dead letters back, drop entries.

The queues are found by scanning the keys of the store's prefix (every primary of a
cluster). Looking is not one snapshot: the counts and entries are read one after the
other. Changing is atomic: a script checks each entry (a stream entry not delivered,
a delayed or keyed one still waiting, a dead letter still there) and moves or removes it
in one step, so an entry a worker took meanwhile is left to it, and a dead letter put
back twice at once comes back once.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Protocol

from statekernel._storage.queues import QueueDepth, QueuedRun
from statekernel.stores.redis._queue_scripts import GROUP


class Inspected(Protocol):
    """What these functions need of a ``_queue.RedisRunQueue``."""

    name: str
    key: str
    dead_key: str
    delayed_key: str

    @property
    def client(self) -> Any:
        """The store's client."""
        ...

    async def waiting(self) -> int:
        """Entries not delivered yet."""
        ...

    async def pending_or_none(self) -> int:
        """Entries delivered and not settled (0 without a consumer group)."""
        ...


__all__ = [
    "DROP",
    "REVIVE",
    "Inspected",
    "depth",
    "drop",
    "entries",
    "loose_text",
    "queue_names",
    "revive",
]

PAGE = 1000
"""Stream entries read per round trip while looking for a run's entries."""

REVIVE = """local seen = {}
local n = 0
for i = 2, #ARGV, 4 do
  if redis.call('XDEL', KEYS[2], ARGV[i]) == 1 and not seen[ARGV[i + 1]] then
    seen[ARGV[i + 1]] = true
    local fields = {'run', ARGV[i + 1], 'at', ARGV[1]}
    if ARGV[i + 2] ~= '' then
      fields[#fields + 1] = 'tp'
      fields[#fields + 1] = ARGV[i + 2]
      if ARGV[i + 3] ~= '' then
        fields[#fields + 1] = 'ts'
        fields[#fields + 1] = ARGV[i + 3]
      end
    end
    redis.call('XADD', KEYS[1], '*', unpack(fields))
    n = n + 1
  end
end
return n"""
"""``KEYS[1]`` the stream, ``KEYS[2]`` its dead letters; ``ARGV[1]`` the submit time,
then for each dead letter its id, its run, and its entry's ``traceparent`` and
``tracestate`` ('' for none): each dead letter still there is removed, and its run gets
one new entry (once per run) with that trace context."""

DROP = """local found = cjson.decode(ARGV[2])
local n = 0
for _, id in ipairs(found.stream) do
  local taken = redis.pcall('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if taken.err or #taken == 0 then
    n = n + redis.call('XDEL', KEYS[1], id)
  end
end
for _, member in ipairs(found.delayed) do
  n = n + redis.call('ZREM', KEYS[1] .. ':delayed', member)
end
for _, pair in ipairs(found.keyed) do
  local list = KEYS[1] .. ':kq:' .. pair[1]
  n = n + redis.call('LREM', list, 0, pair[2])
  if redis.call('LLEN', list) == 0 then redis.call('ZREM', KEYS[1] .. ':keys', pair[1]) end
end
for _, id in ipairs(found.dead) do
  n = n + redis.call('XDEL', KEYS[1] .. ':dead', id)
end
return n"""
"""``KEYS[1]`` the stream; ``ARGV[1]`` the consumer group, ``ARGV[2]`` JSON of what was
found of a run: stream entry ids (removed unless delivered), delayed and keyed members,
dead letter ids. The number removed (a stream without a consumer group has delivered
nothing)."""

_NAME = re.compile(r":queue:\{([^}]*)\}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value: Any) -> int:
    text = _text(value)
    return int(text) if text.isdigit() else 0


def _client(queue: Inspected) -> Any:
    """The queue's client, untyped (its replies are read as they come)."""
    return queue.client


def loose_text(value: Any) -> str:
    """A trace context field as text (bytes that are not UTF-8 with replacement
    characters: a worker ignores a trace context that does not parse)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _fields(raw: Any) -> dict[str, str]:
    fields = {_text(k): v for k, v in (raw or {}).items()}
    return {k: loose_text(v) if k in ("tp", "ts") else _text(v) for k, v in fields.items()}


async def queue_names(client: Any, prefix: str) -> list[str]:
    """The names of the queues of ``prefix`` with any key (entries, dead letters)."""
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + ":queue:{*}*"
    names: set[str] = set()
    async for key in client.scan_iter(match=pattern, count=PAGE):
        match = _NAME.search(_text(key)[len(prefix) :])
        if match:
            names.add(match.group(1))
    return sorted(names)


async def _group(queue: Inspected) -> tuple[str, dict[str, tuple[str, int]]]:
    """The group's last delivered id (``0-0`` without a group) and its pending entries:
    id -> (consumer, deliveries)."""
    from redis.exceptions import ResponseError

    try:
        groups = await _client(queue).xinfo_groups(queue.key)
    except ResponseError:  # no stream yet
        return "0-0", {}
    group = next((g for g in groups if _text(g.get("name")) == GROUP), None)
    if group is None:
        return "0-0", {}
    rows = await _client(queue).xpending_range(queue.key, GROUP, "-", "+", 10_000)
    taken = {
        _text(r["message_id"]): (_text(r["consumer"]), int(r["times_delivered"])) for r in rows
    }
    return _text(group.get("last-delivered-id", "0-0")), taken


def _after(entry_id: str, last: str) -> bool:
    ms, _, seq = entry_id.partition("-")
    last_ms, _, last_seq = last.partition("-")
    return (int(ms), int(seq or 0)) > (int(last_ms), int(last_seq or 0))


async def _aside(queue: Inspected, limit: int) -> list[QueuedRun]:
    """The delayed entries, then the keyed ones waiting for their turn."""
    found = []
    for member in await _client(queue).zrange(queue.delayed_key, 0, limit - 1):
        run_id, at, entry_id, key = json.loads(_text(member))[:4]  # a trace context after
        found.append(QueuedRun(entry_id, run_id, int(at), 0, "delayed", None, key))
    for key in await _client(queue).zrange(queue.key + ":keys", 0, limit - 1):
        listed = await _client(queue).lrange(f"{queue.key}:kq:{_text(key)}", 0, limit - 1)
        for member in listed:
            run_id, at, entry_id, key_ = json.loads(_text(member))[:4]
            found.append(QueuedRun(entry_id, run_id, int(at), 0, "waiting", None, key_))
    return found


async def entries(queue: Inspected, limit: int) -> list[QueuedRun]:
    """Up to ``limit`` entries not settled, oldest first."""
    last, taken = await _group(queue)
    found = []
    for entry_id, raw in await _client(queue).xrange(queue.key, count=limit):
        entry_id, fields = _text(entry_id), _fields(raw)
        consumer, deliveries = taken.get(entry_id, (None, 0))
        if consumer is None and not _after(entry_id, last):
            continue  # settled meanwhile
        state = "waiting" if consumer is None else "taken"
        at, key = _number(fields.get("at", "0")), fields.get("key")
        found.append(
            QueuedRun(entry_id, fields.get("run", ""), at, deliveries, state, consumer, key)
        )
    found += await _aside(queue, limit)
    found.sort(key=lambda e: e.submitted_ms)
    return found[:limit]


async def depth(queue: Inspected) -> QueueDepth:
    """The counts, and the oldest entry that could be taken now (in the stream and not
    delivered, or first of its key's list)."""
    waiting, taken = await queue.waiting(), await queue.pending_or_none()
    dead = int(await _client(queue).xlen(queue.dead_key))
    last, _ = await _group(queue)
    oldest: list[int] = []
    first = await _client(queue).xrange(queue.key, min=f"({last}", count=1)
    oldest += [_number(_fields(raw).get("at", "0")) for _, raw in first]
    for key in await _client(queue).zrange(queue.key + ":keys", 0, 99):
        head = await _client(queue).lindex(f"{queue.key}:kq:{_text(key)}", 0)
        if head is not None:
            oldest.append(int(json.loads(_text(head))[1]))
    return QueueDepth(queue.name, waiting, taken, dead, min(oldest) if oldest else None)


async def _dead_ids(queue: Inspected, run_id: str | None) -> list[tuple[str, str, str, str]]:
    """(id, run, traceparent, tracestate) of the dead letters (of ``run_id``, or all;
    '' for a trace context they do not have)."""
    rows = await _client(queue).xrange(queue.dead_key)
    found = []
    for i, raw in rows:
        fields = _fields(raw)
        run, tp, ts = fields.get("run", ""), fields.get("tp", ""), fields.get("ts", "")
        if run_id is None or run == run_id:
            found.append((_text(i), run, tp, ts if tp else ""))
    return found


async def revive(queue: Inspected, run_id: str | None) -> int:
    """Dead letters (of ``run_id``, or all) back on the queue, one entry per run, with
    the trace context of its entry."""
    letters = await _dead_ids(queue, run_id)
    if not letters:
        return 0
    args: list[Any] = [int(time.time() * 1000)]
    args += [part for letter in letters for part in letter]
    script = _client(queue).register_script(REVIVE)
    return int(await script(keys=[queue.key, queue.dead_key], args=args))


async def drop(queue: Inspected, run_id: str) -> int:
    """Remove ``run_id``'s entries not delivered, waiting aside, and its dead letters."""
    stream: list[str] = []
    start = "-"
    while True:
        rows = await _client(queue).xrange(queue.key, min=start, count=PAGE)
        stream += [_text(i) for i, raw in rows if _fields(raw).get("run") == run_id]
        if len(rows) < PAGE:
            break
        start = "(" + _text(rows[-1][0])
    delayed = [
        _text(m)
        for m in await _client(queue).zrange(queue.delayed_key, 0, -1)
        if json.loads(_text(m))[0] == run_id
    ]
    keyed = []
    for key in await _client(queue).zrange(queue.key + ":keys", 0, -1):
        for member in await _client(queue).lrange(f"{queue.key}:kq:{_text(key)}", 0, -1):
            if json.loads(_text(member))[0] == run_id:
                keyed.append([_text(key), _text(member)])
    dead = [letter[0] for letter in await _dead_ids(queue, run_id)]
    if not (stream or delayed or keyed or dead):
        return 0
    found = json.dumps(
        {"stream": stream, "delayed": delayed, "keyed": keyed, "dead": dead}, ensure_ascii=False
    )
    script = _client(queue).register_script(DROP)
    return int(await script(keys=[queue.key], args=[GROUP, found]))
