"""OpenTelemetry spans for drives, commits, model calls and tool calls.

Spans go to the global tracer provider, or to the one given to
:func:`set_tracer_provider`; without ``opentelemetry-api`` installed, none are made.
"""

from __future__ import annotations

from statekernel._kernel.telemetry import set_tracer_provider

__all__ = ["set_tracer_provider"]
