"""Leases on Redis, and what run queues need of a store.

A run's lease is a Redis key in the run's hash slot whose value is the holder's fencing
token ``"<generation>/<owner>"`` (``RedisStore.acquire``); it expires on the server's
clock unless renewed. A commit under the lease checks, in the same script as the
revision compare-and-set, that the key still holds the token, and raises ``LeaseLost``
otherwise: an owner whose lease expired or passed to another can never commit, even if
it wakes up from a long pause mid-transition. Workers take leases the same way as any
kernel: there is one ownership system.

Beside it, the run's ``last`` key keeps the token of the lease last given until that
lease is given back: a lease key gone while ``last`` is there expired in its holder's
hands, so the next ``acquire`` tells whose lease it took over (``Lease.taken_from``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from statekernel._records.run import TraceParent
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import ConfigError

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["RELEASE", "RENEW", "AnyRedis", "RedisBacked", "redis_backed"]

AnyRedis: TypeAlias = "aioredis.Redis | RedisCluster"
"""The client of a Redis store: one server's, or a Redis Cluster's."""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
"""Extend the lease key ``KEYS[1]`` to ``ARGV[2]`` ms if it still holds the token ``ARGV[1]``."""

RELEASE = """
if #KEYS > 1 and redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
"""Delete the lease key ``KEYS[1]`` if it still holds the token ``ARGV[1]``, and the
run's ``last`` key ``KEYS[2]`` if it does (``ACQUIRE_SCRIPT``: a lease given back, even
one that expired first, is free, not taken over)."""


@runtime_checkable
class RedisBacked(CheckpointStore, Protocol):
    """A store that keeps runs in Redis and can host run queues on the same server
    (``statekernel.stores.RedisStore``)."""

    prefix: str

    @property
    def client(self) -> AnyRedis:
        """The redis.asyncio client of the store."""
        ...

    async def submit(
        self,
        run_id: str,
        queue: str = "default",
        *,
        delay_ms: int = 0,
        key: str | None = None,
        key_limit: int = 1,
        trace: TraceParent | None = None,
    ) -> str:
        """Enqueue the run on the run queue ``queue``; the entry id."""
        ...

    def run_key(self, run_id: str, name: str) -> str:
        """A key called ``name`` in the hash slot of the run's keys."""
        ...


def redis_backed(store: object, what: str) -> RedisBacked:
    """``store`` as a ``RedisBacked`` store, or ``ConfigError`` saying ``what`` needs one."""
    if not isinstance(store, RedisBacked):
        raise ConfigError(
            f"{what} needs a Redis store (redis:// or rediss://), not {type(store).__name__}"
        )
    return store
