"""The Lua scripts of a Redis run queue's delayed and keyed entries (``_queue``).

Keys of queue ``name`` (one hash tag, one Cluster slot): the stream ``Q``
(``<prefix>:queue:{name}``), ``Q:delayed`` (a sorted set of delayed entries scored by
when they are due, in ms on the server's clock), ``Q:keys`` (the keys with entries
waiting, scored by when their first one came), ``Q:kq:<key>`` (a list per key of its
waiting entries, oldest first) and ``Q:busy`` (a hash: a key's entries in flight, moved
to the stream and not settled). A waiting entry is the JSON ``[run, at, id, key,
limit]`` (``key`` null for an entry without one), followed by ``traceparent`` and
``tracestate`` (null: none) for an entry with a trace context; moved to the stream, these
are its fields ``tp`` and ``ts``.

A read first runs ``READY``: due delayed entries go to the stream (or to their key's
list), then each waiting key's oldest entries go to the stream while fewer than their
limit of that key are in flight. Settling a keyed entry (``SETTLE``) gives its place
back once (only when ``XACK`` acknowledged it: an entry settled twice counts once).
"""

from __future__ import annotations

__all__ = ["DELAY", "GROUP", "KEYED", "READY", "SETTLE", "WAITING"]

GROUP = "workers"
"""The consumer group of every queue's workers."""

_NOW_MS = "local t = redis.call('TIME')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

DELAY = (
    _NOW_MS
    + """redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
return 1"""
)
"""``KEYS[1]`` delayed; keep the entry ``ARGV[2]`` until ``ARGV[1]`` ms from now."""

_WAIT_KEYED = """
local function wait_keyed(entry, member)
  local list = KEYS[1] .. ':kq:' .. entry[4]
  redis.call('RPUSH', list, member)
  redis.call('ZADD', KEYS[1] .. ':keys', 'NX', now, entry[4])
end
"""

_TO_STREAM = """
local function to_stream(entry, key)
  local fields = {'run', entry[1], 'at', entry[2]}
  if key then
    fields[#fields + 1] = 'key'
    fields[#fields + 1] = key
    fields[#fields + 1] = 'limit'
    fields[#fields + 1] = entry[5]
  end
  if type(entry[6]) == 'string' then
    fields[#fields + 1] = 'tp'
    fields[#fields + 1] = entry[6]
    if type(entry[7]) == 'string' then
      fields[#fields + 1] = 'ts'
      fields[#fields + 1] = entry[7]
    end
  end
  redis.call('XADD', KEYS[1], '*', unpack(fields))
end
"""

KEYED = (
    _NOW_MS
    + _WAIT_KEYED
    + """wait_keyed(cjson.decode(ARGV[1]), ARGV[1])
return 1"""
)
"""``KEYS[1]`` the stream; put the keyed entry ``ARGV[1]`` at the end of its key's list."""

READY = (
    _NOW_MS
    + _WAIT_KEYED
    + _TO_STREAM
    + """local due = redis.call('ZRANGEBYSCORE', KEYS[1] .. ':delayed', '-inf', now,
  'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local entry = cjson.decode(member)
  if entry[4] == cjson.null then
    to_stream(entry, nil)
  else
    wait_keyed(entry, member)
  end
  redis.call('ZREM', KEYS[1] .. ':delayed', member)
end
local moved = 0
local busy_key = KEYS[1] .. ':busy'
for _, key in ipairs(redis.call('ZRANGE', KEYS[1] .. ':keys', 0, tonumber(ARGV[2]) - 1)) do
  local list = KEYS[1] .. ':kq:' .. key
  local busy = tonumber(redis.call('HGET', busy_key, key) or '0')
  local before = busy
  while moved < tonumber(ARGV[1]) do
    local head = redis.call('LINDEX', list, 0)
    if not head then break end
    local entry = cjson.decode(head)
    if busy >= tonumber(entry[5]) then break end
    redis.call('LPOP', list)
    to_stream(entry, key)
    busy = busy + 1
    moved = moved + 1
  end
  if busy ~= before then redis.call('HSET', busy_key, key, busy) end
  if redis.call('LLEN', list) == 0 then redis.call('ZREM', KEYS[1] .. ':keys', key) end
end
return moved"""
)
"""``KEYS[1]`` the stream; move up to ``ARGV[1]`` due delayed entries, then up to
``ARGV[1]`` keyed entries of the first ``ARGV[2]`` waiting keys, to the stream."""

SETTLE = (
    _NOW_MS
    + _WAIT_KEYED
    + """local key = ARGV[3]
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  local left = redis.call('HINCRBY', KEYS[1] .. ':busy', key, -1)
  if left <= 0 then redis.call('HDEL', KEYS[1] .. ':busy', key) end
end
redis.call('XDEL', KEYS[1], ARGV[2])
if ARGV[4] == 'dead' then
  redis.call('XADD', KEYS[1] .. ':dead', 'MAXLEN', '~', ARGV[5], '*', unpack(ARGV, 6))
elseif ARGV[4] == 'requeue' then
  wait_keyed(cjson.decode(ARGV[5]), ARGV[5])
end
return 1"""
)
"""``KEYS[1]`` the stream; settle the keyed entry ``ARGV[2]`` (of key ``ARGV[3]``) of
group ``ARGV[1]``: ``ARGV[4]`` ``ack``, ``dead`` (cap ``ARGV[5]``, the dead letter's
fields after it) or ``requeue`` (``ARGV[5]``: the entry waiting again)."""

WAITING = """local n = redis.call('ZCARD', KEYS[1] .. ':delayed')
for _, key in ipairs(redis.call('ZRANGE', KEYS[1] .. ':keys', 0, -1)) do
  n = n + redis.call('LLEN', KEYS[1] .. ':kq:' .. key)
end
return n"""
"""``KEYS[1]`` the stream; the delayed entries and the keyed ones waiting for their turn."""
