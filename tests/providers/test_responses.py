"""OpenAI's Responses API over real HTTP: typed SSE events as the API documents them."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

import statekernel as sk
from statekernel._records.messages import (
    ImagePart,
    Message,
    ModelRequest,
    OutputSpec,
    ReasoningPart,
    ToolCall,
    ToolSpec,
    Usage,
)
from statekernel.errors import BadRequest, ConfigError, ProviderUnavailable, RateLimited
from statekernel.providers import (
    OpenAIResponsesProvider,
    ReasoningDelta,
    RetryPolicy,
    StreamEnd,
    TextDelta,
    ToolCallDelta,
    builtin_provider,
    complete,
)
from statekernel.providers._responses_wire import responses_input

from .conftest import Sleeps, WireServer

MODEL = "gpt-5-mini-2025-08-07"
WEATHER = ToolSpec(
    "get_weather",
    "Current weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
REASONING = {
    "type": "reasoning",
    "id": "rs_0a1b2c",
    "summary": [
        {"type": "summary_text", "text": "The user wants the weather."},
        {"type": "summary_text", "text": "I should call the tool."},
    ],
    "encrypted_content": "gAAAAABo-opaque-blob==",
}

Event = tuple[str, dict[str, Any]]


def responses_events(
    pieces: Sequence[str],
    calls: Iterable[tuple[str, str, str]] = (),
    *,
    usage: tuple[int, int] = (11, 7),
    cached: int = 0,
    reasoning_tokens: int = 0,
    reasoning: dict[str, Any] | None = None,
    model: str = "m",
    terminal: str = "response.completed",
    status: str = "completed",
    incomplete: str | None = None,
) -> list[Event]:
    """The events of one streamed response, as the API sends them: a reasoning item (its
    summary streamed part by part), a message of ``pieces``, then function calls
    ``(call_id, name, arguments)`` whose arguments stream four characters at a time."""
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> Event:
        return kind, {"type": kind, "sequence_number": next(numbers), **fields}

    response: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1741290958,
        "status": "in_progress",
        "model": model,
        "output": [],
        "usage": None,
    }
    events = [
        event("response.created", response=response),
        event("response.in_progress", response=response),
    ]
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        at, rid = len(output), reasoning["id"]
        events.append(
            event("response.output_item.added", output_index=at, item={**reasoning, "summary": []})
        )
        for number, part in enumerate(reasoning["summary"]):
            where = {"item_id": rid, "output_index": at, "summary_index": number}
            empty = {"type": "summary_text", "text": ""}
            events.append(event("response.reasoning_summary_part.added", **where, part=empty))
            for piece in _pieces(part["text"]):
                events.append(event("response.reasoning_summary_text.delta", **where, delta=piece))
            events.append(event("response.reasoning_summary_text.done", **where, text=part["text"]))
            events.append(event("response.reasoning_summary_part.done", **where, part=part))
        events.append(event("response.output_item.done", output_index=at, item=reasoning))
        output.append(reasoning)
    if pieces:
        at, text = len(output), "".join(pieces)
        message: dict[str, Any] = {
            "type": "message",
            "id": "msg_1",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        where = {"item_id": "msg_1", "output_index": at, "content_index": 0}
        events.append(event("response.output_item.added", output_index=at, item=message))
        part = {"type": "output_text", "text": "", "annotations": []}
        events.append(event("response.content_part.added", **where, part=part))
        for piece in pieces:
            events.append(event("response.output_text.delta", **where, delta=piece, logprobs=[]))
        events.append(event("response.output_text.done", **where, text=text, logprobs=[]))
        part = {**part, "text": text}
        events.append(event("response.content_part.done", **where, part=part))
        message = {**message, "status": "completed", "content": [part]}
        events.append(event("response.output_item.done", output_index=at, item=message))
        output.append(message)
    for number, (call_id, name, arguments) in enumerate(calls):
        at, fid = len(output), f"fc_{number}"
        item = {
            "type": "function_call",
            "id": fid,
            "call_id": call_id,
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        events.append(event("response.output_item.added", output_index=at, item=item))
        for piece in _pieces(arguments):
            where = {"item_id": fid, "output_index": at}
            events.append(event("response.function_call_arguments.delta", **where, delta=piece))
        where = {"item_id": fid, "output_index": at}
        events.append(event("response.function_call_arguments.done", **where, arguments=arguments))
        item = {**item, "arguments": arguments, "status": "completed"}
        events.append(event("response.output_item.done", output_index=at, item=item))
        output.append(item)
    given, out = usage
    final = {
        **response,
        "status": status,
        "output": output,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "usage": {
            "input_tokens": given,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": given + out,
        },
    }
    events.append(event(terminal, response=final))
    return events


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def failed(code: str, message: str) -> Event:
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "failed",
        "model": MODEL,
        "output": [],
        "error": {"code": code, "message": message},
    }
    return "response.failed", {
        "type": "response.failed",
        "sequence_number": 1,
        "response": response,
    }


@pytest.fixture
async def provider(wire: WireServer, sleeps: Sleeps) -> AsyncIterator[OpenAIResponsesProvider]:
    made = OpenAIResponsesProvider(base_url=f"{wire.url}/v1", api_key="sk-test", sleep=sleeps)
    yield made
    await made.aclose()


def request(*messages: Message, **kw: Any) -> ModelRequest:
    return ModelRequest(
        f"openai-responses/{MODEL}", messages or [Message.user("Weather in Paris?")], **kw
    )


# -- streaming ------------------------------------------------------------------------------


async def test_streamed_text(wire: WireServer, provider: OpenAIResponsesProvider) -> None:
    wire.sse(responses_events(["It is ", "sunny ", "today."], model=MODEL))
    parts = [part async for part in provider.stream(request())]
    assert [p.text for p in parts if isinstance(p, TextDelta)] == ["It is ", "sunny ", "today."]
    assert parts[-1] == StreamEnd("stop", MODEL)
    seen = wire.requests[0]
    assert (seen.method, seen.path) == ("POST", "/v1/responses")
    assert seen.headers["authorization"] == "Bearer sk-test"
    assert seen.json() == {
        "model": MODEL,
        "input": [{"role": "user", "content": "Weather in Paris?"}],
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
    }


async def test_request_payload(wire: WireServer, provider: OpenAIResponsesProvider) -> None:
    wire.sse(responses_events(["ok"]))
    image = ImagePart(data="aGk=", media_type="image/jpeg")
    asked = request(
        Message.system("Be brief."),
        Message("user", (*Message.user("What is this?").content, image)),
        tools=[WEATHER],
        tool_choice="get_weather",
        output=OutputSpec("Person", {"type": "object"}),
        max_tokens=50,
        temperature=0.2,
        options={"parallel_tool_calls": False, "stream": True},
    )
    await complete(provider, asked)
    body = wire.requests[0].json()
    assert body["input"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {
                    "type": "input_image",
                    "image_url": "data:image/jpeg;base64,aGk=",
                    "detail": "auto",
                },
            ],
        },
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": WEATHER.parameters,
            "strict": False,
            "description": "Current weather in a city.",
        }
    ]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "Person", "schema": {"type": "object"}}
    }
    assert (body["max_output_tokens"], body["temperature"]) == (50, 0.2)
    assert body["parallel_tool_calls"] is False


async def test_stop_sequences_are_refused_before_sending(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    with pytest.raises(BadRequest, match="no stop sequences"):
        await complete(provider, request(stop=["END"]))
    assert wire.requests == []


async def test_store_and_reasoning_options(wire: WireServer) -> None:
    wire.sse(responses_events(["ok"]))
    provider = OpenAIResponsesProvider(
        base_url=wire.url, store=True, reasoning={"effort": "low", "summary": "auto"}
    )
    try:
        await complete(provider, request())
    finally:
        await provider.aclose()
    body = wire.requests[0].json()
    assert body["store"] is True
    assert "include" not in body  # the server keeps the reasoning items itself
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert "authorization" not in wire.requests[0].headers  # a local server needs no key
    wire.sse(responses_events(["ok"]))
    plain = OpenAIResponsesProvider(base_url=wire.url, encrypted_reasoning=False)
    try:
        await complete(plain, request())
    finally:
        await plain.aclose()
    body = wire.requests[1].json()
    assert (body["store"], "include" in body, "reasoning" in body) == (False, False, False)


async def test_streamed_tool_calls(wire: WireServer, provider: OpenAIResponsesProvider) -> None:
    calls = [("call_a", "get_weather", '{"city":"Paris"}'), ("call_b", "get_weather", "{}")]
    for _ in range(2):
        wire.sse(responses_events(["Checking."], calls))
    parts = [part async for part in provider.stream(request(tools=[WEATHER]))]
    deltas = [p for p in parts if isinstance(p, ToolCallDelta)]
    assert deltas[0] == ToolCallDelta(1, "call_a", "get_weather", "")
    assert "".join(d.arguments for d in deltas if d.index == 1) == '{"city":"Paris"}'
    result = await complete(provider, request(tools=[WEATHER]))
    assert result.text == "Checking."
    assert result.tool_calls == (
        ToolCall("call_a", "get_weather", '{"city":"Paris"}'),
        ToolCall("call_b", "get_weather", "{}"),
    )
    assert result.finish_reason == "tool_calls"


async def test_reasoning_summary_streams_and_the_item_is_kept_whole(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    wire.sse(responses_events(["Sunny."], reasoning=REASONING))
    parts = [part async for part in provider.stream(request())]
    reasoning = [p for p in parts if isinstance(p, ReasoningDelta)]
    assert "".join(p.text for p in reasoning) == (
        "The user wants the weather.\n\nI should call the tool."
    )
    assert json.loads(reasoning[-1].signature or "") == REASONING
    wire.sse(responses_events(["Sunny."], reasoning=REASONING))
    result = await complete(provider, request())
    (part, _text) = result.message.content
    assert isinstance(part, ReasoningPart)
    assert part.text == "The user wants the weather.\n\nI should call the tool."
    assert json.loads(part.signature or "") == REASONING


async def test_usage_with_cached_and_reasoning_tokens(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    wire.sse(responses_events(["ok"], usage=(1200, 300), cached=1024, reasoning_tokens=256))
    result = await complete(provider, request())
    assert result.usage == Usage(
        input_tokens=176, output_tokens=300, cache_read_tokens=1024, reasoning_tokens=256
    )
    assert result.usage.total_tokens == 1500


async def test_a_refusal_is_the_text_and_ends_as_content_filter(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    events = responses_events([])
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    refusal = ("response.refusal.delta", {"type": "response.refusal.delta", **where})
    refusal[1]["delta"] = "I can't help with that."
    wire.sse([*events[:-1], refusal, events[-1]])
    result = await complete(provider, request())
    assert (result.text, result.finish_reason) == ("I can't help with that.", "content_filter")


async def test_an_incomplete_response_ends_as_length(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    wire.sse(
        responses_events(
            ["Once upon"],
            terminal="response.incomplete",
            status="incomplete",
            incomplete="max_output_tokens",
        )
    )
    result = await complete(provider, request())
    assert (result.text, result.finish_reason) == ("Once upon", "length")


async def test_a_stream_without_its_terminal_event_is_unavailable(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    events = responses_events(["Hello."])[:-1]
    for _ in range(4):
        wire.sse(events)
    with pytest.raises(ProviderUnavailable, match="stream ended before"):
        await complete(provider, request())


async def test_a_whole_response_body(wire: WireServer, provider: OpenAIResponsesProvider) -> None:
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
        "status": "completed",
    }
    *_, completed = responses_events(["Let me check."], reasoning=REASONING, model=MODEL)
    body = completed[1]["response"]
    body["output"].append(call)
    wire.json(body)
    result = await complete(provider, request(options={"stream": False}))
    assert "stream" not in wire.requests[0].json()
    reasoning, text, made = result.message.content
    assert isinstance(reasoning, ReasoningPart)
    assert json.loads(reasoning.signature or "") == REASONING
    assert reasoning.text == "The user wants the weather.\n\nI should call the tool."
    assert text == Message.assistant("Let me check.").content[0]
    assert made == ToolCall("call_1", "get_weather", '{"city":"Paris"}')
    assert (result.finish_reason, result.model, result.usage) == ("tool_calls", MODEL, Usage(11, 7))


# -- what goes back: reasoning items, calls and results ---------------------------------------


def test_reasoning_of_another_provider_or_without_encrypted_content_is_not_sent() -> None:
    bare = {key: value for key, value in REASONING.items() if key != "encrypted_content"}
    messages = [
        Message.assistant(
            "Hi.",
            reasoning=[
                ReasoningPart("anthropic thinking", "EqQBCkYIARgCIkB..."),
                ReasoningPart("", json.dumps(bare)),
                ReasoningPart("secret", "opaque", redacted=True),
            ],
        )
    ]
    stateless = responses_input(messages, stateless=True)
    assert stateless == [{"type": "message", "role": "assistant", "content": "Hi."}]
    stored = responses_input(messages, stateless=False)
    assert stored == [bare, {"type": "message", "role": "assistant", "content": "Hi."}]


CALLS: list[str] = []


@sk.tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    CALLS.append(city)
    return f"sunny in {city}"


async def test_a_tool_call_round_trip_sends_the_reasoning_item_back_exactly(
    wire: WireServer, tmp_path: Path
) -> None:
    CALLS.clear()
    wire.sse(
        responses_events([], [("call_7", "get_weather", '{"city": "Paris"}')], reasoning=REASONING)
    )
    wire.sse(responses_events(["It is sunny in Paris."], usage=(40, 9), cached=32))
    provider = OpenAIResponsesProvider(base_url=wire.url)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    try:
        async with sk.Kernel(
            url, tools=[get_weather], providers={"openai-responses": provider}
        ) as kernel:
            run = await kernel.start(model="openai-responses/m", messages=["Weather in Paris?"])
            async for _ in kernel.run(run.run_id, raise_on_failure=True):
                pass
    finally:
        await provider.aclose()
    assert CALLS == ["Paris"]
    second = wire.requests[1].json()
    assert second["input"] == [
        {"role": "user", "content": "Weather in Paris?"},
        REASONING,
        {
            "type": "function_call",
            "call_id": "call_7",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_7", "output": "sunny in Paris"},
    ]
    async with sk.Kernel(url) as kernel:  # the stored run keeps the item as it came
        done = await kernel.get(run.run_id)
    assert done.state == "completed"
    assert done.output == "It is sunny in Paris."
    assert responses_input(done.messages[:3], stateless=True) == second["input"]
    assert done.usage.cache_read_tokens == 32


# -- failures ----------------------------------------------------------------------------------


async def test_429_is_retried_after_retry_after(
    wire: WireServer, provider: OpenAIResponsesProvider, sleeps: Sleeps
) -> None:
    error = {
        "error": {
            "message": "Rate limit reached",
            "type": "requests",
            "code": "rate_limit_exceeded",
        }
    }
    wire.json(error, status=429, headers={"retry-after": "2"})
    wire.sse(responses_events(["ok"]))
    result = await complete(provider, request())
    assert result.text == "ok"
    assert sleeps.delays == [2.0]
    assert len(wire.requests) == 2


async def test_500_is_retried_then_raised(
    wire: WireServer, provider: OpenAIResponsesProvider, sleeps: Sleeps
) -> None:
    for _ in range(4):
        wire.json({"error": {"message": "The server had an error", "type": "server_error"}}, 500)
    with pytest.raises(ProviderUnavailable, match="HTTP 500"):
        await complete(provider, request())
    assert len(wire.requests) == 4
    assert len(sleeps.delays) == 3


async def test_a_timeout_before_any_content_is_retried(wire: WireServer, sleeps: Sleeps) -> None:
    provider = OpenAIResponsesProvider(
        base_url=wire.url, sleep=sleeps, timeout=httpx.Timeout(5.0, read=0.2)
    )
    wire.sse(responses_events(["late"]), delay=30.0)  # silent until the client gives up
    wire.sse(responses_events(["ok"]))
    try:
        result = await complete(provider, request())
    finally:
        await provider.aclose()
    assert result.text == "ok"
    assert (len(wire.requests), len(sleeps.delays)) == (2, 1)


async def test_a_failed_response_is_retried_by_its_code(
    wire: WireServer, provider: OpenAIResponsesProvider, sleeps: Sleeps
) -> None:
    events = responses_events(["ok"])
    wire.sse([events[0], failed("server_error", "The model failed")])
    wire.sse(events)
    result = await complete(provider, request())
    assert result.text == "ok"
    assert len(wire.requests) == 2


@pytest.mark.parametrize("code", ["invalid_prompt", "image_content_policy_violation"])
async def test_a_failed_response_for_a_refused_prompt_is_not_retried(
    wire: WireServer, provider: OpenAIResponsesProvider, code: str
) -> None:
    wire.sse([failed(code, "The prompt was refused")])
    with pytest.raises(BadRequest, match=f"{code}: The prompt was refused"):
        await complete(provider, request())
    assert len(wire.requests) == 1


async def test_an_error_event_is_raised_by_its_code(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    error = {"type": "error", "code": "rate_limit_exceeded", "message": "Slow down", "param": None}
    provider.retry = RetryPolicy(max_attempts=1)
    wire.sse([("error", error)])
    with pytest.raises(RateLimited, match="Slow down"):
        await complete(provider, request())


async def test_a_failure_after_text_is_not_retried(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    events = responses_events(["Hello there."])
    wire.sse([*events[:-1], failed("server_error", "lost")])
    with pytest.raises(ProviderUnavailable, match="already started"):
        await complete(provider, request())
    assert len(wire.requests) == 1


async def test_bad_json_is_a_typed_error(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    for _ in range(4):
        wire.reply(200, [b"event: response.created\ndata: {not json\n\n"],
                   headers={"content-type": "text/event-stream"})  # fmt: skip
    with pytest.raises(ProviderUnavailable, match="malformed JSON"):
        await complete(provider, request())
    assert len(wire.requests) == 4
    for _ in range(4):
        wire.reply(200, b"<html>oops", headers={"content-type": "application/json"})
    with pytest.raises(ProviderUnavailable, match="malformed JSON"):
        await complete(provider, request(options={"stream": False}))
    assert len(wire.requests) == 8


async def test_a_call_s_arguments_for_no_call_begun_are_malformed(
    wire: WireServer, provider: OpenAIResponsesProvider
) -> None:
    delta = {"type": "response.function_call_arguments.delta", "output_index": 3, "delta": "{}"}
    provider.retry = RetryPolicy(max_attempts=1)
    wire.sse([("response.function_call_arguments.delta", delta)])
    with pytest.raises(ProviderUnavailable, match="output_index is 3, no call begun"):
        await complete(provider, request())


# -- configuration ---------------------------------------------------------------------------


async def test_built_in_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-RECOGNISABLE-0123456789")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    provider = builtin_provider("openai-responses")
    assert isinstance(provider, OpenAIResponsesProvider)
    assert "RECOGNISABLE" not in repr(provider)
    await provider.aclose()
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="the openai-responses provider needs OPENAI_API_KEY"):
        builtin_provider("openai-responses")
