"""Runs are observable: OpenTelemetry spans (a drive's ``invoke_agent``, its commits, model
and tool calls, after the GenAI semantic conventions) and log records with structured
fields."""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import statekernel as sk
from statekernel.errors import ProviderError, StoreError
from statekernel.stores import Checkpoint, Lease, MemoryStore
from statekernel.testing import Fail, Reply, ScriptedProvider, call


@sk.tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@sk.tool(idempotent=True)
def broken(city: str) -> str:
    """A tool that fails."""
    raise ValueError(f"no station in {city}")


async def _drive(store: MemoryStore, script: list[object], tools: list[sk.Tool]) -> sk.Run:
    kernel = sk.Kernel(store, tools=tools, providers={"scripted": ScriptedProvider(script)})
    async with kernel:
        run = await kernel.start(model="scripted/test-model", messages=["weather in Paris?"])
        async for _ in kernel.run(run.run_id):
            pass
        return await kernel.get(run.run_id)


def _named(finished: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name.startswith(prefix)]


def _attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def _fields(record: logging.LogRecord, *names: str) -> tuple[object, ...]:
    """The structured fields (``extra=``) of a log record."""
    return tuple(vars(record)[name] for name in names)


TOOL_THEN_TEXT: list[object] = [Reply(tool_calls=[call("weather", {"city": "Paris"})]), "Sunny."]


async def test_a_drive_gives_its_commit_model_and_tool_spans(
    spans: InMemorySpanExporter,
) -> None:
    run = await _drive(MemoryStore(), TOOL_THEN_TEXT, [weather])
    assert run.state == "completed"
    finished = spans.get_finished_spans()

    [drive] = _named(finished, "invoke_agent")
    assert drive.name == "invoke_agent scripted/test-model"
    assert _attrs(drive) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "scripted/test-model",
        "gen_ai.conversation.id": run.run_id,
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "test-model",
        "gen_ai.usage.input_tokens": 20,  # both answers of the drive
        "gen_ai.usage.output_tokens": 10,
        "statekernel.run.id": run.run_id,
        "statekernel.run.model": "scripted/test-model",
        "statekernel.run.state": "completed",
        "statekernel.run.revision": run.revision,
    }
    assert drive.status.status_code == StatusCode.UNSET
    assert drive.context is not None
    drive_id = drive.context.span_id

    commits = _named(finished, "statekernel.commit")
    assert len(commits) == run.revision - 0  # every commit of the drive (start made r0)
    assert [_attrs(c)["statekernel.revision"] for c in commits] == list(range(1, run.revision + 1))
    last = _attrs(commits[-1])
    assert last["statekernel.commit.event_types"] == (
        "model_completed",
        "turn_completed",
        "run_completed",
    )
    assert last["statekernel.commit.events"] == 3
    assert last["statekernel.run.state"] == "completed"
    assert all(_attrs(c)["statekernel.commit.retried"] is False for c in commits)
    assert all(_attrs(c)["statekernel.commit.attempts"] == 1 for c in commits)

    models = _named(finished, "chat ")
    assert [m.name for m in models] == ["chat test-model", "chat test-model"]
    for model, reason in zip(models, ["tool_calls", "stop"], strict=True):
        attrs = _attrs(model)
        assert model.kind == SpanKind.CLIENT
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "scripted"
        assert attrs["gen_ai.request.model"] == "test-model"
        assert attrs["gen_ai.response.model"] == "test-model"
        assert attrs["gen_ai.conversation.id"] == run.run_id
        assert attrs["gen_ai.usage.input_tokens"] == 10
        assert attrs["gen_ai.usage.output_tokens"] == 5
        assert attrs["gen_ai.response.finish_reasons"] == (reason,)

    [tool] = _named(finished, "execute_tool ")
    assert tool.name == "execute_tool weather"
    attrs = _attrs(tool)
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "weather"
    assert attrs["gen_ai.tool.call.id"] == "call_0_0"
    assert attrs["statekernel.tool.attempt"] == 1
    assert attrs["statekernel.tool.idempotent"] is False
    assert attrs["statekernel.tool.outcome"] == "ok"
    assert tool.status.status_code == StatusCode.UNSET

    for child in [*commits, *models, tool]:
        assert child.parent is not None
        assert child.parent.span_id == drive_id, child.name
        assert child.context is not None
        assert child.context.trace_id == drive.context.trace_id


async def test_a_failing_tool_gives_an_error_span(spans: InMemorySpanExporter) -> None:
    script: list[object] = [Reply(tool_calls=[call("broken", {"city": "Paris"})]), "No idea."]
    run = await _drive(MemoryStore(), script, [broken])
    assert run.state == "completed"  # the error is a result the model sees
    [tool] = _named(spans.get_finished_spans(), "execute_tool ")
    attrs = _attrs(tool)
    assert attrs["statekernel.tool.outcome"] == "error"
    assert attrs["statekernel.tool.idempotent"] is True
    assert attrs["error.type"] == "ValueError"
    assert tool.status.status_code == StatusCode.ERROR
    assert [e.name for e in tool.events] == ["exception"]


async def test_a_provider_error_gives_a_model_span_with_status_error(
    spans: InMemorySpanExporter,
) -> None:
    down = ProviderError("service unavailable", status=503, provider="scripted")
    run = await _drive(MemoryStore(), [Fail(down, times=5)], [])
    assert run.state == "failed"
    finished = spans.get_finished_spans()
    [model] = _named(finished, "chat ")
    assert model.status.status_code == StatusCode.ERROR
    assert _attrs(model)["error.type"] == "503"
    assert "gen_ai.usage.input_tokens" not in _attrs(model)
    [drive] = _named(finished, "invoke_agent")
    assert _attrs(drive)["statekernel.run.state"] == "failed"
    assert drive.status.status_code == StatusCode.UNSET  # the drive itself went well


async def test_without_a_drive_spans_follow_the_callers_context(
    spans: InMemorySpanExporter,
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    outer = provider.get_tracer("app")
    kernel = sk.Kernel(
        MemoryStore(), providers={"scripted": ScriptedProvider(["Hello."])}, tools=[weather]
    )
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["hi"])
        with outer.start_as_current_span("request") as request:
            while not (await kernel.get(run.run_id)).is_terminal:
                await kernel.step(run.run_id)
    finished = spans.get_finished_spans()
    assert not _named(finished, "invoke_agent")
    children = [*_named(finished, "statekernel.commit"), *_named(finished, "chat ")]
    assert len(children) == 3  # model_started, the answer, and the model call
    for child in children:
        assert child.parent is not None
        assert child.parent.span_id == request.get_span_context().span_id


class FlakyStore(MemoryStore):
    """Fails (before writing) the first commit of each revision in ``flaky``."""

    def __init__(self, flaky: set[int]) -> None:
        super().__init__()
        self.flaky = flaky

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        if checkpoint.run.revision in self.flaky:
            self.flaky.discard(checkpoint.run.revision)
            raise StoreError("connection reset")
        await super().commit(checkpoint, lease=lease)


async def test_commits_are_logged_with_their_run_and_revision(
    caplog: pytest.LogCaptureFixture, spans: InMemorySpanExporter
) -> None:
    caplog.set_level(logging.DEBUG, logger="statekernel")
    run = await _drive(FlakyStore({2}), TOOL_THEN_TEXT, [weather])
    assert run.state == "completed"
    ours = [r for r in caplog.records if r.name == "statekernel"]

    commits = [r for r in ours if r.levelno == logging.DEBUG and "committed" in r.getMessage()]
    assert [_fields(r, "run_id", "revision") for r in commits] == [
        (run.run_id, revision) for revision in range(1, run.revision + 1)
    ]
    assert _fields(commits[-1], "events", "state") == (
        ["model_completed", "turn_completed", "run_completed"],
        "completed",
    )

    [retried] = [r for r in ours if r.levelno == logging.WARNING]
    assert _fields(retried, "run_id", "revision", "attempt") == (run.run_id, 2, 1)
    assert "trying again" in retried.getMessage()

    [rest] = [r for r in ours if r.levelno == logging.INFO]
    assert rest.getMessage() == f"run {run.run_id} completed at revision {run.revision}"
    assert _fields(rest, "run_id", "revision", "state") == (run.run_id, run.revision, "completed")

    [second] = [
        s
        for s in _named(spans.get_finished_spans(), "statekernel.commit")
        if _attrs(s)["statekernel.revision"] == 2
    ]
    assert _attrs(second)["statekernel.commit.attempts"] == 2
    assert _attrs(second)["statekernel.commit.retried"] is True


async def test_a_call_stopped_with_its_drive_is_cancelled(spans: InMemorySpanExporter) -> None:
    started = asyncio.Event()

    @sk.tool
    async def slow(city: str) -> str:
        """A tool that takes its time."""
        started.set()
        await asyncio.sleep(30)
        return city

    script: list[object] = [Reply(tool_calls=[call("slow", {"city": "Paris"})]), "Done."]
    kernel = sk.Kernel(
        MemoryStore(), tools=[slow], providers={"scripted": ScriptedProvider(script)}
    )
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["go"])

        async def drive() -> None:
            async for _ in kernel.run(run.run_id):
                pass

        task = asyncio.ensure_future(drive())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finished = spans.get_finished_spans()
    [tool] = _named(finished, "execute_tool ")
    assert _attrs(tool)["statekernel.tool.outcome"] == "cancelled"
    assert tool.status.status_code == StatusCode.UNSET
    [drive_span] = _named(finished, "invoke_agent")
    assert _attrs(drive_span)["statekernel.run.state"] == "dispatching_tools"
