"""Usage limits over a real HTTP provider (the OpenAI wire format): each limit reached
mid-run pauses the run with ``limit_reached`` before the next call (no call is cut),
and the run goes on once the limit is raised on resume."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import InvalidArgument
from statekernel.pauses import LimitReached
from statekernel.providers import OpenAIProvider, RetryPolicy

from .conftest import WireServer

CALLS: list[str] = []


@sk.tool
def get_weather(city: str) -> str:
    """Weather in a city."""
    CALLS.append(city)
    return "sunny"


def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """A ``chat.completion.chunk`` as the API streams it."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "model": "m", "choices": choices, **extra}


def usage(prompt: int, completion: int) -> dict[str, Any]:
    counts = {"prompt_tokens": prompt, "completion_tokens": completion}
    return chunk(None, usage={**counts, "total_tokens": prompt + completion})


def call(index: int, city: str) -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    function = {"name": "get_weather", "arguments": arguments}
    return {"index": index, "id": f"call_{city}", "type": "function", "function": function}


def ask_weather(wire: WireServer, cities: list[str], prompt: int, completion: int) -> None:
    """One streamed answer asking for the weather in ``cities`` (one call each)."""
    calls = [call(n, city) for n, city in enumerate(cities)]
    wire.sse([chunk({"tool_calls": calls}), chunk({}, "tool_calls"), usage(prompt, completion)])


def answer(wire: WireServer, text: str, prompt: int, completion: int) -> None:
    wire.sse([chunk({"content": text}), chunk({}, "stop"), usage(prompt, completion)])


@pytest.fixture
async def kernel(wire: WireServer) -> AsyncIterator[sk.Kernel]:
    CALLS.clear()
    provider = OpenAIProvider(base_url=wire.url, retry=RetryPolicy(max_attempts=1))
    async with sk.Kernel("memory://", tools=[get_weather], providers={"openai": provider}) as k:
        yield k
    await provider.aclose()


async def drive(kernel: sk.Kernel, run_id: str) -> tuple[list[sk.Event], sk.Run]:
    events = [event async for event in kernel.run(run_id)]
    return events, await kernel.get(run_id)


@pytest.mark.parametrize(
    ("limits", "reached", "raised"),
    [
        (sk.Limits(input_tokens=150), LimitReached("input_tokens", 220, 150), "input_tokens"),
        (sk.Limits(output_tokens=40), LimitReached("output_tokens", 50, 40), "output_tokens"),
        (sk.Limits(total_tokens=250), LimitReached("total_tokens", 270, 250), "total_tokens"),
    ],
)
async def test_a_token_limit_pauses_before_the_next_model_call_and_resumes_raised(
    wire: WireServer, kernel: sk.Kernel, limits: sk.Limits, reached: LimitReached, raised: str
) -> None:
    ask_weather(wire, ["Paris"], prompt=100, completion=20)  # under every limit: goes on
    ask_weather(wire, ["Rome"], prompt=120, completion=30)  # past it: this call finishes
    answer(wire, "Sunny in both.", prompt=140, completion=10)
    run = await kernel.start(model="openai/m", messages=["Weather?"], limits=limits)

    events, paused = await drive(kernel, run.run_id)

    assert paused.state == "paused"
    assert paused.pause is not None
    assert paused.pause.reason == "limit_reached"
    assert paused.pause.details == reached
    assert paused.pause.metadata == {
        "limit": reached.limit,
        "used": reached.used,
        "allowed": reached.allowed,
    }
    assert paused.pause.resume_to == "preparing_turn"  # before the third turn's call
    assert len(wire.requests) == 2
    assert CALLS == ["Paris", "Rome"]  # both answers' calls ran: no call was cut
    assert len(paused.turns) == 2
    assert paused.current_turn is None
    assert events[-1].type == "run_paused"
    assert events[-1].data["metadata"] == paused.pause.metadata

    # resumed without raising it: paused again before any call
    await kernel.resume(run.run_id)
    _, again = await drive(kernel, run.run_id)
    assert again.state == "paused"
    assert again.pause is not None
    assert again.pause.details == reached
    assert len(wire.requests) == 2

    bigger = sk.Limits(**{raised: 10_000})
    resumed = await kernel.resume(run.run_id, limits=bigger)
    assert resumed.limits == bigger
    _, done = await drive(kernel, run.run_id)
    assert done.state == "completed"
    assert done.output == "Sunny in both."
    assert len(wire.requests) == 3
    assert done.usage == sk.Usage(360, 60)


async def test_the_tool_call_limit_pauses_before_the_next_call_of_the_same_answer(
    wire: WireServer, kernel: sk.Kernel
) -> None:
    ask_weather(wire, ["Paris", "Rome", "Oslo"], prompt=10, completion=10)
    answer(wire, "Sunny everywhere.", prompt=10, completion=5)
    run = await kernel.start(
        model="openai/m", messages=["Weather?"], limits=sk.Limits(tool_calls=1)
    )

    _, paused = await drive(kernel, run.run_id)

    assert paused.state == "paused"
    assert paused.pause is not None
    assert paused.pause.reason == "limit_reached"
    assert paused.pause.details == LimitReached("tool_calls", 1, 1)
    assert paused.pause.resume_to == "dispatching_tools"
    assert CALLS == ["Paris"]  # the call that started finished and was committed
    turn = paused.current_turn
    assert turn is not None
    assert [r.id for r in turn.completed] == ["call_Paris"]
    assert [r.id for r in turn.pending] == ["call_Rome", "call_Oslo"]
    assert paused.tool_calls_started == 1

    await kernel.resume(run.run_id, limits=sk.Limits(tool_calls=2))
    _, second = await drive(kernel, run.run_id)
    assert second.pause is not None
    assert second.pause.details == LimitReached("tool_calls", 2, 2)
    assert CALLS == ["Paris", "Rome"]

    await kernel.resume(run.run_id, limits=sk.Limits())  # no limit left
    _, done = await drive(kernel, run.run_id)
    assert done.state == "completed"
    assert CALLS == ["Paris", "Rome", "Oslo"]
    assert done.tool_calls_started == 3
    assert len(wire.requests) == 2
    sent = wire.requests[1].json()["messages"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == [
        "call_Paris",
        "call_Rome",
        "call_Oslo",
    ]


async def test_with_eager_dispatch_no_call_starts_past_the_limit_while_the_answer_streams(
    wire: WireServer,
) -> None:
    CALLS.clear()
    ask_weather(wire, ["Paris", "Rome"], prompt=10, completion=10)
    answer(wire, "Sunny.", prompt=10, completion=5)
    provider = OpenAIProvider(base_url=wire.url, retry=RetryPolicy(max_attempts=1))
    eager = sk.DispatchPolicy(eager=True)
    async with sk.Kernel(
        "memory://", tools=[get_weather], providers={"openai": provider}, dispatch=eager
    ) as kernel:
        run = await kernel.start(
            model="openai/m", messages=["Weather?"], limits=sk.Limits(tool_calls=1)
        )
        _, paused = await drive(kernel, run.run_id)
        assert paused.pause is not None
        assert paused.pause.details == LimitReached("tool_calls", 1, 1)
        assert CALLS == ["Paris"]
        await kernel.resume(run.run_id, limits=sk.Limits(tool_calls=2))
        _, done = await drive(kernel, run.run_id)
    await provider.aclose()
    assert done.state == "completed"
    assert CALLS == ["Paris", "Rome"]


async def test_a_run_without_limits_stores_none_and_has_none(kernel: sk.Kernel) -> None:
    run = await kernel.start(model="openai/m", messages=["Hi"])
    assert run.limits is None
    plain = sk.to_plain(run)
    assert plain["limits"] is None
    from statekernel._records import convert

    stored = convert.unstructure(run)
    assert {"limits", "fallback", "tool_calls_started"}.isdisjoint(stored)


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: sk.Limits(input_tokens=-1), "input_tokens"),
        (lambda: sk.Limits(output_tokens=1.5), "output_tokens"),  # type: ignore[arg-type]
        (lambda: sk.Limits(total_tokens=True), "total_tokens"),
        (lambda: sk.Limits(tool_calls="3"), "tool_calls"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_limit_is_refused_naming_it(make: Any, named: str) -> None:
    with pytest.raises(InvalidArgument, match=named):
        make()


async def test_limits_that_are_no_limits_are_refused(kernel: sk.Kernel) -> None:
    with pytest.raises(InvalidArgument, match="limits"):
        await kernel.start(model="openai/m", messages=["Hi"], limits={"tool_calls": 1})  # type: ignore[arg-type]
    run = await kernel.start(model="openai/m", messages=["Hi"])
    with pytest.raises(InvalidArgument, match="limits"):
        await kernel.resume(run.run_id, limits=5)  # type: ignore[arg-type]
    assert (await kernel.get(run.run_id)).revision == 0  # nothing committed
