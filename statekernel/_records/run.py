"""The durable run records: ``Run``, ``Turn``, ``ToolCallRecord``, pause and failure info."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal, TypeAlias, get_args

import attrs

from statekernel._records.fallback import Fallback
from statekernel._records.lazy import LazyTuple
from statekernel._records.limits import Limits
from statekernel._records.messages import (
    JSON,
    Message,
    ModelRequest,
    ModelResult,
    OutputSpec,
    Usage,
)
from statekernel._records.pauses import HookPause, PauseDetails, PauseTimer, timer_of
from statekernel._records.prices import Prices, RunCost, turns_cost

__all__ = [
    "CANCELLED",
    "CHILD_PAUSED",
    "DEADLINE_EXCEEDED",
    "Cancellation",
    "FailureInfo",
    "INPUT_REQUIRED",
    "LIMIT_REACHED",
    "MAX_TURNS",
    "OUTPUT_INVALID",
    "PAUSE_TIMED_OUT",
    "PauseInfo",
    "Run",
    "SCHEMA_VERSION",
    "STATE_IDS",
    "StateId",
    "ToolCallRecord",
    "TraceParent",
    "Turn",
    "UNCERTAIN",
    "answer_json",
    "utcnow",
]

SCHEMA_VERSION = 2
"""The version of the stored record layout written by this release (2: typed pause
details and ``ToolCallRecord.skipped``; 1 kept them in ``metadata`` and ``error``)."""

StateId: TypeAlias = Literal[
    "init",
    "preparing_turn",
    "calling_model",
    "dispatching_tools",
    "paused",
    "failed",
    "completed",
]

STATE_IDS: tuple[StateId, ...] = get_args(StateId)
"""The run's states, in lifecycle order (the statechart is checked against them)."""


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


@attrs.frozen
class ToolCallRecord:
    """One tool call through dispatch: pending -> in flight -> completed.

    ``input`` is the parsed (or hook-rewritten) arguments, None when the model's
    arguments were not valid JSON. A completed record has ``output`` or ``error``;
    ``resolved`` is True when that result is an operator's answer given with
    ``Kernel.resolve_tool_call`` (the call's outcome was uncertain), not an execution.
    ``context_patch`` is the change to the run's context the tool returned with its
    result (``ToolReturn``), a JSON Merge Patch applied when the turn's calls have all
    completed, in call order. ``skipped`` is the reason of a hook's ``Finish`` that
    ended the run before the call ran (its ``error`` says so to the model).
    """

    id: str
    name: str
    arguments: str
    input: JSON = None
    output: JSON = None
    error: str | None = None
    attempt: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    resolved: bool = False
    context_patch: JSON = None
    skipped: str | None = None


@attrs.frozen
class Turn:
    """One model round trip and the tool calls it asked for.

    ``partial`` is the model's answer so far while it still streams and calls it asked
    for have already started (eager dispatch): it ends with the last call started, and
    the final answer replaces it (or it becomes the answer when the stream was cut off).
    """

    index: int
    request: ModelRequest
    result: ModelResult | None = None
    model_attempts: int = 0
    pending: tuple[ToolCallRecord, ...] = ()
    in_flight: tuple[ToolCallRecord, ...] = ()
    completed: tuple[ToolCallRecord, ...] = ()
    partial: Message | None = None
    model: str | None = None
    """The model that answered when it is not the request's own: a model of the run's
    ``Fallback`` chain called after the request's model failed. None: the request's
    model answered (or no answer yet)."""

    @property
    def answered_by(self) -> str | None:
        """The model that gave the turn's answer (``provider/name``); None before it."""
        if self.result is None:
            return None
        return self.model if self.model is not None else self.request.model

    def call(self, call_id: str) -> ToolCallRecord | None:
        """The record of one tool call of this turn, wherever it is.

        Returns:
            The call's record (pending, in flight or completed), or None when this turn
                has no call ``call_id``.
        """
        for rec in (*self.pending, *self.in_flight, *self.completed):
            if rec.id == call_id:
                return rec
        return None


def _turn_log(turns: Iterable[Turn]) -> LazyTuple[Turn]:
    return turns if isinstance(turns, LazyTuple) else LazyTuple(turns)


def _transcript(messages: Iterable[Message]) -> LazyTuple[Message]:
    return messages if isinstance(messages, LazyTuple) else LazyTuple(messages)


UNCERTAIN = "uncertain_tool_calls"
"""Pause reason: calls were in flight when their driver stopped, and their tools are not
idempotent (``resolve_tool_call`` says what happened)."""
INPUT_REQUIRED = "input_required"
"""Pause reason: a tool asked the user a question (``ask_user``)."""
CHILD_PAUSED = "child_paused"
"""Pause reason: a child run that a ``delegate`` call waits for is paused."""
MAX_TURNS = "max_turns"
"""Pause reason: the run took its ``max_turns``."""
LIMIT_REACHED = "limit_reached"
"""Pause reason: the run reached one of its ``Limits`` (``LimitReached`` says which)."""


@attrs.frozen
class PauseInfo:
    """Why a run is paused and the state it returns to on ``resume``.

    ``details`` is what it waits for, typed (``statekernel._records.pauses``);
    ``metadata`` is their JSON view (a hook's pause: the metadata it gave).
    """

    reason: str
    resume_to: StateId
    details: PauseDetails = attrs.field(factory=HookPause)

    @property
    def metadata(self) -> JSON:
        """What the pause waits for, as JSON: the calls of an uncertain pause and their
        resolutions, a question, a paused child, the turn budget, or a hook's metadata."""
        return self.details.metadata

    @property
    def timer(self) -> PauseTimer | None:
        """When the pause ends by itself, if it does (``PauseTimer``)."""
        return timer_of(self.details)


CANCELLED = "Cancelled"
"""``FailureInfo.error`` of a run stopped by ``Kernel.cancel``."""

DEADLINE_EXCEEDED = "DeadlineExceeded"
"""``FailureInfo.error`` of a run stopped because its ``deadline`` passed."""

PAUSE_TIMED_OUT = "PauseTimedOut"
"""``FailureInfo.error`` of a run whose pause timer fired with ``on_timeout=FAIL``."""

OUTPUT_INVALID = "OutputInvalid"
"""``FailureInfo.error`` of a run whose final answer did not satisfy its ``output_spec``
after the retries it allows."""


def answer_json(text: str) -> JSON:
    """The JSON value of a final answer's text (a Markdown code fence around it is
    allowed, as models often write one); ``ValueError`` when it holds none."""
    body = text.strip()
    if body.startswith("```"):
        first, _, rest = body.partition("\n")
        if rest.rstrip().endswith("```") and first.strip("` ").lower() in ("", "json"):
            body = rest.rstrip()[:-3]
    return json.loads(body)


@attrs.frozen
class Cancellation:
    """A request to stop a run (``Kernel.cancel``): why, who asked and when. Kept by the
    store beside the run's lease until the run's owner carries it out, then in the
    run's ``FailureInfo``."""

    reason: str
    by: str
    at: datetime
    error: str = CANCELLED
    """The failure it ends the run with: ``Cancelled``, or ``DeadlineExceeded`` for the
    stop a passed ``Run.deadline`` asks for."""


@attrs.frozen
class FailureInfo:
    """What failed (error type and message) and the state a ``retry`` returns to.

    A run stopped by ``Kernel.cancel`` fails with ``error`` ``"Cancelled"``, the reason
    as ``message`` and the request in ``cancellation``."""

    error: str
    message: str
    failed_in: StateId
    cancellation: Cancellation | None = None


@attrs.frozen
class TraceParent:
    """The W3C trace context (``traceparent``, and ``tracestate`` if any) of the span that
    was current when a run was created: a drive in any process continues that trace."""

    traceparent: str
    tracestate: str | None = None


@attrs.frozen
class Run:
    """The whole durable state of one agent run at one revision.

    Runs are immutable; every transition builds the next one with ``attrs.evolve``.
    ``messages`` (the transcript) and ``turns`` only grow by appending, so revisions
    share them. Both are tuple-like ``LazyTuple`` views of append-only buffers (any
    iterable is accepted): a revision's transcript, the next revision's and every
    ``ModelRequest.messages`` taken from it share one buffer, so a run holds each
    message once however many turns sent it. In a run loaded from a store, each
    completed turn is decoded the first time it is read.
    ``event_count`` is the number of persisted events up to this revision (the next
    event's ``seq``); ``resume_value`` is what the latest ``resume`` handed in;
    ``pending_pause`` is a pause a hook asked for at the end of a turn, taken
    before the next turn starts. A child run (started by a ``delegate`` tool) names
    the run and the tool call that started it in ``parent_run_id`` and
    ``parent_call_id``. ``tags`` are the strings a listing finds it by.
    """

    run_id: str
    model: str
    revision: int = 0
    state: StateId = "init"
    context: JSON = attrs.field(factory=dict)
    messages: LazyTuple[Message] = attrs.field(converter=_transcript, factory=LazyTuple)
    turns: LazyTuple[Turn] = attrs.field(converter=_turn_log, factory=LazyTuple)
    current_turn: Turn | None = None
    pause: PauseInfo | None = None
    failure: FailureInfo | None = None
    usage: Usage = attrs.field(factory=Usage)
    max_turns: int | None = None
    resume_value: JSON = None
    pending_pause: PauseInfo | None = None
    event_count: int = 0
    created_at: datetime = attrs.field(factory=utcnow)
    updated_at: datetime = attrs.field(factory=utcnow)
    schema_version: int = SCHEMA_VERSION
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    deadline: datetime | None = None
    """When the run must be done by (``start(deadline=|timeout=)``): past it, it stops at
    the next safe point and fails with ``DeadlineExceeded``."""
    output_spec: OutputSpec | None = None
    """The typed final answer the run asks for (``start(output_type=...)``), if any."""
    trace_context: TraceParent | None = None
    """The trace context of the request that created the run (``statekernel.telemetry``)."""
    limits: Limits | None = None
    """What the run may use (``start(limits=...)``, raised by ``resume(limits=...)``):
    reaching one pauses it with reason ``limit_reached``."""
    fallback: Fallback | None = None
    """The chain of models the run calls (``start(model=Fallback(...))``); ``model`` is
    its first. None: ``model`` alone."""
    tool_calls_started: int = 0
    """Tool calls started so far (what ``Limits.tool_calls`` counts)."""
    tags: dict[str, str] = attrs.field(factory=dict)
    """Strings to find the run by (``start(tags=)``, changed with ``Kernel.update_tags``,
    filtered with ``list_runs(tags=)``); rules in ``statekernel._records.tags``."""

    @property
    def turn_count(self) -> int:
        """Completed turns plus the one in progress."""
        return len(self.turns) + (1 if self.current_turn is not None else 0)

    @property
    def last_message(self) -> Message | None:
        """The newest message of the transcript, if any."""
        return self.messages[-1] if self.messages else None

    @property
    def output(self) -> JSON:
        """The final answer of a completed run: the text of its last assistant message,
        or for a run with an ``output_spec`` the JSON value that text holds (checked
        against the schema before the run completed; ``statekernel.output_as`` gives it
        as a Python type); None for a run that has not completed."""
        if self.state != "completed":
            return None
        for message in reversed(self.messages):
            if message.role == "assistant":
                if self.output_spec is None:
                    return message.text
                return answer_json(message.text)
        return None

    def cost(self, prices: Prices) -> RunCost:
        """What the run's model answers cost at ``prices`` (``"provider/name"`` to a
        ``statekernel.telemetry.Price``), turn by turn (each at the model that answered
        it: its request's, or a ``Fallback`` chain's next).

        Returns:
            The total and each answered turn's cost.
        """
        turns = [*self.turns, self.current_turn] if self.current_turn else self.turns
        answered = (
            (t.index, t.answered_by or t.request.model, t.result.usage)
            for t in turns
            if t.result is not None
        )
        return turns_cost(answered, prices)

    @property
    def is_terminal(self) -> bool:
        """True when nothing runs until someone acts (paused, failed or completed)."""
        return self.state in ("paused", "failed", "completed")
