"""Events: the persisted log of every committed transition, and the live stream."""

from __future__ import annotations

from datetime import datetime
from typing import Final

import attrs

from statekernel._records.messages import JSON
from statekernel._records.run import utcnow

__all__ = ["LIVE_EVENTS", "PERSISTED_EVENTS", "Event"]

PERSISTED_EVENTS: Final = frozenset(
    {
        "run_started",
        "turn_started",
        "turn_prepared",
        "model_started",
        "model_restarted",
        "model_completed",
        "tool_call_started",
        "tool_call_completed",
        "tools_completed",
        "turn_completed",
        "run_paused",
        "run_resumed",
        "input_received",
        "run_cancelled",
        "deadline_exceeded",
        "run_failed",
        "run_retried",
        "run_completed",
    }
)
"""Event types written with their commit (``seq`` >= 0)."""

LIVE_EVENTS: Final = frozenset(
    {"text_delta", "reasoning_delta", "tool_call_delta", "tool_output", "usage"}
)
"""Event types yielded to the caller but never stored (``seq`` is -1)."""


@attrs.frozen
class Event:
    """One event of a run.

    ``revision`` is the revision whose commit wrote it (for live events, the revision
    the run was at); ``seq`` numbers the persisted events of a run from 0, and is -1
    for live events.
    """

    type: str
    run_id: str
    revision: int
    seq: int = -1
    data: JSON = attrs.field(factory=dict)
    at: datetime = attrs.field(factory=utcnow)

    @property
    def persisted(self) -> bool:
        """True for events that are part of the stored log."""
        return self.seq >= 0
