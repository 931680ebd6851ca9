"""Replay a run's persisted events over the lifecycle: which states and transitions it
visited, how often, and where it is now.

A commit (one revision) carries the events of one or more lifecycle transitions, in
order. Each transition's events open with one that names it (``run_started``,
``turn_started``, ``model_started`` ...); ``turn_prepared``, ``turn_completed`` and
``run_completed`` follow the event that opened their transition. Events that change
only data (``run_forked``, ``tool_call_resolved``, ``context_updated``, ``tags_updated``) are not
transitions. Identical calls merged into one execution count one transition per call.
A ``tool_call_started`` marked ``early`` is ``early_call_started``; a ``model_completed``
with ``cut_off`` is ``answer_cut_off``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import attrs

from statekernel._lifecycle.chart import TABLE
from statekernel._records.events import Event

__all__ = [
    "DATA_EVENTS",
    "DECLARED",
    "RunTrace",
    "TransitionKey",
    "trace_events",
    "transitions_of",
]

TransitionKey = tuple[str, str, str]
"""(source state id, target state id, lifecycle event)."""

DATA_EVENTS = frozenset({"context_updated", "tags_updated", "tool_call_resolved", "run_forked"})
"""Events of commits that change a run's data, not its lifecycle state."""

DECLARED: frozenset[TransitionKey] = frozenset(
    (state, route.target, event) for (state, event), routes in TABLE.items() for route in routes
)
"""(source, target, event) of every transition the lifecycle declares."""

_INTERNAL = {"model_started", "early_call_started", "tool_call_started", "tool_call_completed"}

_OPENS = {
    "run_started": "start",
    "turn_started": "turn_prepared",
    "model_started": "model_started",
    "model_restarted": "model_started",
    "model_completed": "model_completed",
    "tool_call_started": "tool_call_started",
    "tool_call_completed": "tool_call_completed",
    "tools_completed": "tools_completed",
    "run_paused": "pause",
    "run_resumed": "resume",
    "run_failed": "fail",
    "run_retried": "retry",
    "input_received": "input",
}
"""The event that opens each lifecycle transition's events."""

_FOLLOWS = {"turn_prepared", "turn_completed", "run_completed"}


@attrs.frozen
class RunTrace:
    """What a run went through: entries per state, transitions taken, current state."""

    title: str
    current: str
    state_visits: dict[str, int]
    transitions: dict[TransitionKey, int]


def _transitions(events: Iterable[Event]) -> Iterator[list[Event]]:
    """The events of each lifecycle transition, in order (data-only events left out)."""
    current: list[Event] = []
    for event in events:
        if event.type in _OPENS:
            if current:
                yield current
            current = [event]
        elif event.type in _FOLLOWS and current:
            current.append(event)
    if current:
        yield current


def _target(state: str, events: Sequence[Event]) -> tuple[str, str]:
    """The (lifecycle event, target state) of one transition's events."""
    first = events[0]
    event = _OPENS[first.type]
    data = first.data if isinstance(first.data, dict) else {}
    finished = any(e.type == "run_completed" for e in events)
    if event == "tool_call_started" and data.get("early"):
        event = "early_call_started"  # a call started while the answer streamed
    if event == "model_completed" and "cut_off" in data:
        return "answer_cut_off", "dispatching_tools"
    if event in _INTERNAL:
        return event, state
    if event == "model_completed" and data.get("tool_calls"):
        return event, "dispatching_tools"
    if event in ("model_completed", "tools_completed"):
        return event, "completed" if finished else "preparing_turn"
    if event in ("resume", "retry"):
        return event, str(data.get("resume_to", state))
    return event, _TARGETS[event]


_TARGETS = {
    "start": "preparing_turn",
    "turn_prepared": "calling_model",
    "pause": "paused",
    "fail": "failed",
    "input": "preparing_turn",
}


def transitions_of(state: str, events: Iterable[Event]) -> list[TransitionKey]:
    """The lifecycle transitions that ``events`` (one or more commits) record, from
    ``state``: (source, target, event) each, in order."""
    keys: list[TransitionKey] = []
    for transition in _transitions(events):
        event, target = _target(state, transition)
        keys.append((state, target, event))
        state = target
    return keys


def trace_events(
    events: Iterable[Event], *, initial: str = "init", current: str | None = None, title: str = ""
) -> RunTrace:
    """Replay ``events`` (in ``seq`` order) from the ``initial`` state.

    ``current`` (the run's stored state) wins over the replayed one when given.
    """
    state = initial
    visits: Counter[str] = Counter({initial: 1})
    moves: Counter[TransitionKey] = Counter()
    for key in transitions_of(initial, events):
        moves[key] += 1
        if key[2] not in _INTERNAL:
            visits[key[1]] += 1
        state = key[1]
    return RunTrace(title, current or state, dict(visits), dict(moves))
