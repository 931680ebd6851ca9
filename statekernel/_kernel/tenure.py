"""A lease this process holds on a run, and how long it surely lasts.

The store decides who holds a run's lease; the holder decides whether it may still start
an effect. It measures that on its own monotonic clock, which no other process and no
wall-clock step can move: the lease surely lasts until ``ttl`` seconds after the moment
the last acquisition or renewal that succeeded *began* (the store counts from a moment
no earlier than that). Right before a model or tool call starts, ``ensure`` checks that
at least ``margin`` seconds of it remain, renewing it first when fewer do (one round trip,
only after a stall: the renewal loop keeps two thirds of it ahead); if the lease moved
on meanwhile, it raises ``LeaseLost`` and nothing starts.

A store whose takers may take a run before its lease expires (the Postgres store, once
the owner's advisory lock stayed free for a second: the owner may have lost only its
session) declares an ``effect_window``: then ``ensure`` also renews when the last
renewal that succeeded began longer ago than that, and the renewal is the proof the
owner still holds the run.

What no check can close: a stall that begins after ``ensure`` returned and lasts longer
than the margin (the effect then starts under a lease that may have expired). Tools get
the lease's fencing token (``ToolContext.fencing_token``) for the services that can
refuse a token older than one they have seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from statekernel._storage.protocol import CheckpointStore, Lease, effect_window
from statekernel.errors import StoreError

__all__ = ["Tenure"]


class Tenure:
    """``lease``, held on ``store`` for ``ttl`` seconds from its last renewal.

    ``taken_at``: when the acquisition that gave it began, on ``clock`` (monotonic).
    Whose lease that acquisition took over is told once (``takeover``): the drive or
    command that holds it first counts it.
    """

    def __init__(
        self,
        store: CheckpointStore,
        lease: Lease,
        ttl: float,
        taken_at: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.lease = lease
        self.ttl = ttl
        self.clock = clock
        self.valid_until = taken_at + ttl
        """Until when (on ``clock``) the lease surely lasts."""
        self.proven_at = taken_at
        """When (on ``clock``) the last acquisition or renewal that succeeded began."""
        self.window = effect_window(store)
        self._taken_from = lease.taken_from

    def takeover(self) -> str | None:
        """The owner whose lease the acquisition took over (``Lease.taken_from``), told
        once, to whoever counts it (``statekernel.takeovers``): None after the first
        call, and for a lease that was free or this owner's own."""
        taken_from, self._taken_from = self._taken_from, None
        return taken_from

    def remaining(self) -> float:
        """Seconds the lease surely lasts from now (negative once it may have expired)."""
        return self.valid_until - self.clock()

    async def renew(self) -> None:
        """Extend the lease by ``ttl``; ``LeaseLost`` if it moved on."""
        began = self.clock()
        await self.store.renew(self.lease, ttl=self.ttl)
        self.valid_until = max(self.valid_until, began + self.ttl)
        self.proven_at = max(self.proven_at, began)

    def _stale(self, margin: float) -> bool:
        if self.remaining() < margin:
            return True
        return self.window is not None and self.clock() - self.proven_at >= self.window

    async def ensure(self, margin: float) -> None:
        """Return once the lease surely lasts ``margin`` seconds more (renewing it if it
        might not); ``LeaseLost`` if it moved on, ``StoreError`` if the store cannot say."""
        if self._stale(margin):
            await self.renew()
            if self._stale(margin):  # the renewal itself took that long
                raise StoreError(
                    f"renewing the lease of run {self.lease.run_id!r} took so long that it"
                    " no longer proves this owner holds the run: the store is too slow to"
                    " start anything now"
                )
