"""Observability of runs: OpenTelemetry spans, through ``opentelemetry-api`` only.

Spans of the tracer ``statekernel`` (``set_tracer_provider`` picks its provider):

``statekernel.drive``
    one per ``Kernel.run``: ``statekernel.run.id``, ``statekernel.run.model``, and when
    the drive ends ``statekernel.run.state`` and ``statekernel.run.revision``.
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
    ``gen_ai.usage.output_tokens`` and the cache counts.
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

Without ``opentelemetry-api`` (the ``otel`` extra) every helper is a no-op; with the
API but no SDK configured, spans are the API's non-recording ones.

Log records (standard ``logging``, logger ``statekernel``, written by the driver and the
kernel) carry ``run_id`` and ``revision`` as fields (``extra``): DEBUG for each commit
(with ``events`` and ``state``), INFO for a run coming to rest (``state``, ``reason``),
WARNING for a commit tried again after a store error (``attempt``) and a lease lost.
"""

from __future__ import annotations

import traceback
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeAlias

from statekernel._secrets import redact
from statekernel.errors import ProviderError

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed: every helper is a no-op
    ENABLED = False
else:
    ENABLED = True

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from statekernel._kernel.tools import Tool
    from statekernel._records.messages import ModelRequest, ModelResult
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
    "set_tracer_provider",
    "tool_span",
]

TraceContext: TypeAlias = "Context"
"""An OpenTelemetry context: the parent of the spans a driver starts."""

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
    """What a drive's span reads from the driver (``RunDriver`` is one): its run, and
    the trace context its commits, model calls and tool calls are parented under."""

    trace_parent: TraceContext | None

    @property
    def run(self) -> Run:
        """The driver's run as last committed or staged."""
        ...


class DriveSpan(_Scope):
    """The span of one drive (``Kernel.run``)."""

    def __init__(self, span: Span | None) -> None:
        super().__init__(span)
        self._driver: Driven | None = None
        self._parent: TraceContext | None = None

    def watch(self, driver: Driven) -> None:
        """Parent the driver's model, tool and commit spans under this drive until it ends."""
        self._driver = driver
        if self.span is not None:
            self.span.set_attribute("statekernel.run.model", driver.run.model)
            self._parent = driver.trace_parent = _trace.set_span_in_context(self.span)

    def _ending(self, span: Span) -> None:
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
        try:
            super().__exit__(exc_type, exc, tb)
        finally:  # unless a later drive of the run has it already
            if driver is not None and driver.trace_parent is self._parent:
                driver.trace_parent = None


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
    """The span of one model call (GenAI ``chat``)."""

    def answered(self, result: ModelResult) -> None:
        """Record the response: its model, finish reason and token usage."""
        span = self.span
        if span is None or not span.is_recording():
            return
        usage = result.usage
        attributes: dict[str, Any] = {
            "gen_ai.response.finish_reasons": [result.finish_reason],
            "gen_ai.usage.input_tokens": (
                usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
            ),
            "gen_ai.usage.output_tokens": usage.output_tokens,
        }
        if result.model:
            attributes["gen_ai.response.model"] = result.model
        if usage.cache_read_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
        if usage.cache_write_tokens:
            attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
        span.set_attributes(attributes)


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
    """A span for a drive of the run, child of the caller's current span (not made
    current itself); ``watch`` the driver once it is known."""
    if not ENABLED:
        return DriveSpan(None)
    attributes = {"statekernel.run.id": run_id}
    return DriveSpan(_start("statekernel.drive", None, SpanKind.INTERNAL, attributes))


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
        return ModelSpan(None)
    provider, name = request.provider, request.model_name
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": _PROVIDER_NAMES.get(provider, provider),
        "gen_ai.request.model": name,
        "gen_ai.conversation.id": run_id,
        "statekernel.run.id": run_id,
    }
    if request.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = request.max_tokens
    if request.temperature is not None:
        attributes["gen_ai.request.temperature"] = request.temperature
    span = _start(f"chat {name}", parent, SpanKind.CLIENT, attributes)
    return ModelSpan(span, current=True)


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
