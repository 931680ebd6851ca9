"""The Lua scripts of the Redis store: a commit, a new run's creation with its lease, the
lease's acquisition (its reply read by ``read_acquired``), a fence kept and a cancel
request kept. Each runs whole on the server (one atomic step); the store sends the
commit scripts of a batch in one round trip (``_store``), each a ``CommitScript`` whose
reply ``read_reply`` reads.

A commit script's ``KEYS`` are the run's head, commit log, message and turn logs and
blobs, then its cancel request key (``_cancels``), then the keys it reads after those
(the fencing lease; the lease a creation takes). Its ``ARGV``: the commit's fixed
fields (``ARGV[14]``: '1' when it carries the run's cancel request out), its parts from
``ARGV[15]`` on, then the arguments of those last keys."""

from __future__ import annotations

import contextlib
from typing import Any

import attrs

from statekernel.errors import CorruptCheckpoint, StoreError
from statekernel.stores._host.lease_records import redis_holder

__all__ = [
    "ACQUIRE_SCRIPT",
    "COMMIT_SCRIPT",
    "CREATE_LEASED_SCRIPT",
    "KEEP_CANCEL_SCRIPT",
    "KEEP_FENCE_SCRIPT",
    "Acquired",
    "CommitScript",
    "Outcome",
    "Unconfirmed",
    "read_acquired",
    "read_reply",
]

_COUNTS = """local n_m, n_t, n_b = tonumber(ARGV[7]), tonumber(ARGV[9]), tonumber(ARGV[10])
"""
"""How many messages, turns and blobs a commit's ``ARGV`` carries from ``ARGV[15]`` on."""

_WRITE = """redis.call('HSET', KEYS[1], 'r', ARGV[2], 'doc', ARGV[4], 'cid', ARGV[11])
redis.call('RPUSH', KEYS[2], ARGV[5])
local i = 15
for _ = 1, n_m do redis.call('RPUSH', KEYS[3], ARGV[i]); i = i + 1 end
for _ = 1, n_t do redis.call('RPUSH', KEYS[4], ARGV[i]); i = i + 1 end
for _ = 1, n_b do redis.call('HSETNX', KEYS[5], ARGV[i], ARGV[i + 1]); i = i + 2 end
if ARGV[14] == '1' or ARGV[2] == '0' then redis.call('DEL', KEYS[6]) end
redis.call('PUBLISH', ARGV[12], ARGV[13])
"""
"""A commit's writes: the head, its commit log entry, messages, turns and blobs, and its
notice; the run's cancel request goes with the commit that carries it out, and with a
new run's creation (a key its id kept is no request of the new run's)."""

COMMIT_SCRIPT = (
    """
local stored = redis.call('HGET', KEYS[1], 'r')
if stored and tonumber(stored) == tonumber(ARGV[2])
    and redis.call('HGET', KEYS[1], 'cid') == ARGV[11] then
  redis.call('HSET', KEYS[1], 'cid', ARGV[11])  -- a write the WAIT after it counts
  return {0, 1}
end
if #KEYS > 6 and redis.call('GET', KEYS[7]) ~= ARGV[#ARGV] then return {3, 0} end
local expected = tonumber(ARGV[1])
if expected < 0 then
  if stored then return {1, tonumber(stored)} end
else
  if not stored then return {1, -1} end
  if tonumber(stored) ~= expected then return {1, tonumber(stored)} end
  if redis.sha1hex(redis.call('HGET', KEYS[1], 'doc')) ~= ARGV[3] then
    return {1, tonumber(stored)}
  end
  local asked = redis.call('GET', KEYS[6])
  if asked and ARGV[14] ~= '1' then return {4, 0, asked} end
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
"""Land a commit: ``{status, revision found}``, 0 landed (1 in the middle: this very
commit sent again), 1 the head is not the one expected (-1: no head), 2 the logs do not
match the head, 3 the fencing lease ``KEYS[7]`` (when given) does not hold the token
``ARGV[#ARGV]``, 4 the run keeps a cancel request (its bytes third; checked after the
lease and the head)."""

ACQUIRE_SCRIPT = """
if redis.call('EXISTS', KEYS[3]) == 0 then return {2, ''} end
local held = redis.call('GET', KEYS[1])
if held then
  if redis.call('GET', KEYS[4]) == ARGV[3] then return {1, held, ''} end
  return {0, held}
end
local last = #KEYS > 4 and redis.call('GET', KEYS[5]) or ''
local given = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(string.match(last, '^(%d+)/') or '-1') ~= given then last = '' end
local token = redis.call('INCR', KEYS[2]) .. '/' .. ARGV[1]
redis.call('PERSIST', KEYS[2])
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[2])
if #KEYS > 4 then redis.call('SET', KEYS[5], token) end
return {1, token, last}
"""
"""Give the lease ``KEYS[1]`` of the run whose head is ``KEYS[3]`` to ``ARGV[1]`` for
``ARGV[2]`` ms with the next token of its fence counter ``KEYS[2]``, which never expires
(a counter a release of an older layout left expiring is made to last). ``ARGV[3]`` is
the call's nonce, kept in ``KEYS[4]``: the same call sent again after a cut connection
(its first send may have taken the lease) is given the lease it took, not ``RunBusy``.

``KEYS[5]`` (``last``) keeps the token of the lease last given until it is given back
(``RELEASE``), without expiry: a lease key that is gone while it is there expired in
its holder's hands, and the reply's third item is that token (the lease taken over;
'' when the lease was free, or ``last`` is not the counter's latest token: written by
a client that did not keep it). Replies ``{status, token, taken over}``: 0 busy (the
holder's token), 1 taken (the same call sent again: the lease it took, '' third),
2 no such run."""

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
    if redis.call('GET', KEYS[9]) ~= ARGV[#ARGV] then return {0, 1, ''} end
    return {0, 1, redis.call('GET', KEYS[7]) or ''}
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
    + """if redis.call('EXISTS', KEYS[7]) == 1 then return {0, 0, ''} end  -- a lease the id kept
local token = redis.call('INCR', KEYS[8]) .. '/' .. ARGV[#ARGV - 2]
redis.call('PERSIST', KEYS[8])
redis.call('SET', KEYS[7], token, 'PX', ARGV[#ARGV - 1])
redis.call('SET', KEYS[9], ARGV[#ARGV], 'PX', ARGV[#ARGV - 1])
if #KEYS > 9 then redis.call('SET', KEYS[10], token) end
return {0, 0, token}
"""
)
"""``COMMIT_SCRIPT`` for a new run (revision 0) that takes its lease with it
(``CreatesLeased``): ``KEYS[7..10]`` and the last three ``ARGV`` are ``ACQUIRE_SCRIPT``'s
lease key, fence counter, nonce key and ``last``, and its owner, ms and nonce. Replies
``{status, revision found, token}``: 0 created (1 in the middle: this very creation sent
again, with the lease it took if that is still the lease: the nonce says), 1 the id has
a run, 2 its logs do not match. The token
is empty when the id kept a lease key (a run deleted while held): the run is created
without its lease."""

KEEP_CANCEL_SCRIPT = """
local doc = redis.call('HGET', KEYS[1], 'doc')
if not doc then return {0, ''} end
local kept = redis.call('GET', KEYS[2])
if kept then return {1, kept} end
if redis.sha1hex(doc) ~= ARGV[1] then return {2, doc} end
if ARGV[2] == '1' then return {3, ''} end
redis.call('SET', KEYS[2], ARGV[3])
return {4, ''}
"""
"""Keep the cancel request ``ARGV[3]`` in ``KEYS[2]`` for the run whose head is ``KEYS[1]``
while that head is the one whose SHA-1 is ``ARGV[1]`` (``ARGV[2]``: '1' when its state
keeps no request). Replies ``{status, bytes}``: 0 no such run, 1 a request is kept (its
bytes; it stays), 2 the head is another (its document: check its state, send again),
3 the run is at rest (nothing kept), 4 kept."""

Outcome = tuple[int, int, bool, str, bytes | None]
"""Of a commit script: its status, the revision it found, whether it was announced, the
lease token a creating script replied ('' for a commit), the cancel request refusing it."""


@attrs.frozen
class CommitScript:
    """A commit script waiting for its round trip (``lua``: the registered script, the
    commit's or a new run's creation with its lease)."""

    run_id: str
    revision: int
    cid: str
    keys: list[str]
    args: list[Any]
    lua: Any


class Unconfirmed(StoreError):
    """A new run's creation whose replicas were not confirmed, with the token of the lease
    it took (given back by ``create_leased``)."""

    def __init__(self, message: str, token: str) -> None:
        super().__init__(message)
        self.token = token


@attrs.frozen
class Acquired:
    """An ``ACQUIRE_SCRIPT`` reply, read: ``status`` (0 busy, 1 taken, 2 no such run),
    the token (the holder's, busy) and its owner, and ``taken_from``, the owner whose
    lease was taken over (None: the lease was free, or the taker's own)."""

    status: int
    token: str = ""
    holder: str = ""
    taken_from: str | None = None


def read_acquired(reply: Any, owner: str, run_id: str, where: str) -> Acquired:
    """The ``ACQUIRE_SCRIPT`` reply of ``owner``'s call; ``CorruptCheckpoint`` for a lease
    key that cannot be read. A ``last`` token that cannot be read tells no takeover."""
    status = int(reply[0])
    if status == 2:
        return Acquired(status)
    token, holder = redis_holder(reply[1], run_id, where)
    was: str | None = None
    if status == 1 and len(reply) > 2 and reply[2]:
        with contextlib.suppress(CorruptCheckpoint):
            was = redis_holder(reply[2], run_id, where)[1]
    return Acquired(status, token, holder, None if was == owner else was)


def read_reply(reply: Any) -> tuple[int, int, str, bytes | None]:
    """A commit script's reply: its status, the revision it found, the lease token a
    creation replied ('' for a commit) and the cancel request refusing it (status 4)."""
    status, actual = int(reply[0]), int(reply[1])
    found = reply[2] if len(reply) > 2 else b""
    if status == 4:
        return status, actual, "", found.encode() if isinstance(found, str) else bytes(found)
    return status, actual, found.decode() if isinstance(found, bytes) else str(found), None
