"""OpenTelemetry: a run's spans sent to an exporter.

statekernel reports through ``opentelemetry-api``; what receives the spans is the SDK
you configure. Here the SDK's ``ConsoleSpanExporter`` behind a ``BatchSpanProcessor``
(swap in ``OTLPSpanExporter`` from ``opentelemetry-exporter-otlp`` to send them to a
collector, Jaeger, Honeycomb...). Each span is printed as one JSON object per line:
the drive (``invoke_agent <model>``), its commits, the model call (``chat <model>``)
and the tool call (``execute_tool <name>``). Run it with ``python
examples/otel_export.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

import statekernel as sk
from statekernel.telemetry import set_tracer_provider
from statekernel.testing import ScriptedProvider, call


@sk.tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def one_line(span: ReadableSpan) -> str:
    return json.dumps(json.loads(span.to_json())) + "\n"


async def main() -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(
        BatchSpanProcessor(ConsoleSpanExporter(out=sys.stdout, formatter=one_line))
    )
    set_tracer_provider(provider)
    model = ScriptedProvider([call("weather", {"city": "Paris"}), "Sunny in Paris."])
    async with sk.Kernel("memory://", tools=[weather], providers={"scripted": model}) as kernel:
        run = await kernel.start(model="scripted/weather", messages=["Weather in Paris?"])
        async for _ in kernel.run(run.run_id):
            pass
    provider.shutdown()  # flushes the batch to the exporter


if __name__ == "__main__":
    asyncio.run(main())
