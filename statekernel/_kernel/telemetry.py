"""Observability of runs: OpenTelemetry spans, through ``opentelemetry-api`` only.

Spans of the tracer ``statekernel`` (``set_tracer_provider`` picks its provider):

``invoke_agent {model}``
    one per ``Kernel.run`` (a drive), after the OpenTelemetry GenAI semantic conventions:
    ``gen_ai.operation.name`` = ``invoke_agent``, ``gen_ai.agent.name`` (the run's
    model, ``provider/name``), ``gen_ai.conversation.id`` (the run id),
    ``gen_ai.provider.name``, ``gen_ai.request.model``, ``statekernel.run.id``,
    ``statekernel.run.model``; ``statekernel.lease.taken_from`` (the owner whose lease the
    drive took over: it had expired, or that owner was found dead) and
    ``statekernel.takeover.of`` (what of another drive's work it found in flight, when it
    took a lease over or found intents in flight: ``model_call``, ``tool_calls``,
    ``none``); when the drive ends ``gen_ai.usage.input_tokens`` and
    ``gen_ai.usage.output_tokens`` (the drive's model answers), ``statekernel.cost``
    (with a price table), ``statekernel.run.state`` and ``statekernel.run.revision``.
    Its parent is the caller's current span (a worker's: the span of the request that
    submitted the run, carried by the queue entry); without one, the span the run was
    created under (``Run.trace_context``, in any process) for the run's first drive; a
    later drive starts a trace of its own with a link to that span (as does a drive
    under a caller's span of another trace).
``statekernel.commit``
    one per commit a driver lands (a batch of transitions, or a command's change):
    ``statekernel.run.id``, ``statekernel.revision`` (the new one), ``statekernel.run.state``,
    ``statekernel.commit.events`` (how many), ``statekernel.commit.event_types``,
    ``statekernel.commit.attempts`` and ``statekernel.commit.retried`` (it landed after
    a store error).
``chat {model}``
    one per call of a provider, after the OpenTelemetry GenAI semantic conventions:
    ``gen_ai.operation.name`` = ``chat``, ``gen_ai.provider.name``,
    ``gen_ai.request.model``, ``gen_ai.conversation.id`` (the run id),
    ``gen_ai.response.model``, ``gen_ai.response.finish_reasons``,
    ``gen_ai.usage.input_tokens`` (cached tokens included, as the conventions ask),
    ``gen_ai.usage.output_tokens``, the cache counts and ``statekernel.cost``.
``execute_tool {name}``
    one per execution of a tool call: ``gen_ai.operation.name`` = ``execute_tool``,
    ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type`` = ``function``,
    ``statekernel.tool.attempt``, ``statekernel.tool.idempotent`` and
    ``statekernel.tool.outcome``: ``ok``, ``error``, ``asked`` (it raised
    ``NeedsInput``), ``child_paused`` (its child run paused) or ``cancelled``.

An exception that ends a span's work sets its status to ERROR with ``error.type`` (the
exception's class, or a provider's HTTP status); a cancellation does not. A tool that
fails is an error result for the model, and an ERROR span.

The model, tool and commit spans of a drive are children of the drive's span. That span
is never made current in the caller's context (``Kernel.run`` is a generator: its span
would leak into the caller's code between two events): the driver passes it on as the
parent explicitly. A model or tool span is current while its call runs (each runs in a
task of its own), so spans started by a provider's HTTP client, by a tool or by a child
run nest under it.

Metrics (``statekernel._kernel.metrics``) are recorded beside the spans.

Without ``opentelemetry-api`` (the ``otel`` extra) every helper is a no-op; with the
API but no SDK configured, spans are the API's non-recording ones.

Log records (standard ``logging``, logger ``statekernel``, written by the driver and the
kernel) carry ``run_id`` and ``revision`` as fields (``extra``): DEBUG for each commit
(with ``events`` and ``state``), INFO for a run coming to rest (``state``, ``reason``),
WARNING for a commit tried again after a store error (``attempt``) and a lease lost.
"""

from __future__ import annotations

import time
import traceback
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeAlias

from statekernel._kernel import metrics, propagation
from statekernel._records.prices import priced
from statekernel._secrets import redact
from statekernel.errors import ProviderError

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed: every helper is a no-op
    ENABLED = False
else:
    ENABLED = True

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from statekernel._kernel.tenure import Tenure
    from statekernel._kernel.tools import Tool
    from statekernel._records.messages import ModelRequest, ModelResult, Usage
    from statekernel._records.prices import Prices
    from statekernel._records.run import Run, ToolCallRecord
    from statekernel._storage.protocol import Checkpoint

__all__ = [
    "ENABLED",
    "CommitSpan",
    "DriveSpan",
    "ModelSpan",
    "ToolSpan",
    "TraceContext",
    "commit_span",
    "drive_span",
    "model_span",
    "record_takeover",
    "set_tracer_provider",
    "tool_span",
]

TraceContext: TypeAlias = "Context"
"""An OpenTelemetry context: the parent of the spans a driver starts."""

_DRIVE = "statekernel.drive"
"""The key of the drive's ``DriveSpan`` in the context its calls are parented under."""

_provider: TracerProvider | None = None
_tracer: Tracer | None = None

# statekernel's provider prefixes whose GenAI name differs (the conventions' well-known values)
_PROVIDER_NAMES = {
    "azure": "azure.ai.openai",
    "google": "gcp.gemini",
    "mistral": "mistral_ai",
    "xai": "x_ai",
}


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Send statekernel's spans to ``provider`` (an OpenTelemetry ``TracerProvider``)
    rather than to OpenTelemetry's global one; None goes back to the global provider.

    Without this, spans go to the provider set with ``opentelemetry.trace.
    set_tracer_provider``, also when it is set after statekernel was imported. Spans
    need ``opentelemetry-api`` (``pip install 'statekernel[otel]'``) and an SDK.
    """
    global _provider, _tracer
    _provider, _tracer = provider, None


def _get_tracer() -> Tracer:
    global _tracer
    if _tracer is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            release: str | None = version("statekernel")
        except PackageNotFoundError:
            release = None
        _tracer = _trace.get_tracer("statekernel", release, tracer_provider=_provider)
    return _tracer


def _start(
    name: str, parent: TraceContext | None, kind: SpanKind, attributes: dict[str, Any]
) -> Span:
    return _get_tracer().start_span(name, context=parent, kind=kind, attributes=attributes)


def _error_type(exc: BaseException) -> str:
    if isinstance(exc, ProviderError) and exc.status is not None:
        return str(exc.status)
    return type(exc).__qualname__


def _fail(span: Span, exc: BaseException) -> None:
    """The span ends in ERROR; its ``exception`` event (OTel's semantic conventions)
    carries the message and stack trace redacted, unlike ``record_exception``."""
    kind = type(exc)
    trace = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    span.add_event(
        "exception",
        {
            "exception.type": f"{kind.__module__}.{kind.__qualname__}",
            "exception.message": redact(str(exc)),
            "exception.stacktrace": redact(trace),
        },
    )
    span.set_status(Status(StatusCode.ERROR, redact(f"{kind.__name__}: {exc}")))
    span.set_attribute("error.type", _error_type(exc))


class _Scope:
    """A span (None without OpenTelemetry) that a ``with`` block ends; an ``Exception``
    leaving the block sets its status to ERROR. ``current``: the span is the current one
    inside the block (only for a block that stays in one task, never across a yield)."""

    def __init__(self, span: Span | None, *, current: bool = False) -> None:
        self.span = span
        self._current = current
        self._token: Token[TraceContext] | None = None

    def __enter__(self) -> Self:
        if self.span is not None and self._current:
            self._token = _context.attach(_trace.set_span_in_context(self.span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self.span
        if span is None:
            return
        try:
            if isinstance(exc, Exception):
                _fail(span, exc)
            if span.is_recording():
                self._ending(span)
        finally:
            if self._token is not None:
                _context.detach(self._token)
            span.end()

    def _ending(self, span: Span) -> None:
        """Set the attributes known when the span ends."""


class Driven(Protocol):
    """What a drive's span reads from the driver (``RunDriver`` is one): its run, its
    lease (``tenure``: whose lease it took over), and the trace context its commits,
    model calls and tool calls are parented under."""

    trace_parent: TraceContext | None
    tenure: Tenure | None

    @property
    def run(self) -> Run:
        """The driver's run as last committed or staged."""
        ...


class DriveSpan(_Scope):
    """The ``invoke_agent`` span of one drive (``Kernel.run``), opened once the drive has
    its run (``watch``), with the time the drive started. Its parent: the caller's
    current span; without one, the span the run was created under (``Run.trace_context``)
    for the run's first drive, else none (a new trace) with a link to that span."""

    def __init__(self, run_id: str, caller: TraceContext | None, start_ns: int) -> None:
        super().__init__(None)
        self._run_id = run_id
        self._caller = caller
        self._start_ns = start_ns
        self._started = time.perf_counter()
        self._driver: Driven | None = None
        self._parent: TraceContext | None = None
        self._model: str | None = None
        self.input_tokens = 0
        """Input tokens of the drive's model answers (cache reads and writes included)."""
        self.output_tokens = 0
        """Output tokens of the drive's model answers."""
        self.cost: float | None = None
        """What the drive's model answers cost at the kernel's prices (None: none priced)."""

    def watch(self, driver: Driven) -> None:
        """Open the span and parent the driver's model, tool and commit spans under it
        until it ends."""
        self._driver = driver
        run = driver.run
        self._model = run.model
        taken_from = None if driver.tenure is None else driver.tenure.takeover()
        found = record_takeover(run, taken_from, drive=True)
        if ENABLED:
            took: dict[str, Any] = {}
            if taken_from is not None:
                took["statekernel.lease.taken_from"] = taken_from
            if found is not None:
                took["statekernel.takeover.of"] = found
            self.span = self._open(run, took)
            context = _trace.set_span_in_context(self.span)
            self._parent = driver.trace_parent = _context.set_value(_DRIVE, self, context)

    def _open(self, run: Run | None, took: dict[str, Any] | None = None) -> Span:
        run_id = self._run_id
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": run_id,
            "statekernel.run.id": run_id,
            **(took or {}),
        }
        name = "invoke_agent"
        if run is not None:
            attributes.update(_model_attributes(run.model))
            attributes["gen_ai.agent.name"] = run.model
            attributes["statekernel.run.model"] = run.model
            name = f"invoke_agent {run.model}"
        parent, links = _drive_parent(self._caller, run)
        return _get_tracer().start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=self._start_ns,
        )

    def answered(self, usage: Usage, cost: float | None) -> None:
        """Add a model answer's usage and cost to the drive's totals."""
        self.input_tokens += usage.input_tokens + usage.cache_read_tokens
        self.input_tokens += usage.cache_write_tokens
        self.output_tokens += usage.output_tokens
        if cost is not None:
            self.cost = cost if self.cost is None else self.cost + cost

    def _ending(self, span: Span) -> None:
        span.set_attribute("gen_ai.usage.input_tokens", self.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", self.output_tokens)
        if self.cost is not None:
            span.set_attribute("statekernel.cost", self.cost)
        driver = self._driver
        if driver is None:
            return
        span.set_attribute("statekernel.run.state", driver.run.state)
        span.set_attribute("statekernel.run.revision", driver.run.revision)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        driver = self._driver
        if ENABLED and self.span is None:  # it ended before it had its run
            self.span = self._open(None)
        try:
            super().__exit__(exc_type, exc, tb)
            attributes = {"gen_ai.operation.name": "invoke_agent"}
            if self._model is not None:
                attributes.update(_model_attributes(self._model))
            _record_duration(self._started, attributes, exc)
        finally:  # unless a later drive of the run has it already
            if driver is not None and driver.trace_parent is self._parent:
                driver.trace_parent = None


def taken_over(run: Run) -> str | None:
    """What of another drive's work a drive starting at ``run`` finds in flight (its
    committed intent to call the model, ``model_call``; tool calls started and not
    completed, ``tool_calls``, unless ``resume`` handed in a resolution of each), or
    None."""
    turn = run.current_turn
    if turn is None:
        return None
    if run.state == "calling_model" and turn.model_attempts and turn.result is None:
        return "model_call"
    if run.state == "dispatching_tools":
        given = run.resume_value.get("resolutions") if isinstance(run.resume_value, dict) else None
        answered = given if isinstance(given, dict) else {}
        if any(record.id not in answered for record in turn.in_flight):
            return "tool_calls"
    return None


def record_takeover(run: Run, taken_from: str | None, *, drive: bool = False) -> str | None:
    """Count in ``statekernel.takeovers`` a lease taken over from ``taken_from`` by a drive
    or a command starting at ``run`` (``statekernel.takeover.kind`` ``lease``), or a
    ``drive`` that found another drive's intents in flight under a lease it did not take
    over (``in_flight``); what was in flight (``statekernel.takeover.of``: ``model_call``,
    ``tool_calls``, ``none``), or None when nothing was counted."""
    found = taken_over(run)
    if taken_from is None and (found is None or not drive):
        return None
    of = "none" if found is None else found
    made = metrics.instruments()
    if made is not None:
        kind = "in_flight" if taken_from is None else "lease"
        made.takeovers.add(1, {"statekernel.takeover.kind": kind, "statekernel.takeover.of": of})
    return of


def _drive_parent(caller: TraceContext | None, run: Run | None) -> tuple[Any, list[Link]]:
    """The parent context and links of a drive's span (see ``DriveSpan``)."""
    stored = None if run is None else propagation.extracted(run.trace_context)
    origin = None if stored is None else _trace.get_current_span(stored).get_span_context()
    current = _trace.get_current_span(caller).get_span_context()
    if current.is_valid:
        if origin is not None and origin.trace_id != current.trace_id:
            return caller, [Link(origin)]
        return caller, []
    if run is not None and stored is not None and origin is not None:
        if run.revision == 0:  # its first drive: part of the request that created it
            return stored, []
        return _context.Context(), [Link(origin)]  # a new trace, linked to the request
    return caller, []


def _record_duration(started: float, attributes: dict[str, Any], exc: BaseException | None) -> None:
    made = metrics.instruments()
    if made is None:
        return
    if isinstance(exc, Exception):
        attributes["error.type"] = _error_type(exc)
    made.operation_duration.record(time.perf_counter() - started, attributes)


def _model_attributes(model: str) -> dict[str, Any]:
    provider, _, name = model.partition("/")
    return {
        "gen_ai.provider.name": _PROVIDER_NAMES.get(provider, provider),
        "gen_ai.request.model": name,
    }


class CommitSpan(_Scope):
    """The span of one commit; ``attempts`` counts the store attempts made for it."""

    attempts = 1

    def failed(self, exc: BaseException) -> None:
        """The commit did not land because of ``exc`` (an ``Exception`` sets the status
        to ERROR, as one leaving the block does)."""
        if self.span is not None and isinstance(exc, Exception):
            _fail(self.span, exc)

    def _ending(self, span: Span) -> None:
        span.set_attribute("statekernel.commit.attempts", self.attempts)
        span.set_attribute("statekernel.commit.retried", self.attempts > 1)


class ModelSpan(_Scope):
    """The span of one model call (GenAI ``chat``), and its metrics."""

    def __init__(self, span: Span | None, parent: TraceContext | None, model: str) -> None:
        super().__init__(span, current=True)
        self._drive = None if parent is None else _context.get_value(_DRIVE, parent)
        self._model = model
        self._started = time.perf_counter()

    def answered(self, result: ModelResult, prices: Prices | None = None) -> None:
        """Record the response: its model, finish reason and token usage, and its cost
        at ``prices`` (when they have the model's price)."""
        usage = result.usage
        cost = usage.cost if prices is None else priced(usage, self._model, prices).cost
        if isinstance(self._drive, DriveSpan):
            self._drive.answered(usage, cost)
        input_tokens = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        made = metrics.instruments()
        if made is not None:
            attributes = {"gen_ai.operation.name": "chat", **_model_attributes(self._model)}
            if result.model:
                attributes["gen_ai.response.model"] = result.model
            made.token_usage.record(input_tokens, {**attributes, "gen_ai.token.type": "input"})
            made.token_usage.record(
                usage.output_tokens, {**attributes, "gen_ai.token.type": "output"}
            )
            if cost is not None:
                made.cost.add(cost, attributes)
        span = self.span
        if span is None or not span.is_recording():
            return
        attributes = {
            "gen_ai.response.finish_reasons": [result.finish_reason],
            "gen_ai.usage.input_tokens": input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
        }
        if result.model:
            attributes["gen_ai.response.model"] = result.model
        if usage.cache_read_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
        if usage.cache_write_tokens:
            attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
        if cost is not None:
            attributes["statekernel.cost"] = cost
        span.set_attributes(attributes)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            attributes = {"gen_ai.operation.name": "chat", **_model_attributes(self._model)}
            _record_duration(self._started, attributes, exc)


class _Result(Protocol):
    """A tool call's outcome as the driver holds it."""

    @property
    def error(self) -> str | None: ...
    @property
    def asked(self) -> dict[str, Any] | None: ...
    @property
    def child(self) -> str | None: ...


class ToolSpan(_Scope):
    """The span of one tool call's execution (GenAI ``execute_tool``)."""

    outcome = "cancelled"
    """``ok``, ``error``, ``asked``, ``child_paused``; ``cancelled`` until settled."""
    _failed = False

    def failed(self, exc: BaseException) -> None:
        """The tool (or its middleware) raised ``exc``: an error result."""
        self._failed = True
        if self.span is not None:
            _fail(self.span, exc)

    def settle(self, result: _Result) -> None:
        """Record how the call ended."""
        if result.asked is not None:
            self.outcome = "asked"
        elif result.child is not None:
            self.outcome = "child_paused"
        elif result.error is not None:
            self.outcome = "error"
            span = self.span
            if span is not None and not self._failed:
                span.set_status(
                    Status(StatusCode.ERROR, redact(result.error))
                )  # an output not JSON
                span.set_attribute("error.type", "invalid_output")
        else:
            self.outcome = "ok"

    def _ending(self, span: Span) -> None:
        span.set_attribute("statekernel.tool.outcome", self.outcome)


def drive_span(run_id: str) -> DriveSpan:
    """The ``invoke_agent`` span of a drive of the run, started now and opened once the
    driver is known (``watch``); never made current itself."""
    return DriveSpan(run_id, _context.get_current() if ENABLED else None, time.time_ns())


def commit_span(
    parent: TraceContext | None, checkpoint: Checkpoint, *, traced: bool = True
) -> CommitSpan:
    """A span for landing ``checkpoint`` (under ``parent``, else the current span);
    none unless ``traced`` (the commit that creates a run has none)."""
    if not (ENABLED and traced):
        return CommitSpan(None)
    run = checkpoint.run
    attributes = {
        "statekernel.run.id": run.run_id,
        "statekernel.revision": run.revision,
        "statekernel.run.state": run.state,
        "statekernel.commit.events": len(checkpoint.events),
        "statekernel.commit.event_types": [event.type for event in checkpoint.events],
    }
    return CommitSpan(_start("statekernel.commit", parent, SpanKind.INTERNAL, attributes))


def model_span(parent: TraceContext | None, run_id: str, request: ModelRequest) -> ModelSpan:
    """A span for one model call, current inside the block (run it in one task)."""
    if not ENABLED:
        return ModelSpan(None, None, request.model)
    name = request.model_name
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        **_model_attributes(request.model),
        "gen_ai.conversation.id": run_id,
        "statekernel.run.id": run_id,
    }
    if request.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = request.max_tokens
    if request.temperature is not None:
        attributes["gen_ai.request.temperature"] = request.temperature
    span = _start(f"chat {name}", parent, SpanKind.CLIENT, attributes)
    return ModelSpan(span, parent, request.model)


def tool_span(
    parent: TraceContext | None,
    run_id: str,
    record: ToolCallRecord,
    tool: Tool,
    ids: tuple[str, ...],
) -> ToolSpan:
    """A span for executing a tool call (``ids``: the identical calls it runs for), current
    inside the block (run it in one task)."""
    if not ENABLED:
        return ToolSpan(None)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": record.name,
        "gen_ai.tool.call.id": record.id,
        "gen_ai.tool.type": "function",
        "statekernel.run.id": run_id,
        "statekernel.tool.attempt": record.attempt,
        "statekernel.tool.idempotent": tool.idempotent,
    }
    if tool.spec.description:
        attributes["gen_ai.tool.description"] = tool.spec.description
    if len(ids) > 1:
        attributes["statekernel.tool.call_ids"] = list(ids)  # identical calls merged
    span = _start(f"execute_tool {record.name}", parent, SpanKind.INTERNAL, attributes)
    return ToolSpan(span, current=True)
