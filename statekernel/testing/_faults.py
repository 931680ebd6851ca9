"""Fault injection: simulated process deaths at the points where a real one can land."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, TypeAlias

import attrs

from statekernel._kernel.middleware import Middleware, ToolInvocation
from statekernel._records.messages import ModelRequest
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, StoreWrapper
from statekernel._storage.provider import ModelProvider, StreamPart

__all__ = [
    "CRASH_POINTS",
    "Crash",
    "CrashAt",
    "CrashPoint",
    "FaultPlan",
    "FaultyProvider",
    "FaultyStore",
]

CrashPoint: TypeAlias = Literal[
    "before_commit", "after_commit", "model_call", "mid_stream", "tool_after_effect"
]
CRASH_POINTS: tuple[CrashPoint, ...] = (
    "before_commit",
    "after_commit",
    "model_call",
    "mid_stream",
    "tool_after_effect",
)


class Crash(BaseException):
    """A simulated process death. A ``BaseException``, so no ``except Exception`` stops it."""

    def __init__(self, point: CrashPoint, count: int) -> None:
        self.point = point
        self.count = count
        super().__init__(f"crash at {point} #{count}")


@attrs.frozen
class CrashAt:
    """Crash the ``nth`` time (1-based, counted over the whole plan) ``point`` is reached."""

    point: CrashPoint
    nth: int


class FaultPlan:
    """Counts arrivals at each crash point and raises ``Crash`` where the schedule says.

    Each scheduled crash fires once. ``fired`` lists the crashes that happened.
    """

    def __init__(self, schedule: Sequence[CrashAt] = ()) -> None:
        self.pending = {(c.point, c.nth) for c in schedule}
        self.counts: Counter[str] = Counter()
        self.fired: list[CrashAt] = []

    def reach(self, point: CrashPoint) -> None:
        """Note an arrival at ``point``; raise ``Crash`` if one is scheduled here.

        Raises:
            Crash: a crash is scheduled for this arrival (a ``BaseException``).
        """
        self.counts[point] += 1
        key = (point, self.counts[point])
        if key in self.pending:
            self.pending.discard(key)
            self.fired.append(CrashAt(*key))
            raise Crash(point, key[1])

    def middleware(self) -> Middleware:
        """Middleware that crashes after a tool's side effect, before its result commits.

        Returns:
            The middleware (it reaches ``tool_after_effect`` after each tool call).
        """

        async def crash_after_effect(call: Any, nxt: Any) -> Any:
            result = await nxt(call)
            if isinstance(call, ToolInvocation):
                self.reach("tool_after_effect")
            return result

        return crash_after_effect


class FaultyStore(StoreWrapper):
    """A store wrapper that crashes before a commit or after it landed."""

    def __init__(self, inner: CheckpointStore, plan: FaultPlan) -> None:
        super().__init__(inner)
        self.plan = plan

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Maybe crash before, maybe after the inner commit lands.

        Raises:
            Crash: the plan crashes at ``before_commit`` or ``after_commit`` here.
        """
        self.plan.reach("before_commit")
        await self.inner.commit(checkpoint, lease=lease)
        self.plan.reach("after_commit")

    async def aclose(self) -> None:
        """Leave the inner store open: it outlives the simulated process."""


class FaultyProvider:
    """A provider wrapper that crashes as the call starts or after the first part."""

    def __init__(self, inner: ModelProvider, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamPart]:
        """Stream the inner provider's parts, crashing where the plan says.

        Yields:
            The inner provider's parts.

        Raises:
            Crash: the plan crashes at ``model_call`` or ``mid_stream`` here.
        """
        self.plan.reach("model_call")
        first = True
        async for part in self.inner.stream(request):
            yield part
            if first:
                first = False
                self.plan.reach("mid_stream")

    async def aclose(self) -> None:
        """Close the inner provider."""
        await self.inner.aclose()
