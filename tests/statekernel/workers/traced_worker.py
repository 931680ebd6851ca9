"""A worker process whose spans go to a file, for ``test_worker_telemetry.py``:
``python traced_worker.py STORE_URL QUEUE SPANS_FILE RUN_ID`` serves ``QUEUE`` until run
``RUN_ID`` is completed, then stops. Each finished span is a JSON line: its name, trace
id, span id, parent span id, linked span ids and attributes. The agent asks a
``researcher`` delegate (a child run, driven in this process) and answers."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import statekernel as sk
from statekernel.telemetry import set_tracer_provider
from statekernel.testing import ScriptedProvider, call


class FileExporter(SpanExporter):
    """Appends each span to a file as a JSON line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                assert span.context is not None
                line = {
                    "name": span.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "span_id": f"{span.context.span_id:016x}",
                    "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
                    "links": [f"{link.context.span_id:016x}" for link in span.links],
                    "attributes": {k: str(v) for k, v in (span.attributes or {}).items()},
                }
                out.write(json.dumps(line) + "\n")
        return SpanExportResult.SUCCESS


async def main(url: str, queue: str, spans: Path, run_id: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(spans)))
    set_tracer_provider(provider)
    researcher = sk.delegate("researcher", "Find a fact.", model="helper/small")
    providers = {
        "scripted": ScriptedProvider([call("researcher", {"task": "?"}, id="d1"), "It is 42."]),
        "helper": ScriptedProvider(["found: 42"]),
    }
    worker = sk.Worker(
        url,
        queue=queue,
        agent={"tools": [researcher], "providers": providers},
        lease_ttl=5.0,
        block=0.05,
    )
    serving = asyncio.create_task(worker.serve())
    async with sk.Kernel(url, providers=providers) as kernel:
        while (await kernel.get(run_id)).state != "completed":
            assert not serving.done(), "the worker stopped"
            await asyncio.sleep(0.05)
    worker.stop()
    await serving
    provider.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]))
