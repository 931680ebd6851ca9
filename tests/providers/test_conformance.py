"""One neutral request, four vendors' wire formats, one neutral result."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest

from statekernel._records.messages import (
    Message,
    ModelRequest,
    ModelResult,
    OutputSpec,
    ToolSpec,
    Usage,
)
from statekernel.errors import BadRequest, ProviderError, ProviderUnavailable
from statekernel.providers import (
    AnthropicProvider,
    ModelProvider,
    OllamaProvider,
    OpenAIProvider,
    OpenAIResponsesProvider,
    StreamEnd,
    complete,
)

from .conftest import Sleeps, WireServer, whole_answer
from .test_responses import responses_events

WEATHER = ToolSpec("get_weather", "Weather.", {"type": "object", "properties": {}})
ARGS = {"city": "Paris", "days": 2}
ARGS_TEXT = json.dumps(ARGS)


def openai_wire(wire: WireServer, text: str, call: bool) -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _pieces(text)]
    if call:
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            )
        )
        events += [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in _pieces(ARGS_TEXT)
        ]
    events.append(chunk({}, "tool_calls" if call else "stop"))
    events.append(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }
    )
    wire.sse(events, done=True)


def anthropic_wire(wire: WireServer, text: str, call: bool) -> None:
    usage = {"input_tokens": 11, "output_tokens": 1}
    events: list[Any] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "m",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    events += [
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            },
        )
        for piece in _pieces(text)
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    if call:
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "get_weather",
                        "input": {},
                    },
                },
            )
        )
        events += [
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                },
            )
            for piece in _pieces(ARGS_TEXT)
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 1}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if call else "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 7},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    wire.sse(events)


def ollama_wire(wire: WireServer, text: str, call: bool) -> None:
    def line(**message: Any) -> dict[str, Any]:
        return {
            "model": "m",
            "created_at": "2025-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": "", **message},
            "done": False,
        }

    lines = [line(content=piece) for piece in _pieces(text)]
    if call:
        lines.append(
            line(
                tool_calls=[
                    {"id": "call_1", "function": {"name": "get_weather", "arguments": ARGS}}
                ]
            )
        )
    lines.append(
        {**line(), "done": True, "done_reason": "stop", "prompt_eval_count": 11, "eval_count": 7}
    )
    wire.ndjson(lines)


def responses_wire(wire: WireServer, text: str, call: bool) -> None:
    calls = [("call_1", "get_weather", ARGS_TEXT)] if call else []
    wire.sse(responses_events(_pieces(text), calls, usage=(11, 7)))


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


VENDORS: dict[str, tuple[Callable[..., ModelProvider], Callable[..., None]]] = {
    "openai": (lambda url, **kw: OpenAIProvider(base_url=url, **kw), openai_wire),
    "anthropic": (lambda url, **kw: AnthropicProvider(base_url=url, **kw), anthropic_wire),
    "ollama": (lambda url, **kw: OllamaProvider(host=url, **kw), ollama_wire),
    "openai-responses": (
        lambda url, **kw: OpenAIResponsesProvider(base_url=url, **kw),
        responses_wire,
    ),
}


VendorCase = tuple[str, ModelProvider, Callable[[str, bool], None]]
"""A vendor's name, its provider on the wire server, and what scripts an answer there."""


@pytest.fixture(params=sorted(VENDORS))
async def vendor(
    request: pytest.FixtureRequest, wire: WireServer, sleeps: Sleeps
) -> AsyncIterator[VendorCase]:
    make, script = VENDORS[request.param]
    provider = make(wire.url, sleep=sleeps)
    yield request.param, provider, lambda *a: script(wire, *a)
    await provider.aclose()


def neutral(vendor_name: str, **kw: Any) -> ModelRequest:
    return ModelRequest(model=f"{vendor_name}/m", messages=[Message.user("Weather?")], **kw)


def without_model(result: ModelResult) -> ModelResult:
    return attrs.evolve(result, model=None)


async def test_plain_answer(vendor: VendorCase) -> None:
    name, provider, script = vendor
    script("It is sunny in Paris today.", False)
    result = await complete(provider, neutral(name))
    assert without_model(result) == ModelResult(
        Message.assistant("It is sunny in Paris today."), Usage(11, 7), "stop"
    )


async def test_tool_call(vendor: VendorCase) -> None:
    name, provider, script = vendor
    script("Checking.", True)
    result = await complete(provider, neutral(name, tools=[WEATHER]))
    assert result.text == "Checking."
    assert result.finish_reason == "tool_calls"
    assert result.usage == Usage(11, 7)
    (call,) = result.tool_calls
    assert (call.id, call.name, call.parsed_arguments()) == ("call_1", "get_weather", ARGS)


async def test_stream_ends_with_exactly_one_finish(vendor: VendorCase) -> None:
    name, provider, script = vendor
    script("Hi.", False)
    parts = [part async for part in provider.stream(neutral(name))]
    assert [type(p) for p in parts].count(StreamEnd) == 1
    assert isinstance(parts[-1], StreamEnd)


async def test_truncated_stream_is_unavailable(vendor: VendorCase, wire: WireServer) -> None:
    name, provider, script = vendor
    script("Hello there, this is long.", False)
    wire.replies[-1].drop_after = 5  # after some text was yielded
    with pytest.raises(ProviderUnavailable):
        await complete(provider, neutral(name))
    assert len(wire.requests) == 1


async def test_truncated_before_any_content_is_retried(
    vendor: VendorCase, wire: WireServer, sleeps: Sleeps
) -> None:
    name, provider, script = vendor
    script("Hello.", False)
    wire.replies[-1].drop_after = 0  # headers only: nothing reached the caller
    script("Hello.", False)
    result = await complete(provider, neutral(name))
    assert result.text == "Hello."
    assert len(wire.requests) == 2
    assert len(sleeps.delays) == 1


def test_providers_implement_the_protocol(vendor: VendorCase) -> None:
    _, provider, _ = vendor
    assert isinstance(provider, ModelProvider)


def _without_content(vendor: str, body: dict[str, Any]) -> str:
    key = {
        "openai": "choices",
        "anthropic": "content",
        "ollama": "message",
        "openai-responses": "output",
    }[vendor]
    del body[key]
    return key


def _count(value: object) -> Callable[[str, dict[str, Any]], str]:
    def put(vendor: str, body: dict[str, Any]) -> str:
        if vendor == "ollama":
            body["prompt_eval_count"] = value
            return "prompt_eval_count"
        key = "prompt_tokens" if vendor == "openai" else "input_tokens"  # Responses too
        body["usage"][key] = value
        return f"usage.{key}"

    return put


def _nameless_call(vendor: str, body: dict[str, Any]) -> str:
    if vendor == "anthropic":
        body["content"].append({"type": "tool_use", "id": "call_1", "input": {}})
        return "content[1].name"
    if vendor == "openai-responses":
        body["output"].append({"type": "function_call", "call_id": "call_1", "arguments": "{}"})
        return "output[1].name"
    call: dict[str, Any] = {"id": "call_1", "function": {"arguments": "{}"}}
    if vendor == "openai":
        body["choices"][0]["message"]["tool_calls"] = [call]
        return "choices[0].message.tool_calls[0].function.name"
    body["message"]["tool_calls"] = [call]
    return "message.tool_calls[0].function.name"


MALFORMED: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "no content": _without_content,
    "float count": _count(12.9),
    "numeric string count": _count("7"),
    "bool count": _count(True),
    "negative count": _count(-1),
    "non-numeric count": _count("many"),
    "tool call without a name": _nameless_call,
}
"""A way to spoil a vendor's whole answer, returning the field it spoils."""


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_answer_is_unavailable_naming_the_field(
    vendor: VendorCase, wire: WireServer, case: str
) -> None:
    name, provider, _ = vendor
    body = whole_answer(name)
    field = MALFORMED[case](name, body)
    for _ in range(4):  # retried like any unreadable answer, up to the default 4 attempts
        wire.json(body)
    with pytest.raises(ProviderUnavailable) as info:
        await complete(provider, neutral(name, options={"stream": False}))
    assert f"malformed response: {field} " in str(info.value)
    assert len(wire.requests) == 4


ERROR_BODIES: dict[str, tuple[Any, type[ProviderError]]] = {
    "openai": (
        {"error": {"message": "no such model", "type": "invalid_request_error"}},
        BadRequest,
    ),
    "anthropic": (
        {"error": {"message": "no such model", "type": "invalid_request_error"}},
        BadRequest,
    ),
    "ollama": ({"error": "no such model"}, ProviderUnavailable),  # Ollama's carry no type
    "openai-responses": (
        {"error": {"message": "no such model", "code": "invalid_request_error"}},
        BadRequest,
    ),
}


async def test_an_error_object_in_a_200_body_is_raised_by_its_type(
    vendor: VendorCase, wire: WireServer
) -> None:
    name, provider, _ = vendor
    body, error = ERROR_BODIES[name]
    for _ in range(4):
        wire.json(body)
    with pytest.raises(error, match="no such model") as info:
        await complete(provider, neutral(name, options={"stream": False}))
    assert type(info.value) is error
    assert len(wire.requests) == (1 if error is BadRequest else 4)


async def test_whole_answers_are_read(vendor: VendorCase, wire: WireServer) -> None:
    name, provider, _ = vendor
    wire.json(whole_answer(name))
    result = await complete(provider, neutral(name, options={"stream": False}))
    assert without_model(result) == ModelResult(Message.assistant("Hi."), Usage(11, 7), "stop")


# -- structured output: the answer as each vendor gives it, one neutral result ------------

PERSON = OutputSpec("Person", {"type": "object", "properties": {"name": {"type": "string"}}})
PERSON_TEXT = '{"name":"Ann"}'


def anthropic_output_wire(wire: WireServer, call: bool) -> None:
    """The answer as Anthropic gives it when forced to a tool: a ``tool_use`` block of the
    output tool (after a real tool call when ``call``)."""
    start = {
        "type": "message_start",
        "message": {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "m",
            "usage": {"input_tokens": 11, "output_tokens": 1},
        },
    }
    events: list[Any] = [("message_start", start)]
    blocks = [("call_1", "get_weather", ARGS_TEXT)] if call else []
    blocks.append(("toolu_out", "final_result", PERSON_TEXT))
    for index, (call_id, name, text) in enumerate(blocks):
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        )
        events += [
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": p},
                },
            )
            for p in _pieces(text)
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use"},
        "usage": {"output_tokens": 7},
    }
    events += [("message_delta", delta), ("message_stop", {"type": "message_stop"})]
    wire.sse(events)


def asked_for_output(vendor_name: str, body: dict[str, Any], tools: bool) -> None:
    """The request asked for ``PERSON`` the way the vendor's API takes it."""
    if vendor_name == "openai":
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "Person", "schema": PERSON.schema},
        }
    elif vendor_name == "ollama":
        assert body["format"] == PERSON.schema
    elif vendor_name == "openai-responses":
        assert body["text"] == {
            "format": {"type": "json_schema", "name": "Person", "schema": PERSON.schema}
        }
    else:
        final = body["tools"][-1]
        assert (final["name"], final["input_schema"]) == ("final_result", PERSON.schema)
        expected = {"type": "any"} if tools else {"type": "tool", "name": "final_result"}
        assert body["tool_choice"] == expected
        assert len(body["tools"]) == (2 if tools else 1)


async def test_structured_output_is_asked_for_and_answered_as_text(
    vendor: VendorCase, wire: WireServer
) -> None:
    name, provider, script = vendor
    if name == "anthropic":
        anthropic_output_wire(wire, call=False)
    else:
        script(PERSON_TEXT, False)
    result = await complete(provider, neutral(name, output=PERSON))
    asked_for_output(name, wire.requests[-1].json(), tools=False)
    assert without_model(result) == ModelResult(
        Message.assistant(PERSON_TEXT), Usage(11, 7), "stop"
    )


async def test_structured_output_beside_tools_keeps_the_real_calls(wire: WireServer) -> None:
    provider = AnthropicProvider(base_url=wire.url)
    try:
        anthropic_output_wire(wire, call=True)
        result = await complete(provider, neutral("anthropic", tools=[WEATHER], output=PERSON))
        asked_for_output("anthropic", wire.requests[-1].json(), tools=True)
        (call,) = result.tool_calls
        assert (call.name, call.parsed_arguments()) == ("get_weather", ARGS)
        assert result.text == PERSON_TEXT
        assert result.finish_reason == "tool_calls"
        # the whole (non-streaming) answer reads the same
        body = {
            "type": "message",
            "role": "assistant",
            "model": "m",
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 11, "output_tokens": 7},
            "content": [
                {"type": "tool_use", "id": "o", "name": "final_result", "input": {"name": "Ann"}}
            ],
        }
        wire.json(body)
        asked = neutral("anthropic", output=PERSON, options={"stream": False})
        whole = await complete(provider, asked)
        assert (whole.text, whole.tool_calls, whole.finish_reason) == (PERSON_TEXT, (), "stop")
    finally:
        await provider.aclose()


async def test_the_output_tool_takes_another_name_beside_a_tool_named_like_it(
    wire: WireServer,
) -> None:
    provider = AnthropicProvider(base_url=wire.url)
    try:
        anthropic_wire(wire, "ok", False)
        mine = ToolSpec("final_result", "Mine.", {"type": "object", "properties": {}})
        await complete(provider, neutral("anthropic", tools=[mine], output=PERSON))
        names = [t["name"] for t in wire.requests[-1].json()["tools"]]
        assert names == ["final_result", "final_result_2"]
    finally:
        await provider.aclose()
