"""Replay a run's persisted events over the lifecycle: which states and transitions it
visited, how often, and where it is now.

Each commit (one revision) is at most one lifecycle transition; its events say which.
Commits that only change data (``run_forked``, ``tool_call_resolved``,
``context_updated``) are not transitions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import groupby

import attrs

from statekernel._events import Event

__all__ = ["RunTrace", "TransitionKey", "trace_events"]

TransitionKey = tuple[str, str, str]
"""(source state id, target state id, lifecycle event)."""

_INTERNAL = {
    "model_started": "model_started",
    "model_restarted": "model_started",
    "tool_call_started": "tool_call_started",
    "tool_call_completed": "tool_call_completed",
}


@attrs.frozen
class RunTrace:
    """What a run went through: entries per state, commits per transition, current state."""

    title: str
    current: str
    state_visits: dict[str, int]
    transitions: dict[TransitionKey, int]


def _step(state: str, events: Sequence[Event]) -> tuple[str, str] | None:
    """The (lifecycle event, target state) of one commit, or None for a data-only commit."""
    types = [e.type for e in events]
    finished = "run_completed" in types
    if "input_received" in types:
        return "input", "preparing_turn"
    for e in events:
        data = e.data if isinstance(e.data, dict) else {}
        if e.type == "run_started":
            return "start", "preparing_turn"
        if e.type == "turn_prepared":
            return "turn_prepared", "calling_model"
        if e.type in _INTERNAL:
            return _INTERNAL[e.type], state
        if e.type == "model_completed":
            target = "completed" if finished else "preparing_turn"
            return "model_completed", "dispatching_tools" if data.get("tool_calls") else target
        if e.type == "tools_completed":
            return "tools_completed", "completed" if finished else "preparing_turn"
        if e.type == "run_paused":
            return "pause", "paused"
        if e.type == "run_failed":
            return "fail", "failed"
        if e.type in ("run_resumed", "run_retried"):
            event = "resume" if e.type == "run_resumed" else "retry"
            return event, str(data.get("resume_to", state))
    return None


def trace_events(
    events: Iterable[Event], *, initial: str = "init", current: str | None = None, title: str = ""
) -> RunTrace:
    """Replay ``events`` (in ``seq`` order) from the ``initial`` state.

    ``current`` (the run's stored state) wins over the replayed one when given.
    """
    state = initial
    visits: Counter[str] = Counter({initial: 1})
    moves: Counter[TransitionKey] = Counter()
    for _, group in groupby(events, key=lambda e: e.revision):
        step = _step(state, list(group))
        if step is None:
            continue
        event, target = step
        moves[(state, target, event)] += 1
        if event not in _INTERNAL.values():
            visits[target] += 1
        state = target
    return RunTrace(title, current or state, dict(visits), dict(moves))
