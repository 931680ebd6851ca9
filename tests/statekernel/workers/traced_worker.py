"""A worker process whose spans go to a file, for ``test_worker_telemetry.py`` and
``test_worker_submit_trace.py``: ``python traced_worker.py STORE_URL QUEUE SPANS_FILE
RUN_ID [CHILD_QUEUE]`` serves ``QUEUE`` until run ``RUN_ID`` exists and is completed,
then stops. Each finished span is a JSON line: its name, trace id, span id, parent span
id, linked span ids and attributes. The agent asks a ``researcher`` delegate and
answers; the delegate's child run is driven in this process, or with ``CHILD_QUEUE`` by
the workers of that queue (another such process)."""

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


async def main(url: str, queue: str, spans: Path, run_id: str, child_queue: str | None) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(spans)))
    set_tracer_provider(provider)
    researcher = sk.delegate(
        "researcher", "Find a fact.", model="helper/small", queue=child_queue, poll=0.05
    )
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
        while not await _completed(kernel, run_id):
            assert not serving.done(), "the worker stopped"
            await asyncio.sleep(0.05)
    worker.stop()
    await serving
    provider.shutdown()


async def _completed(kernel: sk.Kernel, run_id: str) -> bool:
    try:
        return (await kernel.get(run_id)).state == "completed"
    except sk.RunNotFound:  # a child run its parent's worker has not started yet
        return False


if __name__ == "__main__":
    child_queue = sys.argv[5] if len(sys.argv) > 5 else None
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], child_queue))
