"""Ollama's native ``/api/chat`` over real HTTP: NDJSON lines with whole tool calls."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from statekernel._records.messages import (
    ImagePart,
    Message,
    ModelRequest,
    ToolCall,
    ToolSpec,
    Usage,
)
from statekernel.errors import BadRequest, ProviderUnavailable
from statekernel.providers import (
    OllamaProvider,
    ReasoningDelta,
    RetryPolicy,
    StreamEnd,
    TextDelta,
    ToolCallDone,
    assemble,
    complete,
)
from statekernel.providers._ollama import ollama_host

from .conftest import Sleeps, WireServer

MODEL = "qwen3:0.6b"
CREATED = "2025-05-27T22:54:57.641643Z"


def line(content: str = "", *, done: bool = False, **message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": MODEL,
        "created_at": CREATED,
        "message": {"role": "assistant", "content": content, **message},
        "done": done,
    }
    return out


def final(reason: str = "stop", prompt: int = 26, output: int = 12) -> dict[str, Any]:
    return {
        **line(done=True),
        "done_reason": reason,
        "total_duration": 4883583458,
        "load_duration": 1334875,
        "prompt_eval_count": prompt,
        "prompt_eval_duration": 342546000,
        "eval_count": output,
        "eval_duration": 4535599000,
    }


def request(**kw: Any) -> ModelRequest:
    kw.setdefault("messages", [Message.user("What is the weather today in Toronto?")])
    return ModelRequest(model=f"ollama/{MODEL}", **kw)


@pytest.fixture
async def provider(
    wire: WireServer, sleeps: Sleeps, fast_retry: RetryPolicy
) -> AsyncIterator[OllamaProvider]:
    p = OllamaProvider(host=wire.url, sleep=sleeps, retry=fast_retry)
    yield p
    await p.aclose()


async def test_stream_with_thinking_text_and_tool_calls(
    wire: WireServer, provider: OllamaProvider
) -> None:
    call = {
        "function": {
            "name": "get_current_weather",
            "arguments": {"format": "celsius", "location": "Toronto"},
        }
    }
    wire.ndjson(
        [
            line("", thinking="The user asks "),
            line("", thinking="for weather."),
            line("Let me check."),
            line("", tool_calls=[call]),
            final(),
        ],
        split=9,
    )
    parts = [p async for p in provider.stream(request())]
    assert parts[:3] == [
        ReasoningDelta("The user asks "),
        ReasoningDelta("for weather."),
        TextDelta("Let me check."),
    ]
    done = parts[3]
    assert isinstance(done, ToolCallDone)
    assert done.call.name == "get_current_weather"
    assert done.call.parsed_arguments() == {"format": "celsius", "location": "Toronto"}
    assert done.call.id.startswith("call_")
    assert parts[-1] == StreamEnd("stop", MODEL)
    result = assemble(parts)
    assert result.finish_reason == "tool_calls"
    assert result.usage == Usage(26, 12)
    assert wire.requests[0].path == "/api/chat"


async def test_payload(wire: WireServer, provider: OllamaProvider) -> None:
    wire.ndjson([final()])
    messages = [
        Message.system("Be brief."),
        Message.user("Look", images=[ImagePart(data="aGk=", media_type="image/png")]),
        Message.assistant("", tool_calls=[ToolCall("c1", "get_weather", '{"city":"Oslo"}')]),
        Message.tool("c1", "get_weather", "rain"),
    ]
    tools = [ToolSpec("get_weather", "Weather.", {"type": "object", "properties": {}})]
    req = request(
        messages=messages,
        tools=tools,
        max_tokens=64,
        temperature=0.1,
        stop=["\n\n"],
        options={"seed": 7, "keep_alive": "5m", "think": True},
    )
    await complete(provider, req)
    body = wire.requests[0].json()
    assert body["model"] == MODEL
    assert body["stream"] is True
    assert body["keep_alive"] == "5m"
    assert body["think"] is True
    assert body["options"] == {"temperature": 0.1, "num_predict": 64, "stop": ["\n\n"], "seed": 7}
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Look", "images": ["aGk="]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "rain", "tool_name": "get_weather"},
    ]


async def test_image_urls_are_refused_before_sending(
    wire: WireServer, provider: OllamaProvider
) -> None:
    req = request(messages=[Message.user("x", images=[ImagePart(url="https://x.test/a.png")])])
    with pytest.raises(BadRequest, match="inline image data"):
        await complete(provider, req)
    assert wire.requests == []


async def test_error_line_and_http_error(wire: WireServer, provider: OllamaProvider) -> None:
    wire.ndjson([line("par"), {"error": "an error was encountered while running the model"}])
    with pytest.raises(ProviderUnavailable, match="error was encountered"):
        await complete(provider, request())
    wire.json({"error": "model 'nope' not found"}, status=404)
    with pytest.raises(BadRequest, match="model 'nope' not found"):
        await complete(provider, request())


async def test_stream_without_done_is_unavailable(
    wire: WireServer, provider: OllamaProvider
) -> None:
    wire.ndjson([line("par")])
    with pytest.raises(ProviderUnavailable, match="before done"):
        await complete(provider, request())


async def test_length_and_non_streaming(wire: WireServer, provider: OllamaProvider) -> None:
    wire.json({**final("length", 3, 4), "message": {"role": "assistant", "content": "abc"}})
    result = await complete(provider, request(options={"stream": False}))
    assert wire.requests[0].json()["stream"] is False
    assert result.text == "abc"
    assert result.finish_reason == "length"
    assert result.usage == Usage(3, 4)


@pytest.mark.parametrize(
    ("value", "url"),
    [
        (None, "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("example.test", "http://example.test:11434"),
        ("example.test:8080", "http://example.test:8080"),
        ("https://example.test/ollama/", "https://example.test/ollama"),
        ("http://[::1]:9999", "http://[::1]:9999"),
    ],
)
def test_ollama_host(value: str | None, url: str) -> None:
    assert ollama_host(value) == url


async def test_host_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", "10.1.2.3:1234")
    provider = OllamaProvider()
    assert provider.base_url == "http://10.1.2.3:1234"
    await provider.aclose()


async def test_text_with_unicode_line_separators_stays_whole(
    wire: WireServer, provider: OllamaProvider
) -> None:
    text = "one\u2028two\u2029three\x85four\x1cfive\x0bsix"  # str.splitlines splits at each
    lines = [line(text), final()]
    chunks = [json.dumps(x, ensure_ascii=False).encode() + b"\n" for x in lines]
    wire.reply(200, chunks, headers={"content-type": "application/x-ndjson"}, split=7)
    parts = [p async for p in provider.stream(request())]
    assert assemble(parts).message.text == text


async def test_a_whole_answer_not_done_is_unavailable(
    wire: WireServer, provider: OllamaProvider
) -> None:
    body = {"model": "m", "message": {"role": "assistant", "content": "par"}, "done": False}
    for _ in range(3):
        wire.json(body)
    with pytest.raises(ProviderUnavailable, match="malformed response: done is False"):
        await complete(provider, request(options={"stream": False}))


async def test_a_streamed_content_that_is_no_text_is_unavailable(
    wire: WireServer, provider: OllamaProvider
) -> None:
    for _ in range(3):
        wire.ndjson([{"model": "m", "message": {"content": 42}, "done": False}, final()])
    with pytest.raises(ProviderUnavailable, match=r"malformed response: message\.content is 42"):
        await complete(provider, request())
