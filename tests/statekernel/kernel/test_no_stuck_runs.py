"""No model answer can wedge a run: from every committed state, either the run is
completed or some public API call (run, resume, retry, resolve_tool_call, send)
makes progress. Model answers repeat or omit call ids, name unknown tools and
write arguments that are not JSON objects or cannot be stored."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import statekernel as sk
from statekernel._kernel.middleware import ModelCall
from statekernel._lifecycle.transitions import _unique_calls
from statekernel._records.messages import ModelResult, ToolCall
from statekernel.errors import InvalidArgument, ProviderUnavailable
from statekernel.stores import open_store
from statekernel.testing import Crash, CrashAt, FaultPlan, ScriptedProvider
from statekernel.testing import strategies as sts

Answers = list[ModelResult | None]
_NOT_NOW = (sk.InvalidTransition, InvalidArgument)


@sk.tool(idempotent=True)
async def echo(a: Any = None) -> Any:
    """Gives back its argument."""
    return a


@sk.tool
async def flaky(a: Any = None) -> str:
    """A side effect (not idempotent)."""
    return "done"


def _answering(answers: Answers) -> Callable[[Any, Any], Awaitable[Any]]:
    """Model middleware answering from ``answers`` by the number of assistant messages
    so far (a re-sent request gets the same answer); None raises ProviderUnavailable."""

    async def answer(call: Any, nxt: Callable[[Any], Awaitable[Any]]) -> Any:
        if not isinstance(call, ModelCall):
            return await nxt(call)
        turn = sum(1 for m in call.request.messages if m.role == "assistant")
        result = answers[min(turn, len(answers) - 1)]
        if result is None:
            raise ProviderUnavailable("overloaded", provider="scripted")
        return result

    return answer


class _World:
    def __init__(self, url: str, answers: Answers) -> None:
        self.store = open_store(url)
        self.answers = answers
        self.forks = itertools.count()

    def kernel(self, plan: FaultPlan | None = None) -> sk.Kernel:
        middleware: list[Any] = [_answering(self.answers)]
        if plan is not None:
            middleware.insert(0, plan.middleware())
        return sk.Kernel(
            self.store,
            tools=[echo, flaky],
            providers={"scripted": ScriptedProvider([""])},
            middleware=middleware,
            max_turns=3,
        )

    async def act(self, run_id: str, op: str) -> None:
        """Make one API call; calls the run's state does not allow are refused, not errors."""
        kernel = self.kernel(
            FaultPlan([CrashAt("tool_after_effect", 1)]) if op == "crash" else None
        )
        try:
            await _call(kernel, run_id, op)
        except (*_NOT_NOW, Crash):
            pass
        finally:
            await kernel.aclose()

    async def progresses(self, run_id: str) -> bool:
        """True when the run is completed, or some API call moves a copy of it on."""
        head = await self.store.load(run_id)
        if head.state == "completed":
            return True
        for op in ("run", "resume", "retry", "send", "resolve_error", "rerun"):
            kernel = self.kernel()
            try:
                fork = await kernel.fork(run_id, new_run_id=f"{run_id}-try{next(self.forks)}")
                try:
                    await _call(kernel, fork.run_id, op)
                except _NOT_NOW:
                    continue
                if (await self.store.load(fork.run_id)).revision > fork.revision:
                    return True
            finally:
                await kernel.aclose()
        return False


async def _call(kernel: sk.Kernel, run_id: str, op: str) -> None:
    if op in ("run", "crash"):
        count = 0
        async for _ in kernel.run(run_id):
            count += 1
            if count > 300:
                break
    elif op == "resume":
        await kernel.resume(run_id, value="ok")
    elif op == "retry":
        await kernel.retry(run_id)
    elif op == "send":
        await kernel.send(run_id, "more")
    else:
        run = await kernel.get(run_id)
        if run.pause is None or run.pause.reason != "uncertain_tool_calls":
            raise sk.InvalidTransition("resolve_tool_call", run.state, "no uncertain calls")
        for c in run.pause.metadata["calls"]:
            if op == "resolve_output":
                await kernel.resolve_tool_call(run_id, c["id"], output={"ok": 1})
            elif op == "resolve_error":
                await kernel.resolve_tool_call(run_id, c["id"], error="lost")
            else:
                await kernel.resolve_tool_call(run_id, c["id"], rerun=True)


async def _explore(url: str, answers: Answers, ops: list[str]) -> None:
    world = _World(url, answers)
    try:
        kernel = world.kernel()
        await kernel.start(model="scripted/m", messages=["go"], run_id="r")
        await kernel.aclose()
        for op in ops:
            await world.act("r", op)
            head = await world.store.load("r")
            assert await world.progresses("r"), f"stuck in {head.state} after {op}"
    finally:
        await world.store.aclose()


OPS = st.lists(st.one_of(sts.api_calls(), st.just("crash")), min_size=1, max_size=8)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_no_model_answer_leaves_a_run_stuck(kind: str) -> None:
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(answers=st.lists(sts.model_answers(), min_size=1, max_size=3), ops=OPS)
    def check(answers: Answers, ops: list[str]) -> None:
        with tempfile.TemporaryDirectory() as folder:
            url = "memory://" if kind == "memory" else f"sqlite:///{folder}/runs.db"
            asyncio.run(_explore(url, answers, ops))

    check()


# -- the cases the property found, as examples -------------------------------------------


def _answer(*calls: ToolCall) -> ModelResult:
    return ModelResult(sk.Message.assistant("", tool_calls=calls), finish_reason="tool_calls")


@pytest.mark.parametrize(
    "calls",
    [
        pytest.param(
            [ToolCall("x", "echo", "{}"), ToolCall("x", "echo", '{"a": 1}')], id="same-id"
        ),
        pytest.param([ToolCall("", "echo", "{}"), ToolCall("", "flaky", "{}")], id="empty-ids"),
        pytest.param([ToolCall("", "nope", "[1"), ToolCall("", "", '{"a": NaN}')], id="bad-calls"),
    ],
)
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_undispatchable_answers_complete(
    kind: str, calls: list[ToolCall], tmp_path: Any
) -> None:
    world = _World("memory://" if kind == "memory" else f"sqlite:///{tmp_path}/r.db", [])
    world.answers = [_answer(*calls), ModelResult(sk.Message.assistant("fine"))]
    kernel = world.kernel()
    await kernel.start(model="scripted/m", messages=["go"], run_id="r")
    async for _ in kernel.run("r"):
        pass
    run = await kernel.get("r")
    assert run.state == "completed"
    asked = run.messages[1].tool_calls
    answered = [m.content[0] for m in run.messages[2:-1]]
    ids = [c.id for c in asked]
    assert len(set(ids)) == len(ids)
    assert all(ids)
    assert [r.tool_call_id for r in answered] == ids  # type: ignore[union-attr]
    events = [e for e in await kernel.events("r") if e.type == "model_completed"]
    originals = [c.get("original_id", c["id"]) for c in events[0].data["tool_calls"]]
    assert originals == [c.id for c in calls]
    await kernel.aclose()
    await world.store.aclose()


def test_call_ids_are_derived_from_the_answer_alone() -> None:
    calls = (ToolCall("", "t", "{}"), ToolCall("call_0_0", "t", "{}"), ToolCall("", "t", "{}"))
    first, renamed = _unique_calls(_answer(*calls), 0)
    again, _ = _unique_calls(_answer(*calls), 0)
    assert first == again
    assert [c.id for c in first.tool_calls] == ["call_0_0_1", "call_0_0", "call_0_2"]
    assert renamed == {"call_0_0_1": "", "call_0_2": ""}
    plain = _answer(ToolCall("a", "t", "{}"))
    assert _unique_calls(plain, 3)[0] is plain
    assert attrs.evolve(first.message, content=()).role == "assistant"
