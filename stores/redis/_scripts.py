"""The Lua scripts of the Redis store: a commit, a new run's creation with its lease, the
lease's acquisition and a fence kept. Each runs whole on the server (one atomic step);
the store sends the commit scripts of a batch in one round trip (``_store``)."""

from __future__ import annotations

__all__ = ["ACQUIRE_SCRIPT", "COMMIT_SCRIPT", "CREATE_LEASED_SCRIPT", "KEEP_FENCE_SCRIPT"]

_COUNTS = """local n_m, n_t, n_b = tonumber(ARGV[7]), tonumber(ARGV[9]), tonumber(ARGV[10])
"""
"""How many messages, turns and blobs a commit's ``ARGV`` carries from ``ARGV[14]`` on."""

_WRITE = """redis.call('HSET', KEYS[1], 'r', ARGV[2], 'doc', ARGV[4], 'cid', ARGV[11])
redis.call('RPUSH', KEYS[2], ARGV[5])
local i = 14
for _ = 1, n_m do redis.call('RPUSH', KEYS[3], ARGV[i]); i = i + 1 end
for _ = 1, n_t do redis.call('RPUSH', KEYS[4], ARGV[i]); i = i + 1 end
for _ = 1, n_b do redis.call('HSETNX', KEYS[5], ARGV[i], ARGV[i + 1]); i = i + 2 end
redis.call('PUBLISH', ARGV[12], ARGV[13])
"""
"""A commit's writes: the head, its commit log entry, messages, turns and blobs, and its
notice."""

COMMIT_SCRIPT = (
    """
local stored = redis.call('HGET', KEYS[1], 'r')
if stored and tonumber(stored) == tonumber(ARGV[2])
    and redis.call('HGET', KEYS[1], 'cid') == ARGV[11] then
  redis.call('HSET', KEYS[1], 'cid', ARGV[11])  -- a write the WAIT after it counts
  return {0, 1}
end
if #KEYS > 5 and redis.call('GET', KEYS[6]) ~= ARGV[#ARGV] then return {3, 0} end
local expected = tonumber(ARGV[1])
if expected < 0 then
  if stored then return {1, tonumber(stored)} end
else
  if not stored then return {1, -1} end
  if tonumber(stored) ~= expected then return {1, tonumber(stored)} end
  if redis.sha1hex(redis.call('HGET', KEYS[1], 'doc')) ~= ARGV[3] then
    return {1, tonumber(stored)}
  end
end
"""
    + _COUNTS
    + """if redis.call('LLEN', KEYS[2]) ~= tonumber(ARGV[2])
    or redis.call('LLEN', KEYS[3]) ~= tonumber(ARGV[6])
    or redis.call('LLEN', KEYS[4]) ~= tonumber(ARGV[8]) then
  return {2, 0}
end
"""
    + _WRITE
    + """return {0, 0}
"""
)

ACQUIRE_SCRIPT = """
if redis.call('EXISTS', KEYS[3]) == 0 then return {2, ''} end
local held = redis.call('GET', KEYS[1])
if held then
  if redis.call('GET', KEYS[4]) == ARGV[3] then return {1, held} end
  return {0, held}
end
local token = redis.call('INCR', KEYS[2]) .. '/' .. ARGV[1]
redis.call('PERSIST', KEYS[2])
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[2])
return {1, token}
"""
"""Give the lease ``KEYS[1]`` of the run whose head is ``KEYS[3]`` to ``ARGV[1]`` for
``ARGV[2]`` ms with the next token of its fence counter ``KEYS[2]``, which never expires
(a counter a release of an older layout left expiring is made to last). ``ARGV[3]`` is
the call's nonce, kept in ``KEYS[4]``: the same call sent again after a cut connection
(its first send may have taken the lease) is given the lease it took, not ``RunBusy``."""

KEEP_FENCE_SCRIPT = """
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
local given = tonumber(redis.call('GET', KEYS[1]) or '0')
if given < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""
"""Raise the fence counter ``KEYS[1]`` of the run whose head is ``KEYS[2]`` to at least
``ARGV[1]`` (-1: no such run)."""

CREATE_LEASED_SCRIPT = (
    """
local stored = redis.call('HGET', KEYS[1], 'r')
if stored then
  if tonumber(stored) == 0 and redis.call('HGET', KEYS[1], 'cid') == ARGV[11] then
    redis.call('HSET', KEYS[1], 'cid', ARGV[11])  -- a write the WAIT after it counts
    if redis.call('GET', KEYS[8]) ~= ARGV[#ARGV] then return {0, 1, ''} end
    return {0, 1, redis.call('GET', KEYS[6]) or ''}
  end
  return {1, tonumber(stored), ''}
end
"""
    + _COUNTS
    + """if redis.call('LLEN', KEYS[2]) ~= 0 or redis.call('LLEN', KEYS[3]) ~= tonumber(ARGV[6])
    or redis.call('LLEN', KEYS[4]) ~= tonumber(ARGV[8]) then
  return {2, 0, ''}
end
"""
    + _WRITE
    + """if redis.call('EXISTS', KEYS[6]) == 1 then return {0, 0, ''} end  -- a lease the id kept
local token = redis.call('INCR', KEYS[7]) .. '/' .. ARGV[#ARGV - 2]
redis.call('PERSIST', KEYS[7])
redis.call('SET', KEYS[6], token, 'PX', ARGV[#ARGV - 1])
redis.call('SET', KEYS[8], ARGV[#ARGV], 'PX', ARGV[#ARGV - 1])
return {0, 0, token}
"""
)
"""``COMMIT_SCRIPT`` for a new run (revision 0) that takes its lease with it
(``CreatesLeased``): ``KEYS[6..8]`` and the last three ``ARGV`` are ``ACQUIRE_SCRIPT``'s
lease key, fence counter and nonce key, and its owner, ms and nonce. Replies
``{status, revision found, token}``: 0 created (1 in the middle: this very creation sent
again, with the lease it took if that is still the lease: the nonce says), 1 the id has
a run, 2 its logs do not match. The token
is empty when the id kept a lease key (a run deleted while held): the run is created
without its lease."""
