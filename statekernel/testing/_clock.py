"""A clock that only moves when a test moves it, for lease expiry without real sleeps."""

from __future__ import annotations

import math
import time

from statekernel.errors import InvalidArgument

__all__ = ["ManualClock"]


class ManualClock:
    """Fake wall-clock time for the leases of the memory, file and SQLite stores.

    Pass it as the store's ``clock`` (``MemoryStore(clock=clock)``,
    ``FileStore(url, clock=clock)``, ``SQLiteStore(url, clock=clock)``): calling it
    returns the current fake time in seconds since the epoch, like ``time.time``, and
    it changes only by ``advance``. A lease taken for ``ttl`` seconds expires once the
    clock has been advanced past ``ttl`` since its last renewal, so a test simulates
    a dead owner with ``clock.advance(ttl + 0.001)`` instead of sleeping.

    Only the stores' lease expiry follows it: the kernel still renews its leases and
    waits for busy runs on real (asyncio) time, and ``redis://`` expires leases on
    the server's own clock. ``start``: the initial time (None: ``time.time()`` now).
    """

    def __init__(self, start: float | None = None) -> None:
        now = time.time() if start is None else float(start)
        if not math.isfinite(now):
            raise InvalidArgument(f"a clock starts at a finite time, not {start!r}")
        self._now = now

    def __call__(self) -> float:
        """The current fake time, in seconds since the epoch.

        Returns:
            The time.
        """
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward (never back) and return the new time.

        Returns:
            The new time, in seconds since the epoch.

        Raises:
            InvalidArgument: ``seconds`` is negative or not finite.
        """
        step = float(seconds)
        if not (step >= 0 and math.isfinite(step)):
            raise InvalidArgument(f"a clock moves forward by finite seconds, not {seconds!r}")
        self._now += step
        return self._now

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"
