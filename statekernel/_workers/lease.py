"""Leases on runs, and the store a worker's kernel commits through.

A lease is the key ``<prefix>:{run}:lease`` (same hash slot as the run's keys) holding
the fencing token ``"<generation>/<owner>"``; the generation comes from ``INCR`` on
``<prefix>:{run}:fence``, so every acquisition of a run's lease gets a new, larger
token. The lease expires after its time to live unless renewed. Every commit of a
worker carries its token (``Fence``) and the store's commit script checks it together
with the revision, so once a lease has expired or moved on, its former holder cannot
commit anything, however late it wakes up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import attrs

from statekernel._storage.protocol import Checkpoint, StoreWrapper
from statekernel._storage.protocol import Lease as RunLease
from statekernel.errors import LeaseLost, StoreError
from statekernel.stores._redis_fencing import FENCE_KEY_TTL_MS, RELEASE, RENEW, Fence, RedisBacked

__all__ = ["Lease", "LeasedStore", "Leases"]

ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2]) .. '/' .. ARGV[1]
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
"""


@attrs.frozen
class Lease:
    """A held lease: the run, its lease key and this holder's fencing token."""

    run_id: str
    key: str
    token: str

    @property
    def fence(self) -> Fence:
        """The commit condition this lease stands for."""
        return Fence(self.key, self.token)


class Leases:
    """Acquire, renew and release leases on runs for one owner (a worker)."""

    def __init__(self, store: RedisBacked, owner: str, ttl: float) -> None:
        self.store = store
        self.owner = owner
        self.ttl_ms = max(1, round(ttl * 1000))
        client = store.client
        self._acquire = client.register_script(ACQUIRE)
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)

    async def acquire(self, run_id: str) -> Lease | None:
        """A new lease on the run, or None while someone holds one."""
        key = self.store.run_key(run_id, "lease")
        keys = [key, self.store.run_key(run_id, "fence")]
        args: list[Any] = [self.owner, self.ttl_ms, FENCE_KEY_TTL_MS]
        token = await _call(self._acquire(keys=keys, args=args))
        if token is None:
            return None
        return Lease(run_id, key, token.decode() if isinstance(token, bytes) else str(token))

    async def renew(self, leases: Sequence[Lease]) -> list[bool]:
        """Extend each lease by the time to live; False for those no longer held."""
        if not leases:
            return []
        pipe = self.store.client.pipeline(transaction=False)
        for lease in leases:
            await self._renew(keys=[lease.key], args=[lease.token, self.ttl_ms], client=pipe)
        return [bool(r) for r in await _call(pipe.execute())]

    async def release(self, lease: Lease) -> bool:
        """Give the lease up (if still held); True if it was."""
        return bool(await _call(self._release(keys=[lease.key], args=[lease.token])))


async def _call(work: Awaitable[Any]) -> Any:
    from redis.exceptions import RedisError

    try:
        return await work
    except (RedisError, OSError) as exc:
        raise StoreError(f"Redis lease operation failed: {type(exc).__name__}: {exc}") from exc


class LeasedStore(StoreWrapper):
    """The store a worker's kernel commits through: each commit is fenced by the
    worker's lease on its run; without one (never taken, lost, released) it raises
    ``LeaseLost`` before reaching Redis. Reads go straight to the inner store.

    The worker owns the runs it drives: the kernel's own ``acquire`` gets the worker's
    lease, and its renewals and releases are left to the worker.
    """

    def __init__(self, inner: RedisBacked, held: Mapping[str, Lease]) -> None:
        super().__init__(inner)
        self.fenced = inner
        self.held = held

    async def commit(self, checkpoint: Checkpoint, *, lease: RunLease | None = None) -> None:
        """Commit under the worker's lease on the run."""
        held = self.held.get(checkpoint.run.run_id)
        if held is None:
            raise LeaseLost(checkpoint.run.run_id, checkpoint.expected_revision)
        await self.fenced.commit(checkpoint, fence=held.fence)

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> RunLease:
        """The worker's lease on the run (``LeaseLost`` if the worker holds none)."""
        held = self.held.get(run_id)
        if held is None:
            raise LeaseLost(run_id, -1)
        return RunLease(run_id, owner, held.token)

    async def renew(self, lease: RunLease, *, ttl: float) -> None:
        """Nothing: the worker renews its leases."""

    async def release(self, lease: RunLease) -> None:
        """Nothing: the worker releases its leases."""

    async def submit(self, run_id: str, queue: str = "default") -> str:
        """Enqueue on the inner store's run queue ``queue`` (a child run handed on)."""
        return await self.fenced.submit(run_id, queue)

    async def aclose(self) -> None:
        """Nothing: the worker closes the inner store."""
