"""OpenAI chat completions over real HTTP: SSE chunks as the API documents them."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any, cast

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
from statekernel.errors import AuthenticationFailed, ConfigError, ProviderUnavailable
from statekernel.providers import (
    OpenAIProvider,
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

MODEL = "gpt-4o-mini-2024-07-18"
WEATHER = ToolSpec(
    "get_weather",
    "Current weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` as the API streams it."""
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    return {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": MODEL,
        "system_fingerprint": "fp_44709d6fcb",
        "choices": choices,
        "usage": None,
        **extra,
    }


def usage_chunk(
    prompt: int, completion: int, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    return chunk(
        None,
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0},
        },
    )


TOOL_STREAM = [
    chunk({"role": "assistant", "content": None, "refusal": None}),
    chunk({"content": "Checking"}),
    chunk({"content": " both."}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city"'},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Par'}}]}),
    chunk({"tool_calls": [{"index": 1, "function": {"arguments": ': "Rome"}'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'is"}'}}]}),
    chunk({}, "tool_calls"),
    usage_chunk(120, 40, cached=100, reasoning=8),
]


def request(**kw: Any) -> ModelRequest:
    kw.setdefault("messages", [Message.user("Weather in Paris and Rome?")])
    return ModelRequest(model=f"openai/{MODEL}", **kw)


@pytest.fixture
async def provider(
    wire: WireServer, sleeps: Sleeps, fast_retry: RetryPolicy
) -> AsyncIterator[OpenAIProvider]:
    p = OpenAIProvider(base_url=wire.url, api_key="sk-test-1234", sleep=sleeps, retry=fast_retry)
    yield p
    await p.aclose()


async def collect(provider: OpenAIProvider, req: ModelRequest) -> list[StreamPart]:
    return [part async for part in provider.stream(req)]


async def test_tool_call_deltas_spread_over_chunks(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    wire.sse(TOOL_STREAM, done=True, split=7)
    parts = await collect(provider, request(tools=[WEATHER]))
    assert parts[0] == TextDelta("Checking")
    deltas = [p for p in parts if isinstance(p, ToolCallDelta)]
    assert [d.index for d in deltas] == [0, 0, 1, 0, 1, 0]
    assert parts[-1] == StreamEnd("tool_calls", MODEL)
    result = assemble(parts)
    assert result.text == "Checking both."
    assert result.tool_calls == (
        ToolCall("call_a", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_b", "get_weather", '{"city": "Rome"}'),
    )
    assert result.usage == Usage(20, 40, cache_read_tokens=100, reasoning_tokens=8)
    assert result.finish_reason == "tool_calls"


async def test_request_payload(wire: WireServer, provider: OpenAIProvider) -> None:
    wire.sse([chunk({"content": "ok"}), chunk({}, "stop")], done=True)
    image = ImagePart(data="aGk=", media_type="image/jpeg")
    messages = [
        Message.system("Be brief."),
        Message.user("What is this?", images=[image, ImagePart(url="https://x.test/a.png")]),
        Message.assistant("Looking.", tool_calls=[ToolCall("c1", "get_weather", '{"city":"X"}')]),
        Message.tool("c1", "get_weather", "sunny"),
        Message.tool("c2", "get_weather", "boom", is_error=True),
    ]
    req = request(
        messages=messages,
        tools=[WEATHER],
        tool_choice="get_weather",
        max_tokens=50,
        temperature=0.2,
        stop=["END"],
        options={"top_p": 0.5},
    )
    await collect(provider, req)
    seen = wire.requests[0]
    assert seen.path == "/chat/completions"
    assert seen.headers["authorization"] == "Bearer sk-test-1234"
    body = seen.json()
    assert body["model"] == MODEL
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 50
    assert body["temperature"] == 0.2
    assert body["stop"] == ["END"]
    assert body["top_p"] == 0.5
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": WEATHER.parameters,
        },
    }
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,aGk="}},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"X"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "boom"},
    ]


async def test_official_api_uses_max_completion_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    provider = OpenAIProvider(api_key="sk-x")
    try:
        assert provider.max_tokens_field == "max_completion_tokens"
        assert provider._payload(request(max_tokens=5), True)["max_completion_tokens"] == 5
    finally:
        await provider.aclose()


async def test_official_api_without_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIProvider()


async def test_text_with_unicode_line_separators_stays_whole(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    text = "one\u2028two\u2029three\x85four\x1cfive"  # str.splitlines splits at each
    events = [chunk({"role": "assistant", "content": text}), chunk({}, "stop")]
    raw = [json.dumps(e, ensure_ascii=False) for e in events]  # the separators raw
    wire.sse(raw, done=True)
    assert assemble(await collect(provider, request())).message.text == text


async def test_reasoning_content_deltas(wire: WireServer, provider: OpenAIProvider) -> None:
    wire.sse(
        [
            chunk({"role": "assistant", "content": None, "reasoning_content": "Hmm, "}),
            chunk({"reasoning_content": "2+2=4."}),
            chunk({"content": "4"}),
            chunk({}, "stop"),
            usage_chunk(10, 5),
        ],
        done=True,
    )
    parts = await collect(provider, request())
    assert parts[:3] == [ReasoningDelta("Hmm, "), ReasoningDelta("2+2=4."), TextDelta("4")]
    result = assemble(parts)
    texts = [cast("ReasoningPart | TextPart", p).text for p in result.message.content]
    assert texts == ["Hmm, 2+2=4.", "4"]
    assert result.usage == Usage(10, 5)


@pytest.mark.parametrize(
    ("wire_reason", "neutral"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("content_filter", "content_filter"),
        ("tool_calls", "tool_calls"),
        ("something_new", "other"),
    ],
)
async def test_finish_reasons_normalized(
    wire: WireServer, provider: OpenAIProvider, wire_reason: str, neutral: FinishReason
) -> None:
    wire.sse([chunk({"content": "x"}), chunk({}, wire_reason)], done=True)
    parts = await collect(provider, request())
    assert parts[-1] == StreamEnd(neutral, MODEL)


async def test_invalid_tool_arguments_pass_through_as_raw_text(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    wire.sse(
        [
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_x",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{city: Par"},
                        }
                    ]
                }
            ),
            chunk({}, "tool_calls"),
        ],
        done=True,
    )
    result = await complete(provider, request())
    (call,) = result.tool_calls
    assert call.arguments == "{city: Par"
    with pytest.raises(ValueError, match="property name"):
        call.parsed_arguments()


async def test_usage_only_with_include_usage_and_missing_ids_are_generated(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    wire.sse(
        [
            chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}),
            chunk({}, "tool_calls"),
        ],
        done=True,
    )
    result = await complete(provider, request())
    assert result.tool_calls[0].id.startswith("call_")
    assert result.usage == Usage()


async def test_stream_without_done_but_finished_is_accepted(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    wire.sse([chunk({"content": "hi"}), chunk({}, "stop")])
    result = await complete(provider, request())
    assert result.text == "hi"


async def test_truncated_stream_is_unavailable_without_retry(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    wire.sse([chunk({"content": "hi"})])  # no finish_reason, no [DONE]
    with pytest.raises(ProviderUnavailable, match="already started"):
        await complete(provider, request())
    assert len(wire.requests) == 1
    assert sleeps.delays == []


async def test_error_chunk_mid_stream(wire: WireServer, provider: OpenAIProvider) -> None:
    wire.sse(
        [
            chunk({"content": "hi"}),
            {"error": {"message": "The server had an error", "type": "server_error"}},
        ]
    )
    with pytest.raises(ProviderUnavailable, match="The server had an error"):
        await complete(provider, request())
    assert len(wire.requests) == 1


async def test_non_streaming(wire: WireServer, provider: OpenAIProvider) -> None:
    wire.json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
        }
    )
    result = await complete(provider, request(options={"stream": False}))
    body = wire.requests[0].json()
    assert "stream" not in body
    assert "stream_options" not in body
    assert result.tool_calls == (ToolCall("call_1", "get_weather", '{"city":"Oslo"}'),)
    assert result.usage == Usage(9, 3)
    assert result.finish_reason == "tool_calls"
    assert result.model == MODEL


async def test_server_answering_json_to_a_streaming_request(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    wire.json(
        {
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hello"},
                    "finish_reason": "stop",
                }
            ],
        }
    )
    result = await complete(provider, request())
    assert result.text == "hello"


async def test_repr_and_errors_hide_the_key(wire: WireServer, provider: OpenAIProvider) -> None:
    assert "sk-test-1234" not in repr(provider)
    wire.json(
        {
            "error": {
                "message": "Incorrect API key provided: sk-test-1234.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        },
        status=401,
    )
    with pytest.raises(AuthenticationFailed) as info:
        await complete(provider, request())
    assert "sk-test-1234" not in str(info.value)
    assert "Incorrect API key provided: ***" in str(info.value)


async def test_servers_that_omit_the_tool_call_index(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    def whole(call_id: str, city: str) -> dict[str, Any]:
        arguments = f'{{"city": "{city}"}}'
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": "f", "arguments": arguments},
        }

    wire.sse(
        [
            chunk({"tool_calls": [whole("a", "Oslo"), whole("b", "Rome")]}),
            chunk({"tool_calls": [{"function": {"arguments": ""}}]}),
            chunk({}, "tool_calls"),
        ],
        done=True,
    )
    result = await complete(provider, request())
    assert [(c.id, c.parsed_arguments()["city"]) for c in result.tool_calls] == [
        ("a", "Oslo"),
        ("b", "Rome"),
    ]


def answer(content: Any, **extra: Any) -> dict[str, Any]:
    """A whole (non-streamed) chat completion whose message has ``content``."""
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return {"object": "chat.completion", "model": MODEL, "choices": [choice], **extra}


async def test_content_given_as_a_list_of_parts_is_their_text(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    parts = [{"type": "text", "text": "Par"}, {"type": "image_url"}, {"type": "text", "text": "is"}]
    wire.json(answer(parts))
    result = await complete(provider, request(options={"stream": False}))
    assert result.text == "Paris"
    wire.sse([chunk({"content": [{"type": "text", "text": "Rome"}]}), chunk({}, "stop")])
    result = await complete(provider, request())
    assert result.text == "Rome"
    wire.json(answer([{"type": "image_url", "image_url": {"url": "x"}}]))  # no text: none
    result = await complete(provider, request(options={"stream": False}))
    assert result.text == ""


async def test_mistral_thinking_parts_are_the_reasoning(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    # Mistral's reasoning models stream content as parts, the thinking ones first
    def thinking(text: str) -> dict[str, Any]:
        return {"type": "thinking", "thinking": [{"type": "text", "text": text}]}

    wire.sse(
        [
            chunk({"role": "assistant", "content": [thinking("Two and ")]}),
            chunk({"content": [thinking("two.")]}),
            chunk({"content": [{"type": "text", "text": "4"}]}),
            chunk({}, "stop"),
        ]
    )
    parts = await collect(provider, request())
    assert parts[:3] == [ReasoningDelta("Two and "), ReasoningDelta("two."), TextDelta("4")]
    content = [thinking("Sum."), {"type": "text", "text": "4"}]
    wire.json(answer(content))
    result = await complete(provider, request(options={"stream": False}))
    texts = [cast("ReasoningPart | TextPart", p).text for p in result.message.content]
    assert texts == ["Sum.", "4"]


async def test_a_refusal_is_the_answer_s_text_and_ends_as_content_filter(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    # OpenAI puts a refusal beside a null content and finishes with "stop": it was an
    # empty answer that looked like a normal end
    said = "I can't help with that."
    body = answer(None)
    body["choices"][0]["message"]["refusal"] = said
    wire.json(body)
    result = await complete(provider, request(options={"stream": False}))
    assert (result.text, result.finish_reason) == (said, "content_filter")
    refusing = [chunk({"refusal": "I can't "}), chunk({"refusal": "help."}), chunk({}, "stop")]
    wire.sse(refusing)
    result = await complete(provider, request())
    assert (result.text, result.finish_reason) == ("I can't help.", "content_filter")
    wire.json(answer("Paris"))  # a null refusal beside an answer changes nothing
    result = await complete(provider, request(options={"stream": False}))
    assert (result.text, result.finish_reason) == ("Paris", "stop")


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (42, "choices[0].message.content "),
        ({"text": "Paris"}, "choices[0].message.content "),
        ([{"type": "thinking", "thinking": 5}], "choices[0].message.content[0].thinking "),
        ([{"type": "text", "text": None}], "choices[0].message.content[0].text "),
        (["Paris"], "choices[0].message.content[0] "),
    ],
)
async def test_content_that_is_no_text_is_unavailable_naming_it(
    wire: WireServer, provider: OpenAIProvider, content: Any, field: str
) -> None:
    for _ in range(3):
        wire.json(answer(content))
    with pytest.raises(ProviderUnavailable, match=f"malformed response: {re.escape(field)}"):
        await complete(provider, request(options={"stream": False}))


async def test_a_body_without_a_first_choice_is_unavailable(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    for body, field in (
        ({"model": MODEL, "choices": []}, "choices is empty"),
        ({"model": MODEL, "choices": ["x"]}, "choices[0] is 'x'"),
        ({"model": MODEL, "choices": [{"finish_reason": "stop"}]}, "choices[0].message missing"),
    ):
        wire.replies.clear()
        wire.requests.clear()
        for _ in range(3):
            wire.json(body)
        with pytest.raises(ProviderUnavailable, match=re.escape(field)):
            await complete(provider, request(options={"stream": False}))
        assert len(wire.requests) == 3


async def test_an_error_body_answering_a_streaming_request_is_retried_as_its_type(
    wire: WireServer, provider: OpenAIProvider, sleeps: Sleeps
) -> None:
    overloaded = {"error": {"message": "The server is overloaded", "type": "server_error"}}
    wire.json(overloaded)
    wire.json(answer("hello"))
    result = await complete(provider, request())
    assert result.text == "hello"
    assert len(sleeps.delays) == 1


async def test_more_cached_than_prompt_tokens_are_counted_apart(
    wire: WireServer, provider: OpenAIProvider
) -> None:
    # OpenAI counts cached tokens inside prompt_tokens; a server reporting more cached
    # than prompt tokens counts them apart (a proxy in front of Anthropic): read so
    wire.sse([chunk({"content": "hi"}), chunk({}, "stop"), usage_chunk(10, 5, cached=50)])
    result = await complete(provider, request())
    assert result.usage == Usage(input_tokens=10, output_tokens=5, cache_read_tokens=50)
    wire.sse([chunk({"content": "hi"}), chunk({}, "stop"), usage_chunk(60, 5, cached=50)])
    result = await complete(provider, request())
    assert result.usage == Usage(input_tokens=10, output_tokens=5, cache_read_tokens=50)
