"""OpenTelemetry spans and metrics of runs, the trace context runs carry, and what their
model calls cost.

Spans go to the global tracer provider, or to the one given to
:func:`set_tracer_provider`; metrics to the global meter provider, or to the one given
to :func:`set_meter_provider`. Without ``opentelemetry-api`` installed, none are made
and runs carry no trace context. A price table (``Kernel(prices={...: Price(...)})``)
prices each model answer (spans, the ``statekernel.cost`` metric) and ``Run.cost``.
"""

from __future__ import annotations

from statekernel._kernel.metrics import set_meter_provider
from statekernel._kernel.telemetry import set_tracer_provider
from statekernel._records.prices import Price, Prices, RunCost, TurnCost
from statekernel._records.run import TraceParent

__all__ = [
    "Price",
    "Prices",
    "RunCost",
    "TraceParent",
    "TurnCost",
    "set_meter_provider",
    "set_tracer_provider",
]
