"""Values from hooks, providers and middleware are checked before they enter a run.

A wrong value (a finish reason that is not one, a token count that is a float or too
large, an id that is not a string, a decision a hook may not return...) fails the run
with a typed error naming the field and the value, the way a hook that raises does:
nothing escapes the drive as a bare ``TypeError``, and the run, every turn and every
event load back, on every store.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

import statekernel as sk
from statekernel.middleware import ModelCall
from statekernel.providers import (
    ModelProvider,
    ReasoningDelta,
    StreamEnd,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    UsageUpdate,
)
from statekernel.stores import open_store
from statekernel.testing import Reply, ScriptedProvider, call
from statekernel.testing.strategies import forged

from ...conftest import STORE_KINDS

INT_MAX = 2**63 - 1
STORES = STORE_KINDS


def kind_of(kind: str, request: pytest.FixtureRequest) -> str:
    """``kind``, or the store URL of this test for a server's store."""
    if kind in ("redis", "redis-cluster", "postgres"):
        return str(request.getfixturevalue(f"{kind.replace('-', '_')}_store_url"))
    return kind


@sk.tool
def record(item: str) -> str:
    """Record an item."""
    return f"recorded {item}"


class Returning(sk.Hooks):
    """Hooks whose answers come from functions of the hook's arguments."""

    def __init__(self, **answers: Callable[..., Any]) -> None:
        self.answers = answers

    def _answer(self, name: str, *args: Any) -> Any:
        answer = self.answers.get(name)
        return None if answer is None else answer(*args)

    def on_turn_prepared(self, run: sk.Run, request: sk.ModelRequest) -> Any:
        return self._answer("on_turn_prepared", request)

    def on_model_completed(self, run: sk.Run, result: sk.ModelResult) -> Any:
        return self._answer("on_model_completed", result)

    def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> Any:
        return self._answer("on_tool_call_started", call)

    def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> Any:
        return self._answer("on_turn_completed", turn)


class Streaming:
    """A provider that streams the given parts for every request."""

    def __init__(self, parts: Sequence[object]) -> None:
        self.parts = list(parts)

    async def stream(self, request: sk.ModelRequest) -> AsyncIterator[StreamPart]:
        for part in self.parts:
            yield part  # type: ignore[misc]

    async def aclose(self) -> None:
        """Nothing to close."""


def result_with(**changes: Any) -> Callable[[sk.ModelResult], sk.ModelResult]:
    return lambda result: attrs.evolve(result, **changes)


def request_with(**changes: Any) -> Callable[[sk.ModelRequest], sk.ModelRequest]:
    return lambda request: attrs.evolve(request, **changes)


TOOL_CALL = [call("record", {"item": "a"}), "done"]
ROBOT = sk.Message("robot", (sk.TextPart("beep"),))  # type: ignore[arg-type]
USER = sk.Message.user("not an answer")
NAMELESS = sk.Message.assistant(tool_calls=[sk.ToolCall("c1", 5, "{}")])  # type: ignore[arg-type]

HOOK_CASES: dict[str, tuple[list[object], dict[str, Callable[..., Any]], str]] = {
    "turn completed: Pause(5)": (
        ["hi"],
        {"on_turn_completed": lambda t: sk.Pause(5, {})},  # type: ignore[arg-type]
        r"Pause\.reason: 5 is not str",
    ),
    "turn completed: Finish(5)": (
        ["hi"],
        {"on_turn_completed": lambda t: sk.Finish(5)},  # type: ignore[arg-type]
        r"Finish\.reason: 5 is not str",
    ),
    "turn completed: Skip": (
        ["hi"],
        {"on_turn_completed": lambda t: sk.Skip("x")},
        r"on_turn_completed returned Skip\(.*not None or one of Continue, Pause, Finish",
    ),
    "turn completed: a string": (
        ["hi"],
        {"on_turn_completed": lambda t: "stop"},
        r"on_turn_completed returned 'stop'",
    ),
    "model completed: finish reason": (
        ["hi"],
        {"on_model_completed": result_with(finish_reason="bogus")},
        r"result\.finish_reason: 'bogus' is not one of stop",
    ),
    "model completed: float tokens": (
        ["hi"],
        {"on_model_completed": result_with(usage=sk.Usage(input_tokens=1.5))},  # type: ignore[arg-type]
        r"result\.usage\.input_tokens: 1\.5 is not an int",
    ),
    "model completed: negative tokens": (
        ["hi"],
        {"on_model_completed": result_with(usage=sk.Usage(output_tokens=-1))},
        r"result\.usage\.output_tokens: -1 is not from 0",
    ),
    "model completed: bool tokens": (
        ["hi"],
        {"on_model_completed": result_with(usage=sk.Usage(cache_read_tokens=True))},
        r"result\.usage\.cache_read_tokens: True is not an int",
    ),
    "model completed: tokens beyond 64 bits": (
        ["hi"],
        {"on_model_completed": result_with(usage=sk.Usage(reasoning_tokens=2**70))},
        r"result\.usage\.reasoning_tokens: 1180591620717411303424 is not from 0",
    ),
    "model completed: role robot": (
        ["hi"],
        {"on_model_completed": result_with(message=ROBOT)},
        r"result\.message\.role: 'robot' is not one of",
    ),
    "model completed: a user message": (
        ["hi"],
        {"on_model_completed": result_with(message=USER)},
        r"result\.message\.role: 'user' is not 'assistant'",
    ),
    "model completed: tool call name": (
        ["hi"],
        {"on_model_completed": result_with(message=NAMELESS)},
        r"result\.message\.content\[0\]\.name: int is not str",
    ),
    "model completed: model name": (
        ["hi"],
        {"on_model_completed": result_with(model=5)},
        r"result\.model: 5 is not str or None",
    ),
    "model completed: a string": (
        ["hi"],
        {"on_model_completed": lambda result: "hello"},
        r"on_model_completed: result: 'hello' is not a ModelResult",
    ),
    "tool call started: Skip(error=5)": (
        TOOL_CALL,
        {"on_tool_call_started": lambda c: sk.Skip(error=5)},  # type: ignore[arg-type]
        r"Skip\.error: 5 is not str",
    ),
    "tool call started: Skip with result and error": (
        TOOL_CALL,
        {"on_tool_call_started": lambda c: sk.Skip(result="refunded", error="refused")},
        r"Skip takes result= or error=, not both",
    ),
    "tool call started: Rewrite of no JSON": (
        TOOL_CALL,
        {"on_tool_call_started": lambda c: sk.Rewrite({1: 2})},
        r"Rewrite\.input: key 1 is int, not str",
    ),
    "tool call started: Pause metadata": (
        TOOL_CALL,
        {"on_tool_call_started": lambda c: sk.Pause("check", {"at": {1.5, 2}})},
        r'Pause\.metadata\["at"\]: set is not JSON',
    ),
    "tool call started: Pause(None)": (
        TOOL_CALL,
        {"on_tool_call_started": lambda c: sk.Pause(None)},  # type: ignore[arg-type]
        r"Pause\.reason: None is not str",
    ),
    "tool call started: a string": (
        TOOL_CALL,
        {"on_tool_call_started": lambda c: "continue"},
        r"on_tool_call_started returned 'continue', not None or one of Continue, Rewrite",
    ),
    "tool call started: a Skip built past its checks": (
        TOOL_CALL,
        {"on_tool_call_started": lambda c: forged(sk.Skip(), result={"n": math.inf}, error=5)},
        r"Skip\.error: 5 is not str",
    ),
    "turn completed: a Pause built past its checks": (
        ["hi"],
        {"on_turn_completed": lambda t: forged(sk.Pause("p"), metadata={1: 2})},
        r"on_turn_completed: Pause\.metadata: key 1 is int, not str",
    ),
    "turn prepared: model 5": (
        ["hi"],
        {"on_turn_prepared": request_with(model=5)},
        r"on_turn_prepared: request\.model: 5 is not str",
    ),
    "turn prepared: options": (
        ["hi"],
        {"on_turn_prepared": request_with(options={"seed": math.nan})},
        r'request\.options\["seed"\]: nan is not JSON',
    ),
    "turn prepared: max_tokens": (
        ["hi"],
        {"on_turn_prepared": request_with(max_tokens="100")},
        r"request\.max_tokens: '100' is not an int",
    ),
    "turn prepared: temperature": (
        ["hi"],
        {"on_turn_prepared": request_with(temperature=math.inf)},
        r"request\.temperature: inf is not a finite number",
    ),
    "turn prepared: a message that is a string": (
        ["hi"],
        {"on_turn_prepared": request_with(messages=["hi"])},
        r"request\.messages\[0\]: str is not a Message",
    ),
    "turn prepared: the transcript and a message after it": (
        ["hi"],
        {"on_turn_prepared": lambda r: attrs.evolve(r, messages=r.messages + (ROBOT,))},  # noqa: RUF005
        r"request\.messages\[1\]\.role: 'robot' is not one of",
    ),
    "turn prepared: stop words": (
        ["hi"],
        {"on_turn_prepared": request_with(stop=[5])},
        r"request\.stop\[0\]: 5 is not str",
    ),
    "turn prepared: tool spec": (
        ["hi"],
        {"on_turn_prepared": request_with(tools=[sk.ToolSpec(5)])},  # type: ignore[arg-type]
        r"request\.tools\[0\]\.name: 5 is not str",
    ),
}

END = StreamEnd("stop")
PROVIDER_CASES: dict[str, tuple[list[object], str]] = {
    "StreamEnd('weird')": ([TextDelta("x"), StreamEnd("weird")], r"StreamEnd\.reason: 'weird'"),  # type: ignore[arg-type]
    "StreamEnd(None)": ([TextDelta("x"), StreamEnd(None)], r"StreamEnd\.reason: None is not str"),  # type: ignore[arg-type]
    "StreamEnd model": ([StreamEnd("stop", model=5)], r"StreamEnd\.model: 5 is not str or None"),  # type: ignore[arg-type]
    "usage beyond 64 bits": (
        [UsageUpdate(sk.Usage(input_tokens=2**70)), END],
        r"UsageUpdate\.usage\.input_tokens: 1180591620717411303424 is not from 0",
    ),
    "negative usage": (
        [UsageUpdate(sk.Usage(output_tokens=-2)), END],
        r"UsageUpdate\.usage\.output_tokens: -2 is not from 0",
    ),
    "float usage": (
        [UsageUpdate(sk.Usage(input_tokens=3.0)), END],  # type: ignore[arg-type]
        r"UsageUpdate\.usage\.input_tokens: 3\.0 is not an int",
    ),
    "usage that is a dict": (
        [UsageUpdate({"input_tokens": 1}), END],  # type: ignore[arg-type]
        r"UsageUpdate\.usage: \{'input_tokens': 1\} is not Usage",
    ),
    "ToolCallDelta(id=5)": (
        [ToolCallDelta(0, id=5, name="record", arguments="{}"), StreamEnd("tool_calls")],  # type: ignore[arg-type]
        r"ToolCallDelta\.id: 5 is not str or None",
    ),
    "ToolCallDelta name": (
        [ToolCallDelta(0, id="c", name=["record"], arguments="{}"), END],  # type: ignore[arg-type]
        r"ToolCallDelta\.name: \['record'\] is not str or None",
    ),
    "ToolCallDelta arguments": (
        [ToolCallDelta(0, id="c", name="record", arguments={"item": "a"}), END],  # type: ignore[arg-type]
        r"ToolCallDelta\.arguments: \{'item': 'a'\} is not str",
    ),
    "ToolCallDelta index": (
        [ToolCallDelta("0", id="c", name="record"), END],  # type: ignore[arg-type]
        r"ToolCallDelta\.index: '0' is not an int",
    ),
    "ToolCallDone name": (
        [ToolCallDone(sk.ToolCall("c", None, "{}")), END],  # type: ignore[arg-type]
        r"ToolCallDone\.call\.name: None is not str",
    ),
    "ToolCallDone without a name": (
        [ToolCallDone(sk.ToolCall("c", "", "{}")), END],
        r"ToolCallDone\.call\.name: '' names no tool",
    ),
    "ToolCallDelta never named": (
        [ToolCallDelta(0, id="c", arguments='{"item": "a"}'), END],
        r"tool call 0 without a name",
    ),
    "TextDelta(5)": ([TextDelta(5), END], r"TextDelta\.text: 5 is not str"),  # type: ignore[arg-type]
    "ReasoningDelta signature": (
        [ReasoningDelta("hm", signature=b"sig"), END],  # type: ignore[arg-type]
        r"ReasoningDelta\.signature: b'sig' is not str or None",
    ),
    "not a stream part": ([{"text": "hi"}, END], r"\{'text': 'hi'\}, which is not a stream part"),
}


def open_kind(kind: str, tmp_path: Path) -> Any:
    if "://" in kind:
        return open_store(kind)
    if kind == "memory":
        return open_store(f"memory://{tmp_path.name}")  # shared while one is open
    if kind == "file":
        return open_store(f"file://{tmp_path}/runs")
    return open_store(f"sqlite:///{tmp_path}/runs.db")


async def drive(
    kind: str,
    tmp_path: Path,
    provider: ModelProvider,
    *,
    hooks: object = None,
    middleware: Sequence[Any] = (),
) -> sk.Run:
    """Start and drive a run (nothing may escape); the run as a new kernel loads it,
    with every turn and event read."""
    store = open_kind(kind, tmp_path)
    kernel = sk.Kernel(
        store, tools=[record], providers={"p": provider}, hooks=hooks, middleware=middleware
    )
    try:
        run = await kernel.start(model="p/model", messages=["hi"])
        async for _ in kernel.run(run.run_id):
            pass
    finally:
        await kernel.aclose()
    other = open_kind(kind, tmp_path)
    again = sk.Kernel(other, providers={"p": provider})
    try:
        loaded = await again.get(run.run_id)
        for turn in loaded.turns:  # completed turns are decoded when read
            assert turn.request.model
        events = await again.events(run.run_id)
        assert events[-1].revision == loaded.revision
        assert loaded == await store.load(run.run_id)
        return loaded
    finally:
        await again.aclose()
        await other.aclose()
        await store.aclose()


def failed_with(run: sk.Run, error: str, match: str) -> None:
    assert run.state == "failed", (run.state, run.failure)
    assert run.failure is not None
    assert run.failure.error == error
    assert re.search(match, run.failure.message), run.failure.message


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("case", list(HOOK_CASES))
async def test_a_hook_answer_a_run_cannot_hold_fails_the_run(
    kind: str, case: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    script, answers, match = HOOK_CASES[case]
    loaded = await drive(
        kind_of(kind, request), tmp_path, ScriptedProvider(script), hooks=Returning(**answers)
    )
    failed_with(loaded, "InvalidArgument", match)


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("case", list(PROVIDER_CASES))
async def test_a_stream_part_a_run_cannot_hold_fails_the_run(
    kind: str, case: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    parts, match = PROVIDER_CASES[case]
    loaded = await drive(kind_of(kind, request), tmp_path, Streaming(parts))
    failed_with(loaded, "ProviderError", match)
    assert loaded.usage == sk.Usage()


async def test_middleware_answers_are_checked(tmp_path: Path) -> None:
    async def inflate(c: Any, nxt: Any) -> Any:
        result = await nxt(c)
        if isinstance(c, ModelCall):
            return attrs.evolve(result, usage=sk.Usage(input_tokens=-5))
        return result

    loaded = await drive("sqlite", tmp_path, ScriptedProvider(["hi"]), middleware=[inflate])
    failed_with(loaded, "InvalidArgument", r"model result\.usage\.input_tokens: -5 is not from 0")


async def test_a_run_total_beyond_64_bits_fails_the_run(tmp_path: Path) -> None:
    big = sk.Usage(input_tokens=INT_MAX)
    script = [Reply(tool_calls=[call("record", {"item": "a"})], usage=big), Reply("hi", usage=big)]
    loaded = await drive("sqlite", tmp_path, ScriptedProvider(script))
    failed_with(loaded, "InvalidArgument", r"usage\.input_tokens: the run's total would pass")
    assert loaded.usage.input_tokens == INT_MAX  # the first turn's, as committed


async def test_values_that_are_right_go_through(tmp_path: Path) -> None:
    """Tuples in a request's options are stored as lists; int temperatures and ints
    stay ints."""
    hooks = Returning(
        on_turn_prepared=request_with(options={"pair": (1, 2)}, temperature=1, max_tokens=5),
        on_model_completed=result_with(usage=sk.Usage(input_tokens=7, output_tokens=2**40)),
    )
    loaded = await drive("file", tmp_path, ScriptedProvider(["hi"]), hooks=hooks)
    assert loaded.state == "completed"
    request = loaded.turns[0].request
    assert request.options == {"pair": [1, 2]}
    assert type(request.temperature) is int
    assert loaded.usage.output_tokens == 2**40
