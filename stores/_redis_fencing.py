"""Fenced commits: what a store must offer so that workers can own runs through leases.

A worker holds a lease on each run it drives: a Redis key in the run's hash slot whose
value is the worker's fencing token. A ``Fence`` names that key and token; a store
that accepts ``commit(checkpoint, fence=...)`` checks, in the same atomic step as the
revision compare-and-set, that the key still holds the token, and raises
``LeaseLost`` otherwise. A worker whose lease expired or passed to another worker can
therefore never commit, even if it wakes up from a long pause mid-transition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease
from statekernel.errors import ConfigError

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["FENCE_KEY_TTL_MS", "RELEASE", "RENEW", "Fence", "RedisBacked", "redis_backed"]

FENCE_KEY_TTL_MS = 30 * 24 * 3600 * 1000
"""Fence counters outlive leases (a new lease must get a larger token), but not forever."""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
"""Extend the lease key ``KEYS[1]`` to ``ARGV[2]`` ms if it still holds the token ``ARGV[1]``."""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
"""Delete the lease key ``KEYS[1]`` if it still holds the token ``ARGV[1]``."""


@attrs.frozen
class Fence:
    """A commit condition: the key ``key`` (in the run's hash slot) must hold ``token``."""

    key: str
    token: str


@runtime_checkable
class RedisBacked(CheckpointStore, Protocol):
    """A store that keeps runs in Redis, accepts fenced commits and can host run queues
    and leases on the same server (``statekernel.stores.RedisStore``)."""

    prefix: str

    @property
    def client(self) -> aioredis.Redis:
        """The redis.asyncio client of the store."""
        ...

    async def submit(self, run_id: str, queue: str = "default") -> str:
        """Enqueue the run on the run queue ``queue``; the entry id."""
        ...

    def run_key(self, run_id: str, name: str) -> str:
        """A key called ``name`` in the hash slot of the run's keys."""
        ...

    async def commit(
        self, checkpoint: Checkpoint, *, lease: Lease | None = None, fence: Fence | None = None
    ) -> None:
        """Commit; with ``lease`` or ``fence``, only while the lease key holds its token."""
        ...


def redis_backed(store: object, what: str) -> RedisBacked:
    """``store`` as a ``RedisBacked`` store, or ``ConfigError`` saying ``what`` needs one."""
    if not isinstance(store, RedisBacked):
        raise ConfigError(
            f"{what} needs a Redis store (redis:// or rediss://), not {type(store).__name__}"
        )
    return store
