"""A run carries the W3C trace context of the span it was created under (``Run.
trace_context``), in every store; its first drive continues that trace even with no span
of the caller's, a later drive starts a trace linked to it, and a child run continues the
trace of the tool call that started it. (A drive in another process: ``tests/statekernel/
workers/test_worker_tracing.py``.)"""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, format_span_id, format_trace_id

import statekernel as sk
from statekernel._records.convert import structure_run, unstructure
from statekernel.stores import MemoryStore, open_store
from statekernel.telemetry import TraceParent
from statekernel.testing import ScriptedProvider, call


def _app(spans: InMemorySpanExporter) -> TracerProvider:
    """The application's own tracer provider, exporting where statekernel's spans go."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider


def _traceparent(span: Span) -> str:
    context = span.get_span_context()
    ids = f"{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}"
    return f"00-{ids}-{context.trace_flags:02x}"


def _drives(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")]


async def _drain(kernel: sk.Kernel, run_id: str) -> sk.Run:
    async for _ in kernel.run(run_id):
        pass
    return await kernel.get(run_id)


async def test_a_run_keeps_the_trace_context_it_was_started_under(
    every_store_url: str, spans: InMemorySpanExporter
) -> None:
    tracer = _app(spans).get_tracer("app")
    providers = {"scripted": ScriptedProvider([])}
    async with sk.Kernel(every_store_url, providers=providers) as kernel:
        with tracer.start_as_current_span("request") as request:
            run = await kernel.start(model="scripted/m", messages=["hi"], run_id="traced")
        untraced = await kernel.start(model="scripted/m", messages=["hi"], run_id="untraced")
    assert run.trace_context == TraceParent(_traceparent(request))
    assert untraced.trace_context is None
    store = open_store(every_store_url) if every_store_url != "memory://" else None
    if store is not None:  # read back by another client of the store
        assert (await store.load("traced")).trace_context == run.trace_context
        assert (await store.load("untraced")).trace_context is None
        await store.aclose()


def test_a_record_without_trace_context_reads_as_before() -> None:
    run = sk.Run(run_id="old", model="scripted/m")
    data = unstructure(run)
    assert "trace_context" not in data  # left out at its default: old records match
    assert structure_run(data) == run
    traced = sk.Run(run_id="new", model="scripted/m", trace_context=TraceParent("00-x", "a=b"))
    data = unstructure(traced)
    assert data["trace_context"] == {"traceparent": "00-x", "tracestate": "a=b"}
    assert structure_run(data) == traced


async def test_the_first_drive_continues_the_trace_of_the_request_and_later_ones_link_it(
    spans: InMemorySpanExporter,
) -> None:
    tracer = _app(spans).get_tracer("app")
    script: list[object] = ["Hello.", "Again."]
    async with sk.Kernel(MemoryStore(), providers={"scripted": ScriptedProvider(script)}) as k:
        with tracer.start_as_current_span("request") as request:
            run = await k.start(model="scripted/m", messages=["hi"])
        await _drain(k, run.run_id)  # no span of the caller's: a worker's position
        await k.send(run.run_id, sk.Message.user("more"))
        await _drain(k, run.run_id)
    first, second = _drives(spans)
    origin = request.get_span_context()
    assert first.parent is not None
    assert first.context is not None
    assert first.parent.span_id == origin.span_id
    assert first.context.trace_id == origin.trace_id
    assert second.parent is None
    assert second.context is not None
    assert second.context.trace_id != origin.trace_id
    assert [link.context.span_id for link in second.links] == [origin.span_id]


async def test_a_drive_under_a_span_of_another_trace_links_the_request(
    spans: InMemorySpanExporter,
) -> None:
    tracer = _app(spans).get_tracer("app")
    async with sk.Kernel(
        MemoryStore(), providers={"scripted": ScriptedProvider(["Hello."])}
    ) as kernel:
        with tracer.start_as_current_span("request") as request:
            run = await kernel.start(model="scripted/m", messages=["hi"])
        with tracer.start_as_current_span("job") as job:
            await _drain(kernel, run.run_id)
    [drive] = _drives(spans)
    assert drive.parent is not None
    assert drive.parent.span_id == job.get_span_context().span_id
    assert [link.context.span_id for link in drive.links] == [request.get_span_context().span_id]


async def test_a_child_run_continues_the_trace_of_the_call_that_started_it(
    spans: InMemorySpanExporter,
) -> None:
    tracer = _app(spans).get_tracer("app")
    researcher = sk.delegate("researcher", "Find a fact.", model="helper/small")
    providers = {
        "scripted": ScriptedProvider([call("researcher", {"task": "?"}, id="d1"), "42."]),
        "helper": ScriptedProvider(["found: 42"]),
    }
    async with sk.Kernel(MemoryStore(), tools=[researcher], providers=providers) as kernel:
        with tracer.start_as_current_span("request") as request:
            run = await kernel.start(model="scripted/lead", messages=["ask"], run_id="lead")
        await _drain(kernel, run.run_id)
        [child] = await kernel.children("lead")
    finished = spans.get_finished_spans()
    [tool] = [s for s in finished if s.name == "execute_tool researcher"]
    assert tool.context is not None
    assert child.trace_context is not None
    assert child.trace_context.traceparent.split("-")[2] == format_span_id(tool.context.span_id)
    parent_drive, child_drive = sorted(
        _drives(spans), key=lambda s: dict(s.attributes or {})["statekernel.run.id"] != "lead"
    )
    assert child_drive.attributes is not None
    assert child_drive.attributes["statekernel.run.id"] == "lead.d1"
    assert child_drive.parent is not None
    assert child_drive.context is not None
    assert child_drive.parent.span_id == tool.context.span_id
    assert child_drive.context.trace_id == request.get_span_context().trace_id
    assert parent_drive.context is not None
    assert parent_drive.context.trace_id == request.get_span_context().trace_id


async def test_a_fork_keeps_the_trace_context_of_the_span_it_was_made_under(
    spans: InMemorySpanExporter,
) -> None:
    tracer = _app(spans).get_tracer("app")
    async with sk.Kernel(MemoryStore(), providers={"scripted": ScriptedProvider([])}) as kernel:
        with tracer.start_as_current_span("request") as request:
            run = await kernel.start(model="scripted/m", messages=["hi"])
        with tracer.start_as_current_span("forking") as forking:
            fork = await kernel.fork(run.run_id, at_revision=0)
        untraced = await kernel.fork(run.run_id, at_revision=0)
    assert run.trace_context == TraceParent(_traceparent(request))
    assert fork.trace_context == TraceParent(_traceparent(forking))
    assert untraced.trace_context is None
