"""What a write of the Redis store waits for before it is acknowledged: its replicas.

Redis replicates asynchronously: a primary answers a write before any replica has it,
and a failover promotes a replica that may lack the last writes, rolling them back. So
a commit, and the taking or renewal of a lease (which hands out or extends a fencing
token), is acknowledged only once as many replicas as asked for have it: the script is
followed by ``WAIT <replicas> <timeout>`` on the same connection, to the same server.

How many: ``?replicas=N`` in the store's URL; by default 1 for a key whose Redis Cluster
shard has a replica (as the client's slot map says), else 0 (and 0 on one server, whose
failover statekernel does not drive). ``?replica_timeout=ms`` bounds the wait
(``REPLICA_TIMEOUT_MS``). A write that fewer replicas confirm in time, or whose ``WAIT``
fails, has an ambiguous outcome: it may be rolled back by a failover, or not. It raises
``StoreError``, the error of a commit cut midway, and the kernel settles it by loading
the run. A commit is doubted from the moment it is sent until it is refused or its
replicas confirm it; the store's next load or commit of a run whose commit it doubts
first confirms that commit (a same-value write to the run's head, then ``WAIT``), or
finds the head is another commit, and raises ``StoreError`` while it can do neither: no
commit is settled as landed before the replicas asked for have it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import attrs

from statekernel.errors import StoreError
from statekernel.stores.redis._wire import Command, Wire, initialized

__all__ = [
    "CONFIRM_SCRIPT",
    "OPTION_NAMES",
    "REPLICA_TIMEOUT_MS",
    "ReplicaOptions",
    "Replication",
    "options_of",
]

REPLICA_TIMEOUT_MS = 1000
"""How long a write waits for its replicas unless the URL says (``replica_timeout``)."""

OPTION_NAMES = ("replicas", "replica_timeout")
"""The URL query options read here (not passed on to ``redis-py``)."""

CONFIRM_SCRIPT = """
if redis.call('HGET', KEYS[1], 'cid') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'cid', ARGV[1])
return 1
"""
"""Whether the run's head is still the commit ``ARGV[1]``; if so, a write of the same
value that the ``WAIT`` after it counts (replicas that have it have the commit too)."""


@attrs.frozen
class ReplicaOptions:
    """How many replicas must have a write (None: 1 where the shard has one, else 0)
    and how long to wait for them, in milliseconds."""

    count: int | None = None
    timeout_ms: int = REPLICA_TIMEOUT_MS


def options_of(query: Sequence[tuple[str, str]]) -> ReplicaOptions:
    """The replica options of a URL's query; ``ValueError`` naming a bad one."""
    found = dict(query)
    count = found.get("replicas")
    timeout = found.get("replica_timeout", str(REPLICA_TIMEOUT_MS))
    if count is not None and not (count.isascii() and count.isdigit()):
        raise ValueError(f"replicas={count!r}: expected a number of replicas (0 or more)")
    if not (timeout.isascii() and timeout.isdigit()) or int(timeout) == 0:
        raise ValueError(f"replica_timeout={timeout!r}: expected milliseconds (1 or more)")
    return ReplicaOptions(None if count is None else int(count), int(timeout))


@attrs.frozen
class _Doubt:
    """A commit whose replicas were not confirmed: the run's head key, the commit's id
    and its revision."""

    head_key: str
    cid: str
    revision: int


class Replication:
    """Writes of one store followed by ``WAIT``, and the commits it still doubts.

    ``where`` names the store in errors (its URL, redacted).
    """

    def __init__(self, client: Any, wire: Wire, options: ReplicaOptions, where: str) -> None:
        self._client = client
        self.wire = wire
        self.options = options
        self._where = where
        self._doubts: dict[str, _Doubt] = {}

    async def wanted(self, key: str) -> int:
        """How many replicas must have a write of ``key``."""
        if self.options.count is not None:
            return self.options.count
        if not self.wire.cluster:
            return 0
        await initialized(self._client)
        return 0 if self._client.get_node_from_key(key, replica=True) is None else 1

    def _wait(self, count: int) -> Command:
        return ("WAIT", count, self.options.timeout_ms)

    def _short(self, reply: Any, count: int) -> str | None:
        """Why the write is not known to be on ``count`` replicas (``reply``: of its
        ``WAIT``); None when it is."""
        if isinstance(reply, Exception):
            return f"WAIT failed ({type(reply).__name__}: {reply})"
        if isinstance(reply, int) and reply >= count:
            return None
        return f"{reply} of {count} replicas had it within {self.options.timeout_ms} ms"

    def error(self, what: str, short: str) -> StoreError:
        """The ``StoreError`` of a write (``what``) whose replicas are not confirmed."""
        return StoreError(
            f"Redis store {self._where!r}: {what}: {short}; a failover may roll it back,"
            " or not (outcome unknown)"
        )

    async def written(
        self, key: str, commands: Sequence[Command], count: int
    ) -> tuple[list[Any], str | None]:
        """Send ``commands`` (writes of ``key``'s slot) to the server of ``key``, then
        wait for ``count`` replicas to have them: their replies, and why they are not
        known to be on those replicas (None when they are, or ``count`` is 0)."""
        if count == 0:
            return await self.wire.on_node(key, commands), None
        replies = await self.wire.on_node(key, [*commands, self._wait(count)])
        return replies[:-1], self._short(replies[-1], count)

    async def script(self, script: Any, keys: list[str], args: list[Any]) -> tuple[Any, str | None]:
        """Run a registered script on ``keys`` (of one slot): its result, and why its
        writes are not known to be on the replicas asked for (None when they are)."""
        count = await self.wanted(keys[0])
        if count == 0:
            return await script(keys=keys, args=args), None
        command = ("EVAL", script.script, len(keys), *keys, *args)
        replies, short = await self.written(keys[0], [command], count)
        if isinstance(replies[0], Exception):
            raise replies[0]
        return replies[0], short

    async def round_trip(
        self, lead: list[Command], scripts: list[tuple[str, Command]]
    ) -> tuple[list[Any], list[Any], list[str | None]]:
        """Send ``lead`` (commands that need no replica) and ``scripts`` (each with a key
        of its slot) in one round trip, every script waited for as asked: the replies of
        ``lead``, those of ``scripts``, and for each script why its writes are not known
        to be on its replicas (None when they are)."""
        counts = [await self.wanted(key) for key, _ in scripts]
        if not self.wire.cluster or not any(counts):
            count = max(counts, default=0)
            tail = [self._wait(count)] if count else []
            replies = await self.wire.round_trip([*lead, *(c for _, c in scripts), *tail])
            short = self._short(replies[-1], count) if count else None
            n = len(lead)
            return replies[:n], replies[n : n + len(scripts)], [short] * len(scripts)
        return await self._per_node(lead, scripts, counts)

    async def _per_node(
        self, lead: list[Command], scripts: list[tuple[str, Command]], counts: list[int]
    ) -> tuple[list[Any], list[Any], list[str | None]]:
        """``round_trip`` on a Redis Cluster: each script that waits for replicas on its
        own connection to its node (``WAIT`` counts that connection's writes), beside
        the pipeline of ``lead`` and of the others."""
        plain = [i for i, count in enumerate(counts) if count == 0]
        waited = [i for i, count in enumerate(counts) if count > 0]
        pipeline = self.wire.round_trip([*lead, *(scripts[i][1] for i in plain)])
        trips = [self.written(scripts[i][0], [scripts[i][1]], counts[i]) for i in waited]
        done = await asyncio.gather(pipeline, *trips, return_exceptions=True)
        for result in done:  # a cancellation is raised, an error is its command's reply
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
        first = done[0]
        if isinstance(first, BaseException):
            first = [first] * (len(lead) + len(plain))
        replies: list[Any] = [None] * len(scripts)
        shorts: list[str | None] = [None] * len(scripts)
        for n, i in enumerate(plain):
            replies[i] = first[len(lead) + n]
        for i, trip in zip(waited, done[1:], strict=True):
            if isinstance(trip, BaseException):
                replies[i] = trip
            else:
                replies[i], shorts[i] = trip[0][0], trip[1]
        return first[: len(lead)], replies, shorts

    def doubt(self, run_id: str, head_key: str, cid: str, revision: int) -> None:
        """Note that the commit ``cid`` of ``run_id`` may have landed without its replicas
        confirmed (it is being sent, its ``WAIT`` fell short, or its reply never came):
        the next ``confirm`` of the run confirms it first."""
        self._doubts[run_id] = _Doubt(head_key, cid, revision)

    def forget(self, run_id: str) -> None:
        """Drop the doubt about a commit of ``run_id`` (it was refused, or confirmed on
        its replicas; or the run was deleted)."""
        self._doubts.pop(run_id, None)

    async def confirm(self, run_id: str) -> None:
        """Confirm that the commit of ``run_id`` this store doubts (if any) is on the
        replicas asked for, or that the run's head is no longer that commit;
        ``StoreError`` while neither can be told."""
        doubt = self._doubts.get(run_id)
        if doubt is None:
            return
        count = await self.wanted(doubt.head_key)
        if count == 0:  # no replica asked for any more
            self.forget(run_id)
            return
        command = ("EVAL", CONFIRM_SCRIPT, 1, doubt.head_key, doubt.cid)
        replies, short = await self.written(doubt.head_key, [command], count)
        if isinstance(replies[0], Exception):
            raise replies[0]
        if replies[0] == 1 and short is not None:
            what = f"the commit of run {run_id!r} at revision {doubt.revision}"
            raise self.error(what, short)
        self.forget(run_id)
