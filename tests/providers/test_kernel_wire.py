"""The kernel over a real HTTP provider: bad tool arguments become an error result the
model sees, and the run goes on; a malformed answer fails the run (never completes it with
an answer the model did not give)."""

from __future__ import annotations

from typing import Any

import pytest

import statekernel as sk
from statekernel.providers import OpenAIProvider, RetryPolicy

from .conftest import Sleeps, WireServer

CALLS: list[str] = []


@sk.tool
def get_weather(city: str) -> str:
    """Weather in a city."""
    CALLS.append(city)
    return "sunny"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def test_invalid_tool_arguments_become_an_error_result(wire: WireServer) -> None:
    bad = {"index": 0, "id": "call_bad", "type": "function",
           "function": {"name": "get_weather", "arguments": '{"city": "Par'}}  # fmt: skip
    wire.sse([chunk({"tool_calls": [bad]}), chunk({}, "tool_calls")], done=True)
    wire.sse([chunk({"content": "Sorry, let me retry later."}), chunk({}, "stop")], done=True)
    provider = OpenAIProvider(base_url=wire.url)
    async with sk.Kernel("memory://", tools=[get_weather], providers={"openai": provider}) as k:
        run = await k.start(model="openai/m", messages=["Weather in Paris?"])
        events = [event.type async for event in k.run(run.run_id)]
        done = await k.get(run.run_id)
    await provider.aclose()

    assert done.state == "completed"
    assert events[-1] == "run_completed"
    assert CALLS == []  # never called with unparseable arguments
    (record,) = done.turns[0].completed
    assert record.error
    sent = wire.requests[1].json()["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'
    assert sent[2]["role"] == "tool"
    assert sent[2]["tool_call_id"] == "call_bad"
    assert sent[2]["content"]


ANSWER_OK = {"model": "m", "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"object": "chat.completion", "model": "m", "usage": {"prompt_tokens": 3}}, "choices"),
        ({"error": {"message": "The server is overloaded", "type": "server_error"}}, "overloaded"),
        ({**ANSWER_OK, "usage": {"prompt_tokens": 1.5}}, "usage.prompt_tokens"),
    ],
)
async def test_a_malformed_answer_fails_the_run_instead_of_completing_it(
    wire: WireServer, body: dict[str, Any], named: str
) -> None:
    for _ in range(2):
        wire.json(body)
    provider = OpenAIProvider(
        base_url=wire.url, streaming=False, retry=RetryPolicy(max_attempts=2), sleep=Sleeps()
    )
    async with sk.Kernel("memory://", providers={"openai": provider}) as k:
        run = await k.start(model="openai/m", messages=["Capital of France?"])
        events = [event.type async for event in k.run(run.run_id)]
        done = await k.get(run.run_id)
    await provider.aclose()

    assert done.state == "failed"
    assert "run_completed" not in events
    assert done.failure is not None
    assert done.failure.error == "ProviderUnavailable"
    assert named in done.failure.message
    assert [m.role for m in done.messages] == ["user"]  # no (empty) answer committed
    assert len(wire.requests) == 2
