"""Workers and telemetry: a run submitted under a span and driven by a worker in another
process continues that span's trace (its child run too); a worker reports how long
entries waited and how deep its queue is."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import statekernel as sk
from statekernel.testing import ScriptedProvider

from ..kernel.test_metrics import points
from .traced import exported, serve_traced

pytestmark = pytest.mark.redis


async def test_a_worker_in_another_process_continues_the_trace_of_the_request(
    redis_store_url: str, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    app = TracerProvider()
    app.add_span_processor(SimpleSpanProcessor(spans))
    tracer = app.get_tracer("app")
    async with sk.Kernel(redis_store_url, providers={"scripted": ScriptedProvider([])}) as k:
        with tracer.start_as_current_span("request") as request:
            run = await k.start(model="scripted/lead", messages=["ask"], run_id="lead")
            await k.submit(run.run_id, queue="traced")
    origin = request.get_span_context()
    written = tmp_path / "spans.jsonl"
    await serve_traced(redis_store_url, "traced", written, "lead")
    spans_of_worker = exported(written)
    drives = {
        s["attributes"]["statekernel.run.id"]: s
        for s in spans_of_worker
        if s["name"].startswith("invoke_agent")
    }
    trace_id, span_id = f"{origin.trace_id:032x}", f"{origin.span_id:016x}"
    lead = drives["lead"]
    assert (lead["trace_id"], lead["parent_id"]) == (trace_id, span_id)
    assert lead["attributes"]["gen_ai.conversation.id"] == "lead"
    assert {s["trace_id"] for s in spans_of_worker} == {trace_id}  # every span of the worker's
    [tool] = [s for s in spans_of_worker if s["name"] == "execute_tool researcher"]
    child = drives["lead.d1"]
    assert child["parent_id"] == tool["span_id"]  # the child run's drive, under its call
    chats = [s for s in spans_of_worker if s["name"].startswith("chat ")]
    assert {s["parent_id"] for s in chats} == {lead["span_id"], child["span_id"]}


async def test_a_worker_reports_queue_wait_and_depth(
    redis_store_url: str, metrics: InMemoryMetricReader
) -> None:
    providers = {"scripted": ScriptedProvider(["Done."] * 3)}
    async with sk.Kernel(redis_store_url, providers=providers) as kernel:
        ids = []
        for i in range(3):
            run = await kernel.start(model="scripted/m", messages=["go"], run_id=f"run-{i}")
            await kernel.submit(run.run_id, queue="measured")
            ids.append(run.run_id)
        worker = sk.Worker(
            kernel.store,
            queue="measured",
            agent={"providers": providers},
            lease_ttl=1.5,
            block=0.05,
        )
        task = asyncio.create_task(worker.serve())

        def depth() -> list[Any]:
            return points(metrics, "statekernel.queue.depth")

        async def done() -> bool:
            return [(await kernel.get(i)).state for i in ids] == ["completed"] * len(ids)

        # the first reading that has the gauge: an older SDK reports a gauge only in the
        # collection after a value was recorded
        sampled: list[Any] = []
        while not (sampled and await done()):
            sampled = sampled or depth()
            assert not task.done(), "the worker stopped"
            await asyncio.sleep(0.02)
        worker.stop()
        await task
    [(attributes, waited)] = points(metrics, "statekernel.queue.wait")
    assert attributes == {"statekernel.queue.name": "measured"}
    assert waited.count == 3
    assert waited.sum >= 0
    [(attributes, _)] = sampled
    assert attributes == {"statekernel.queue.name": "measured"}
