"""The W3C trace context a run carries (``Run.trace_context``): taken from the span
current when the run is created (``Kernel.start``, ``start_and_run``, a child run's
creation), and turned back into an OpenTelemetry context by the drive that continues
the trace, in whatever process. A queue entry carries the one of the span current where
it was submitted (``QueueEntry.trace``): the worker that takes it drives the run with
that context current (``attached``). Only ``traceparent`` and ``tracestate`` travel (the
W3C Trace Context propagator of ``opentelemetry-api``), never baggage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from statekernel._records.run import TraceParent

try:
    from opentelemetry import context as _context
    from opentelemetry.trace import get_current_span, set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: runs carry no trace context
    ENABLED = False
else:
    ENABLED = True
    _W3C = TraceContextTextMapPropagator()

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = ["attached", "current", "extracted"]


def current() -> TraceParent | None:
    """The trace context of the current span, if there is a valid one."""
    if not ENABLED or not get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return None
    return TraceParent(traceparent, carrier.get("tracestate") or None)


def extracted(trace: TraceParent | None) -> Context | None:
    """An OpenTelemetry context whose (remote) span is the one ``trace`` names, or None
    (no trace context, or one that does not parse)."""
    if not ENABLED or trace is None:
        return None
    carrier = {"traceparent": trace.traceparent}
    if trace.tracestate is not None:
        carrier["tracestate"] = trace.tracestate
    context = _W3C.extract(carrier)
    return context if get_current_span(context).get_span_context().is_valid else None


@contextlib.contextmanager
def attached(trace: TraceParent | None) -> Iterator[None]:
    """Make the span ``trace`` names the current one inside the block (in this task; the
    rest of the current context is kept); nothing changes for no trace context, or one
    that does not parse."""
    context = extracted(trace)
    if context is None:
        yield
        return
    token = _context.attach(set_span_in_context(get_current_span(context)))
    try:
        yield
    finally:
        _context.detach(token)
