"""A run driven by a worker continues the trace of the request that *submitted* it: the
queue entry carries that request's trace context, so the worker's ``invoke_agent`` span
is its child, linked to the request that created the run when that is another trace. A
child run handed to another queue's workers stays in that trace, under its tool call.
An entry without a trace context (written by the release before) or with one that does
not parse is driven as before: under the run's creation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Receive, Scope, Send

import statekernel as sk
from statekernel._storage.protocol import CheckpointStore
from statekernel._storage.queues import RunQueues
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.stores.redis._queue import RedisRunQueue
from statekernel.testing import ScriptedProvider

from .traced import exported, serve_traced

UPSTREAM_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
UPSTREAM_SPAN = "00f067aa0ba902b7"


class Traced:
    """ASGI middleware: each HTTP request runs under a server span of ``tracer``, the
    child of the request's ``traceparent`` header when it has one."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        parent = TraceContextTextMapPropagator().extract(headers)
        name = f"{scope['method']} {scope['path']}"
        with self.tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER):
            await self.app(scope, receive, send)


def runs_app(kernel: sk.Kernel, provider: TracerProvider) -> FastAPI:
    """An application that starts runs and submits them to workers."""
    app = FastAPI()
    app.add_middleware(Traced, tracer=provider.get_tracer("app"))

    @app.post("/runs")
    async def start() -> dict[str, str]:
        run = await kernel.start(model="scripted/lead", messages=["ask"], run_id="lead")
        return {"run_id": run.run_id}

    @app.post("/runs/{run_id}/submit")
    async def submit(run_id: str, queue: str) -> dict[str, str]:
        return {"entry": await kernel.submit(run_id, queue=queue)}

    return app


def _ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


async def test_a_worker_drives_a_run_under_the_request_that_submitted_it(
    feed_store_url: str, tmp_path: Path
) -> None:
    """Request 1 starts the run, request 2 (of another trace, continued from its
    ``traceparent`` header) submits it. The worker's drive is request 2's child, linked
    to request 1; its tool's child run, driven by a worker of another queue in another
    process, is in the same trace under the tool call."""
    requests = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(requests))
    async with sk.Kernel(feed_store_url, providers={"scripted": ScriptedProvider([])}) as kernel:
        app = runs_app(kernel, provider)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            started = await client.post("/runs")
            assert started.status_code == 200, started.text
            upstream = {"traceparent": f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01"}
            submitted = await client.post(
                "/runs/lead/submit", params={"queue": "leads"}, headers=upstream
            )
            assert submitted.status_code == 200, submitted.text
    spans = {s.name: s for s in requests.get_finished_spans()}
    (first_trace, first), (second_trace, second) = (
        _ids(spans["POST /runs"]),
        _ids(spans["POST /runs/lead/submit"]),
    )
    assert second_trace == UPSTREAM_TRACE != first_trace

    leads, kids = tmp_path / "leads.jsonl", tmp_path / "kids.jsonl"
    await asyncio.gather(
        serve_traced(feed_store_url, "leads", leads, "lead", "kids"),
        serve_traced(feed_store_url, "kids", kids, "lead.d1"),
    )
    lead_spans, kid_spans = exported(leads), exported(kids)
    [lead] = [s for s in lead_spans if s["name"].startswith("invoke_agent")]
    assert lead["attributes"]["statekernel.run.id"] == "lead"
    assert (lead["trace_id"], lead["parent_id"]) == (second_trace, second)
    assert lead["links"] == [first]  # the request that created the run
    [tool] = [s for s in lead_spans if s["name"] == "execute_tool researcher"]
    assert tool["parent_id"] == lead["span_id"]
    [child] = [s for s in kid_spans if s["name"].startswith("invoke_agent")]
    assert child["attributes"]["statekernel.run.id"] == "lead.d1"
    assert (child["trace_id"], child["parent_id"]) == (second_trace, tool["span_id"])
    assert child["links"] == []  # created in this trace: nothing to link
    assert {s["trace_id"] for s in lead_spans + kid_spans} == {second_trace}
    chats = {s["parent_id"] for s in lead_spans + kid_spans if s["name"].startswith("chat ")}
    assert chats == {lead["span_id"], child["span_id"]}


async def _raw_entries(store: CheckpointStore, url: str, entries: dict[str, str]) -> None:
    """Entries of queue ``raw`` written as no release of this one would: run id ->
    ``traceparent`` ('' for none, as the release before wrote them)."""
    assert isinstance(store, RunQueues)
    queue = store.run_queue("raw")
    await queue.prepare()
    if isinstance(queue, RedisRunQueue):
        for run_id, traceparent in entries.items():
            fields: dict[Any, Any] = {"run": run_id, "at": 1}
            fields |= {"tp": traceparent} if traceparent else {}
            await queue.client.xadd(queue.key, fields)
        return
    target = parse_postgres_url(url)
    table = f'"{target.schema}".queue_entries'
    conn = await asyncpg.connect(target.dsn)
    try:
        for run_id, traceparent in entries.items():
            if traceparent:
                await conn.execute(
                    f"INSERT INTO {table} (queue, run_id, submitted_ms, traceparent)"
                    " VALUES ('raw', $1, 1, $2)",
                    run_id.encode(),
                    traceparent,
                )
            else:
                await conn.execute(
                    f"INSERT INTO {table} (queue, run_id, submitted_ms) VALUES ('raw', $1, 1)",
                    run_id.encode(),
                )
    finally:
        await conn.close()


async def _worked(kernel: sk.Kernel, queue: str, run_ids: list[str]) -> sk.WorkerStats:
    """Serve ``queue`` until the runs are at rest (answering "Done." to each turn); they
    must have completed."""
    providers = {"scripted": ScriptedProvider(["Done."] * 5)}
    worker = sk.Worker(kernel.store, queue=queue, agent={"providers": providers}, block=0.05)
    serving = asyncio.create_task(worker.serve())
    while not all([(await kernel.get(r)).is_terminal for r in run_ids]):
        assert not serving.done(), "the worker stopped"
        await asyncio.sleep(0.02)
    worker.stop()
    assert [(await kernel.get(r)).state for r in run_ids] == ["completed"] * len(run_ids)
    return await serving


@pytest.fixture
async def kernel(feed_store_url: str) -> AsyncIterator[sk.Kernel]:
    k = sk.Kernel(feed_store_url, providers={"scripted": ScriptedProvider([])})
    yield k
    await k.aclose()


async def test_an_entry_without_a_trace_context_or_with_a_damaged_one_is_driven_as_before(
    kernel: sk.Kernel, feed_store_url: str, spans: InMemorySpanExporter
) -> None:
    with TracerProvider().get_tracer("app").start_as_current_span("request") as request:
        for run_id in ("old", "damaged", "half"):
            await kernel.start(model="scripted/m", messages=["go"], run_id=run_id)
    entries = {"old": "", "damaged": "not a traceparent", "half": "00-0af7651916cd43dd"}
    await _raw_entries(kernel.store, feed_store_url, entries)
    assert (await _worked(kernel, "raw", list(entries))).completed == 3
    created = request.get_span_context()
    drives = [_placed(s) for s in spans.get_finished_spans() if s.name.startswith("invoke")]
    # each run's first drive: under the request that created it
    assert drives == [(created.trace_id, created.span_id, [])] * 3


async def test_input_sent_and_submitted_by_a_later_request_is_driven_under_it(
    kernel: sk.Kernel, spans: InMemorySpanExporter
) -> None:
    """A run that came to rest is sent input and submitted again by a request of another
    trace: the worker's drive is that request's child, linked to the run's creation (a
    drive of a run past its first revision without such an entry starts a trace of its
    own)."""
    tracer = TracerProvider().get_tracer("app")
    with tracer.start_as_current_span("create") as create:
        await kernel.start(model="scripted/m", messages=["go"], run_id="r")
        await kernel.submit("r", queue="later")
    await _worked(kernel, "later", ["r"])
    with tracer.start_as_current_span("follow up") as follow_up:
        await kernel.send("r", "and then?")
        await kernel.submit("r", queue="later")
    await _worked(kernel, "later", ["r"])
    await kernel.send("r", "once more")
    await kernel.submit("r", queue="later")  # by no request
    await _worked(kernel, "later", ["r"])
    first, second, third = [
        _placed(s) for s in spans.get_finished_spans() if s.name.startswith("invoke")
    ]
    created, followed = create.get_span_context(), follow_up.get_span_context()
    assert first == (created.trace_id, created.span_id, [])
    assert second == (followed.trace_id, followed.span_id, [created.span_id])
    assert third[1:] == (None, [created.span_id])  # a trace of its own
    assert third[0] not in (created.trace_id, followed.trace_id)


def _placed(span: ReadableSpan) -> tuple[int, int | None, list[int]]:
    """A span's trace id, its parent's span id and the span ids of its links."""
    assert span.context is not None
    parent = None if span.parent is None else span.parent.span_id
    return span.context.trace_id, parent, [link.context.span_id for link in span.links]
