"""The kernel over a real HTTP provider: bad tool arguments become an error result the
model sees, and the run goes on."""

from __future__ import annotations

from typing import Any

import statekernel as sk
from statekernel.providers import OpenAIProvider

from .conftest import WireServer

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
