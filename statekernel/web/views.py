"""What the pages show, shaped from the records for the templates: list rows, a run's
header, its transcript as a conversation, its events and a turn timeline (what changed
between two revisions is ``diffs``'s). The text of a run is data: the templates escape
all of it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from statekernel import Event, ReasoningPart, Run, TextPart, ToolCall, ToolResult
from statekernel._front.limits import limit_is_float, limit_reached, suggested_limit
from statekernel._front.text import short, stamp, waiting_for
from statekernel.pauses import Question, Uncertain
from statekernel.stores import RunSummary

__all__ = [
    "RESOLVE_WARNING",
    "EventRow",
    "LimitForm",
    "ListRow",
    "Said",
    "TurnTime",
    "event_row",
    "limit_form",
    "list_row",
    "timeline",
    "transcript",
    "uncertain_ids",
]


RESOLVE_WARNING = (
    "This call may or may not have run: the process driving it stopped after the call "
    "started and before its result was committed. Check the outside world first. Say "
    "'output' if it ran (give what it returned), 'error' if it failed, 're-run' only if "
    "running it twice is harmless."
)
"""The warning shown with each uncertain call (what ``statekernel runs resolve`` says)."""


@attrs.frozen
class ListRow:
    """One line of the runs list (``damaged``: why its head cannot be read; ``owner``:
    who drives a run that is not at rest, ``owner_gone`` when nobody does any more)."""

    run_id: str
    state: str
    turns: int | str = ""
    revision: int | str = ""
    model: str = ""
    updated: str = ""
    waiting_for: str = ""
    damaged: str = ""
    owner: str = ""
    owner_gone: bool = False
    tags: str = ""
    """The run's tags, ``key=value`` each, by key."""


def list_row(summary: RunSummary) -> ListRow:
    """The list line of a run, with what a paused run waits for (as ``runs list``)."""
    return ListRow(
        summary.run_id,
        summary.state,
        summary.turns,
        summary.revision,
        summary.model,
        stamp(summary.updated_at),
        waiting_for(summary.pause) if summary.pause is not None else "",
        tags=" ".join(f"{k}={v}" for k, v in sorted(summary.tags.items())),
    )


@attrs.frozen
class Said:
    """One entry of the conversation: ``kind`` is text, reasoning, call, result, error
    or uncertain (a call of the turn in progress that may or may not have run)."""

    role: str
    kind: str
    text: str
    name: str = ""
    call_id: str = ""
    uncertain: bool = False


def uncertain_ids(run: Run) -> set[str]:
    """The calls of the run's pause that may or may not have run."""
    details = run.pause.details if run.pause is not None else None
    return {c.id for c in details.calls} if isinstance(details, Uncertain) else set()


def _pretty(value: Any) -> str:
    """JSON (or a string of JSON) indented; other text as it is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    return json.dumps(value, ensure_ascii=False, indent=2)


def transcript(run: Run) -> list[Said]:
    """The run's messages as a conversation: text, reasoning, tool calls with their
    arguments, results (errors apart); the calls left uncertain by a crash flagged."""
    flagged = uncertain_ids(run)
    said: list[Said] = []
    for message in run.messages:
        for part in message.content:
            if isinstance(part, TextPart) and part.text:
                said.append(Said(message.role, "text", part.text))
            elif isinstance(part, ReasoningPart) and part.text:
                said.append(Said(message.role, "reasoning", part.text))
            elif isinstance(part, ToolCall):
                said.append(
                    Said(
                        message.role,
                        "call",
                        _pretty(part.arguments),
                        part.name,
                        part.id,
                        part.id in flagged,
                    )
                )
            elif isinstance(part, ToolResult):
                kind = "error" if part.is_error else "result"
                said.append(Said(message.role, kind, part.content, part.name, part.tool_call_id))
    turn = run.current_turn
    if turn is not None:  # calls of the turn in progress, not in the transcript yet
        for record in (*turn.in_flight, *turn.completed):
            if record.id in flagged:
                text = f"may or may not have run (attempt {record.attempt}): say what happened"
                said.append(Said("tool", "uncertain", text, record.name, record.id, True))
            elif record.finished_at is not None:
                kind = "error" if record.error is not None else "result"
                text = record.error if record.error is not None else _pretty(record.output)
                said.append(Said("tool", kind, text, record.name, record.id))
    return said


@attrs.frozen
class EventRow:
    """One persisted event as the events list shows it."""

    at: str
    revision: int
    seq: int
    type: str
    data: str


def event_row(event: Event) -> EventRow:
    """An event's line: time, revision, number, type and its data in short."""
    data = event.data if isinstance(event.data, dict) else {"data": event.data}
    text = " ".join(f"{k}={short(v, 80)}" for k, v in data.items())
    return EventRow(stamp(event.at), event.revision, event.seq, event.type, text)


@attrs.frozen
class TurnTime:
    """Seconds one turn spent waiting for the model and running tools."""

    turn: int
    model: float
    tools: float


def timeline(events: Iterable[Event]) -> list[TurnTime]:
    """Model and tool time per turn, from the times of the run's events (a model call
    from its start to its completion, tools from the first start to the last end)."""
    turns: list[TurnTime] = []
    model = tools = 0.0
    model_from = tools_from = tools_to = None
    index = -1

    def close() -> None:
        if index >= 0:
            spent = (tools_to - tools_from).total_seconds() if tools_from and tools_to else 0.0
            turns.append(TurnTime(index, round(model, 3), round(tools + spent, 3)))

    for event in events:
        if event.type == "turn_started":
            close()
            index, model, tools = index + 1, 0.0, 0.0
            model_from = tools_from = tools_to = None
        elif event.type in ("model_started", "model_restarted"):
            model_from = event.at
        elif event.type == "model_completed" and model_from is not None:
            model += (event.at - model_from).total_seconds()
            model_from = None
        elif event.type == "tool_call_started":
            tools_from = tools_from or event.at
        elif event.type in ("tool_call_completed", "tools_completed"):
            tools_to = event.at
    close()
    return turns


def question_of(run: Run) -> Question | None:
    """The question a paused run waits to have answered, if any."""
    details = run.pause.details if run.pause is not None and run.state == "paused" else None
    return details if isinstance(details, Question) else None


@attrs.frozen
class LimitForm:
    """The limit a paused run reached, as its form to raise it shows it: what it used and
    allowed, the value offered, and the number input's ``min`` and ``step``."""

    name: str
    used: int | float
    allowed: int | float
    suggested: int | float
    minimum: int | float
    step: str


def limit_form(run: Run) -> LimitForm | None:
    """The form to raise the limit a paused run reached (None: it is not paused at one)."""
    reached = limit_reached(run)
    if reached is None:
        return None
    floats = limit_is_float(reached.limit)
    minimum = reached.used if floats else reached.used + 1
    step = "any" if floats else "1"
    suggested = suggested_limit(reached)
    return LimitForm(reached.limit, reached.used, reached.allowed, suggested, minimum, step)


def children_rows(nodes: Sequence[tuple[int, Run]]) -> list[tuple[int, Run]]:
    """The run's child runs (depth first, each with its depth), without the run."""
    return list(nodes[1:])
