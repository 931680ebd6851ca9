"""Anthropic messages streaming over real HTTP: the documented SSE event set."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from statekernel._records.messages import (
    FinishReason,
    ImagePart,
    Message,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolSpec,
    Usage,
)
from statekernel.errors import BadRequest, ProviderUnavailable, RateLimited
from statekernel.providers import (
    AnthropicProvider,
    ReasoningDelta,
    RetryPolicy,
    StreamEnd,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    assemble,
    complete,
)

from .conftest import Sleeps, WireServer

MODEL = "claude-sonnet-4-5"


def message_start(
    input_tokens: int = 25, cache_read: int = 0, cache_write: int = 0
) -> tuple[str, dict[str, Any]]:
    usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": cache_write,
        "cache_read_input_tokens": cache_read,
        "output_tokens": 1,
    }
    message: dict[str, Any] = {
        "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": MODEL,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return ("message_start", {"type": "message_start", "message": message})


def block_start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return (
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def block_delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def block_stop(index: int) -> tuple[str, dict[str, Any]]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def message_delta(stop_reason: str, output_tokens: int) -> tuple[str, dict[str, Any]]:
    return (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
    )


PING = ("ping", {"type": "ping"})
STOP = ("message_stop", {"type": "message_stop"})
OVERLOADED = (
    "error",
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
)

FULL_STREAM = [
    message_start(input_tokens=472, cache_read=2048, cache_write=100),
    block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
    block_delta(0, {"type": "thinking_delta", "thinking": "The user wants Paris "}),
    block_delta(0, {"type": "thinking_delta", "thinking": "weather."}),
    block_delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}),
    block_stop(0),
    PING,
    block_start(1, {"type": "text", "text": ""}),
    block_delta(1, {"type": "text_delta", "text": "Okay, let me "}),
    block_delta(1, {"type": "text_delta", "text": "check."}),
    block_stop(1),
    block_start(
        2,
        {
            "type": "tool_use",
            "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "get_weather",
            "input": {},
        },
    ),
    block_delta(2, {"type": "input_json_delta", "partial_json": ""}),
    block_delta(2, {"type": "input_json_delta", "partial_json": '{"city": "Pa'}),
    block_delta(2, {"type": "input_json_delta", "partial_json": 'ris"}'}),
    block_stop(2),
    block_start(3, {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}}),
    block_stop(3),
    message_delta("tool_use", 89),
    STOP,
]


def request(**kw: Any) -> ModelRequest:
    kw.setdefault("messages", [Message.user("Weather in Paris?")])
    return ModelRequest(model=f"anthropic/{MODEL}", **kw)


@pytest.fixture
async def provider(
    wire: WireServer, sleeps: Sleeps, fast_retry: RetryPolicy
) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(
        base_url=wire.url, api_key="sk-ant-test-9876", sleep=sleeps, retry=fast_retry
    )
    yield p
    await p.aclose()


async def collect(provider: AnthropicProvider, req: ModelRequest) -> list[StreamPart]:
    return [part async for part in provider.stream(req)]


async def test_full_event_set(wire: WireServer, provider: AnthropicProvider) -> None:
    wire.sse(FULL_STREAM, split=11)
    parts = await collect(provider, request())
    assert parts[1:4] == [
        ReasoningDelta("The user wants Paris "),
        ReasoningDelta("weather."),
        ReasoningDelta("", "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"),
    ]
    assert ToolCallDelta(0, "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather") in parts
    assert ToolCallDelta(1, "toolu_02", "get_time") in parts
    assert parts[-1] == StreamEnd("tool_calls", MODEL)
    result = assemble(parts)
    assert result.message.content == (
        ReasoningPart("The user wants Paris weather.", "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"),
        TextPart("Okay, let me check."),
        ToolCall("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather", '{"city": "Paris"}'),
        ToolCall("toolu_02", "get_time", ""),
    )
    assert result.tool_calls[1].parsed_arguments() == {}
    assert result.usage == Usage(472, 89, cache_read_tokens=2048, cache_write_tokens=100)
    seen = wire.requests[0]
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == "sk-ant-test-9876"
    assert seen.headers["anthropic-version"] == "2023-06-01"


async def test_redacted_thinking_round_trips(wire: WireServer, provider: AnthropicProvider) -> None:
    wire.sse(
        [
            message_start(),
            block_start(0, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}),
            block_stop(0),
            block_start(1, {"type": "text", "text": ""}),
            block_delta(1, {"type": "text_delta", "text": "Hi"}),
            block_stop(1),
            message_delta("end_turn", 3),
            STOP,
        ]
    )
    result = await complete(provider, request())
    assert result.message.content[0] == ReasoningPart("", "EmwKAhgBEgy3va3pzix", redacted=True)
    wire.sse([message_start(), message_delta("end_turn", 1), STOP])
    await complete(provider, request(messages=[Message.user("a"), result.message]))
    sent = wire.requests[1].json()["messages"][1]["content"]
    assert sent == [
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
        {"type": "text", "text": "Hi"},
    ]


async def test_overloaded_before_output_is_retried(
    wire: WireServer, provider: AnthropicProvider, sleeps: Sleeps
) -> None:
    wire.sse([message_start(), PING, OVERLOADED])
    wire.sse(
        [
            message_start(),
            block_start(0, {"type": "text", "text": ""}),
            block_delta(0, {"type": "text_delta", "text": "ok"}),
            block_stop(0),
            message_delta("end_turn", 2),
            STOP,
        ]
    )
    result = await complete(provider, request())
    assert result.text == "ok"
    assert len(wire.requests) == 2
    assert len(sleeps.delays) == 1


async def test_overloaded_mid_stream_is_not_retried(
    wire: WireServer, provider: AnthropicProvider, sleeps: Sleeps
) -> None:
    wire.sse(
        [
            message_start(),
            block_start(0, {"type": "text", "text": ""}),
            block_delta(0, {"type": "text_delta", "text": "Once upon"}),
            OVERLOADED,
        ]
    )
    parts: list[StreamPart] = []
    with pytest.raises(ProviderUnavailable, match="overloaded_error: Overloaded"):
        await drain(provider.stream(request()), parts)
    assert parts[-1] == TextDelta("Once upon")
    assert len(wire.requests) == 1
    assert sleeps.delays == []


async def test_stream_error_types_map_to_the_tree(
    wire: WireServer, provider: AnthropicProvider
) -> None:
    wire.sse(
        [
            (
                "error",
                {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": "prompt is too long"},
                },
            )
        ]
    )
    with pytest.raises(BadRequest, match="prompt is too long"):
        await complete(provider, request())
    wire.sse(
        [
            (
                "error",
                {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            )
        ]
        * 1
    )
    wire.sse(
        [
            (
                "error",
                {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            )
        ]
        * 1
    )
    wire.sse(
        [
            (
                "error",
                {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            )
        ]
        * 1
    )
    with pytest.raises(RateLimited, match="slow down"):
        await complete(provider, request())
    assert len(wire.requests) == 4  # one bad request, three rate-limited attempts


async def test_stream_without_message_stop_is_unavailable(
    wire: WireServer, provider: AnthropicProvider
) -> None:
    wire.sse(
        [
            message_start(),
            block_start(0, {"type": "text", "text": ""}),
            block_delta(0, {"type": "text_delta", "text": "par"}),
        ]
    )
    with pytest.raises(ProviderUnavailable, match="message_stop"):
        await complete(provider, request())
    assert len(wire.requests) == 1


async def test_payload_merges_tool_results_and_keeps_system_apart(
    wire: WireServer, provider: AnthropicProvider
) -> None:
    wire.sse([message_start(), message_delta("end_turn", 1), STOP])
    thinking = ReasoningPart("think", "sig-1")
    messages = [
        Message.system("Be brief."),
        Message.user(
            "Look",
            images=[
                ImagePart(data="aGk=", media_type="image/png"),
                ImagePart(url="https://x.test/a.png"),
            ],
        ),
        Message.assistant(
            "Two calls.",
            reasoning=[
                thinking,
                ReasoningPart("unsigned"),
                ReasoningPart("OpenAI's", '{"type":"reasoning","id":"rs_1","summary":[]}'),
            ],
            tool_calls=[
                ToolCall("t1", "get_weather", '{"city":"Oslo"}'),
                ToolCall("t2", "get_weather", "{bad json"),
            ],
        ),
        Message.tool("t1", "get_weather", "rain"),
        Message.tool("t2", "get_weather", "invalid arguments", is_error=True),
        Message.user("And tomorrow?"),
    ]
    tools = [ToolSpec("get_weather", "Weather.", {"type": "object", "properties": {}})]
    req = request(
        messages=messages,
        tools=tools,
        tool_choice="required",
        temperature=0.0,
        stop=["###"],
        options={"thinking": {"type": "enabled", "budget_tokens": 1024}},
    )
    await complete(provider, req)
    body = wire.requests[0].json()
    assert body["system"] == "Be brief."
    assert body["max_tokens"] == 4096
    assert body["stream"] is True
    assert body["tool_choice"] == {"type": "any"}
    assert body["temperature"] == 0.0
    assert body["stop_sequences"] == ["###"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather.",
            "input_schema": {"type": "object", "properties": {}},
        }
    ]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
                },
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "think", "signature": "sig-1"},
                {"type": "text", "text": "Two calls."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
                {
                    "type": "tool_use",
                    "id": "t2",
                    "name": "get_weather",
                    "input": {"invalid_json": "{bad json"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "rain"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": "invalid arguments",
                    "is_error": True,
                },
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]


async def test_non_streaming(wire: WireServer, provider: AnthropicProvider) -> None:
    wire.json(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 5, "output_tokens": 7, "cache_read_input_tokens": 3},
        }
    )
    result = await complete(provider, request(options={"stream": False}))
    assert "stream" not in wire.requests[0].json()
    assert result.message.content == (
        ReasoningPart("hm", "s"),
        TextPart("Calling."),
        ToolCall("toolu_1", "f", '{"x":1}'),
    )
    assert result.usage == Usage(5, 7, cache_read_tokens=3)
    assert result.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("stop_reason", "neutral"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "other"),
    ],
)
async def test_stop_reasons(
    wire: WireServer, provider: AnthropicProvider, stop_reason: str, neutral: FinishReason
) -> None:
    wire.sse([message_start(), message_delta(stop_reason, 1), STOP])
    parts = await collect(provider, request())
    assert parts[-1] == StreamEnd(neutral, MODEL)


async def drain(stream: AsyncIterator[StreamPart], parts: list[StreamPart]) -> None:
    async for part in stream:
        parts.append(part)


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"type": "tool_use", "name": "get_weather", "input": {}}, "content_block.id "),
        ({"type": "tool_use", "id": "toolu_1", "name": "", "input": {}}, "content_block.name "),
    ],
)
async def test_a_streamed_tool_use_without_id_or_name_is_unavailable(
    wire: WireServer, provider: AnthropicProvider, block: dict[str, Any], field: str
) -> None:
    for _ in range(3):
        wire.sse([message_start(), block_start(0, block)])
    with pytest.raises(ProviderUnavailable, match=f"malformed response: {re.escape(field)}"):
        await complete(provider, request())


@pytest.mark.parametrize("index", ["one", -1, 1.5, True])
async def test_a_block_index_that_is_no_index_is_unavailable_naming_it(
    wire: WireServer, provider: AnthropicProvider, index: Any
) -> None:
    # int(...) of it was a bare ValueError ("one"), or a wrong block (1.5, True)
    for _ in range(3):
        wire.sse([message_start(), block_start(index, {"type": "text", "text": ""})])
    with pytest.raises(ProviderUnavailable, match=r"malformed response: index is .*, not an index"):
        await complete(provider, request())


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"type": "tool_use", "name": "get_weather", "input": {}}, "content[0].id "),
        ({"type": "tool_use", "id": "toolu_1", "name": "get_weather"}, "content[0].input "),
        ({"type": "text"}, "content[0].text "),
    ],
)
async def test_a_whole_answer_with_a_malformed_block_is_unavailable(
    wire: WireServer, provider: AnthropicProvider, block: dict[str, Any], field: str
) -> None:
    body = {"type": "message", "model": MODEL, "content": [block], "stop_reason": "tool_use"}
    for _ in range(3):
        wire.json(body)
    with pytest.raises(ProviderUnavailable, match=f"malformed response: {re.escape(field)}"):
        await complete(provider, request(options={"stream": False}))
