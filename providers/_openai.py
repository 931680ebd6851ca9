"""OpenAI chat completions, and every server that speaks it (Ollama ``/v1``, vLLM, llama.cpp,
LM Studio, Groq, Together...).

Streaming uses SSE (``httpx-sse``) with ``stream_options.include_usage``; tool calls arrive
as ``ToolCallDelta`` fragments keyed by the wire's ``index``; ``reasoning_content`` (or
``reasoning``) deltas become ``ReasoningDelta``.
"""

from __future__ import annotations

import hashlib
import os
import string
import uuid
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping
from typing import Any

import httpx
from httpx_sse import EventSource

from statekernel._records.messages import (
    FinishReason,
    ImagePart,
    Message,
    ModelRequest,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
)
from statekernel._storage.provider import (
    ReasoningDelta,
    StreamEnd,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    UsageUpdate,
    tool_call_arguments_json,
)
from statekernel.errors import ConfigError, ProviderUnavailable
from statekernel.providers._errors import error_in_answer
from statekernel.providers._fields import (
    content_text,
    index_of,
    malformed,
    need_list,
    need_object,
    need_text,
    optional_list,
    optional_object,
    optional_text,
    token_count,
    tool_call_id,
)
from statekernel.providers._http import HTTPProvider
from statekernel.providers._keys import api_key as provider_key
from statekernel.providers._think import ThinkSplitter, split_think

__all__ = [
    "OpenAIAccount",
    "OpenAIProvider",
    "image_url",
    "openai_finish_reason",
    "openai_messages",
    "openai_usage",
    "short_call_id",
]

OFFICIAL_BASE_URL = "https://api.openai.com/v1"

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "eos": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
    "error": "error",
}


def openai_finish_reason(value: str | None) -> FinishReason:
    """A chat-completions ``finish_reason`` as a normalized finish reason."""
    return _FINISH.get(value or "", "other")


def _finish(value: str | None, refused: bool) -> FinishReason:
    """The finish reason; a refusal (which OpenAI ends with ``stop``) is ``content_filter``,
    so a caller can tell it from an answer."""
    return "content_filter" if refused else openai_finish_reason(value)


def openai_usage(data: Mapping[str, Any], provider: str = "openai") -> Usage:
    """A chat-completions ``usage`` object; cached prompt tokens are counted apart
    (``prompt_tokens_details.cached_tokens``, or DeepSeek's ``prompt_cache_hit_tokens``).

    Each count must be a non-negative int (missing or null is 0). Cached tokens are a
    part of ``prompt_tokens`` (as OpenAI and DeepSeek document them); more cached than
    prompt tokens can only mean a server (a proxy in front of Anthropic, say) that
    counts them apart, and is read so: ``prompt_tokens`` are then all uncached.

    Raises:
        ProviderUnavailable: a count is not a non-negative int, or a details field is
            not an object.
    """
    prompt = token_count(provider, data, "prompt_tokens", "usage")
    details_field = "usage.prompt_tokens_details"
    prompt_details = optional_object(provider, data.get("prompt_tokens_details"), details_field)
    output_details = optional_object(
        provider, data.get("completion_tokens_details"), "usage.completion_tokens_details"
    )
    cached = token_count(provider, prompt_details, "cached_tokens", details_field)
    if not cached:
        cached = token_count(provider, data, "prompt_cache_hit_tokens", "usage")
    return Usage(
        input_tokens=prompt - cached if cached <= prompt else prompt,  # counted apart
        output_tokens=token_count(provider, data, "completion_tokens", "usage"),
        cache_read_tokens=cached,
        reasoning_tokens=token_count(
            provider, output_details, "reasoning_tokens", "usage.completion_tokens_details"
        ),
    )


class OpenAIAccount(HTTPProvider):
    """What OpenAI's APIs share: the key (``api_key`` or ``OPENAI_API_KEY``, needed on
    the official ``base_url``), the ``base_url`` (or ``OPENAI_BASE_URL``), the
    ``organization``, and the headers that carry them."""

    name = "openai"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        organization: str | None = None,
        **kwargs: Any,
    ) -> None:
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or OFFICIAL_BASE_URL
        api_key = provider_key(api_key, "OPENAI_API_KEY")
        if base_url.rstrip("/") == OFFICIAL_BASE_URL and not api_key:
            raise ConfigError(f"the {self.name} provider needs OPENAI_API_KEY (or api_key=...)")
        super().__init__(base_url=base_url, **kwargs)
        self._api_key = api_key or None
        self._organization = organization

    def _secrets(self) -> Iterable[str]:
        return (self._api_key,) if self._api_key else ()

    def _headers(self) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        if self._organization:
            headers["openai-organization"] = self._organization
        return headers


class OpenAIProvider(OpenAIAccount):
    """The ``openai`` provider: ``POST {base_url}/chat/completions``.

    ``api_key`` and ``base_url`` default to ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``.
    A compatible server without authentication needs no key. ``max_tokens_field`` is
    ``max_completion_tokens`` on the official API and ``max_tokens`` elsewhere unless
    given. ``stream_usage=False`` leaves out ``stream_options`` for servers that refuse
    it. Keys in ``request.options`` (except ``stream``) are added to the payload.

    For the vendors of one table (``statekernel.providers.VENDORS``) ``name`` is the
    vendor's, ``think_tags`` turns a leading ``<think>`` section of the content into
    reasoning, and ``short_call_ids`` sends tool-call ids as nine letters and digits.
    """

    name = "openai"
    url_variable: str | None = "OPENAI_BASE_URL"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        organization: str | None = None,
        max_tokens_field: str | None = None,
        stream_usage: bool = True,
        name: str | None = None,
        think_tags: bool = False,
        short_call_ids: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(api_key=api_key, base_url=base_url, organization=organization, **kwargs)
        official = self.base_url.rstrip("/") == OFFICIAL_BASE_URL
        self.stream_usage = stream_usage
        if name is not None:
            self.name = name
        self.think_tags = think_tags
        self.short_call_ids = short_call_ids
        self.max_tokens_field = max_tokens_field or (
            "max_completion_tokens" if official else "max_tokens"
        )

    def _endpoint(self, request: ModelRequest, streaming: bool) -> str:
        return f"{self.base_url}/chat/completions"

    def _payload(self, request: ModelRequest, streaming: bool) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": request.model_name,
            "messages": openai_messages(request.messages),
        }
        if self.short_call_ids:
            _shorten_call_ids(payload["messages"])
        if streaming:
            payload["stream"] = True
            if self.stream_usage:
                payload["stream_options"] = {"include_usage": True}
        if request.tools:
            payload["tools"] = [_tool(spec) for spec in request.tools]
        if request.tool_choice:
            payload["tool_choice"] = _tool_choice(request.tool_choice)
        if request.output is not None:  # structured output: the answer is such an object
            spec = request.output
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.name, "schema": spec.schema},
            }
        if request.max_tokens is not None:
            payload[self.max_tokens_field] = request.max_tokens
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.stop:
            payload["stop"] = list(request.stop)
        options = request.options if isinstance(request.options, Mapping) else {}
        payload.update({k: v for k, v in options.items() if k != "stream"})
        return payload

    async def _parse_stream(
        self, response: httpx.Response, request: ModelRequest
    ) -> AsyncGenerator[StreamPart, None]:
        state = _StreamState(self.name)
        think = ThinkSplitter() if self.think_tags else None
        async for sse in EventSource(response).aiter_sse():
            if sse.data == "[DONE]":
                state.done = True
                break
            if not sse.data:
                continue
            for part in state.feed(self._chunk(sse.data)):
                if think is not None and isinstance(part, TextDelta):
                    for split in think.feed(part.text):
                        yield split
                else:
                    yield part
        if not (state.done or state.finish):
            raise ProviderUnavailable(
                f"{self.name}: stream ended before the answer was complete", provider=self.name
            )
        for held in think.end() if think is not None else ():
            yield held
        yield StreamEnd(_finish(state.finish, state.refused), state.model)

    def _chunk(self, raw: str) -> dict[str, Any]:
        data = self._json(raw)
        if not isinstance(data, dict):
            raise ProviderUnavailable(f"{self.name}: unexpected chunk {raw[:200]!r}")
        if data.get("error"):
            raise error_in_answer(self.name, data["error"], secrets=self._secrets())
        return data

    def _parse_body(self, data: Any, request: ModelRequest) -> Iterable[StreamPart]:
        """The parts of one JSON answer; an ``error`` object in it is raised as the
        stream's would be, and a missing or malformed field is ``ProviderUnavailable``."""
        if not isinstance(data, dict):
            raise ProviderUnavailable(f"{self.name}: unexpected response body", provider=self.name)
        if data.get("error"):
            raise error_in_answer(self.name, data["error"], secrets=self._secrets())
        choices = need_list(self.name, data.get("choices"), "choices")
        if not choices:
            raise malformed(self.name, "choices", "is empty")
        choice = need_object(self.name, choices[0], "choices[0]")
        message = need_object(self.name, choice.get("message"), "choices[0].message")
        parts: list[StreamPart] = []
        reasoning = _reasoning(self.name, message, "choices[0].message")
        where = "choices[0].message.content"
        content, thought = content_text(self.name, message.get("content"), where)
        reasoning = f"{reasoning}{thought}"
        refusal = optional_text(self.name, message.get("refusal"), "choices[0].message.refusal")
        content = f"{content}{refusal}"  # a refusal is what the model said instead
        if self.think_tags:
            tagged, content = split_think(content)
            reasoning = f"{reasoning}{tagged}"
        if reasoning:
            parts.append(ReasoningDelta(reasoning))
        if content:
            parts.append(TextDelta(content))
        where = "choices[0].message.tool_calls"
        for index, item in enumerate(optional_list(self.name, message.get("tool_calls"), where)):
            parts.append(ToolCallDone(_whole_call(self.name, item, f"{where}[{index}]")))
        usage = optional_object(self.name, data.get("usage"), "usage")
        if usage:
            parts.append(UsageUpdate(openai_usage(usage, self.name)))
        parts.append(
            StreamEnd(_finish(choice.get("finish_reason"), bool(refusal)), data.get("model"))
        )
        return parts


def _reasoning(provider: str, message: dict[str, Any], where: str) -> str:
    """The reasoning text of a message or delta (``reasoning_content`` or ``reasoning``)."""
    key = "reasoning_content" if message.get("reasoning_content") else "reasoning"
    return optional_text(provider, message.get(key), f"{where}.{key}")


def _whole_call(provider: str, item: Any, where: str) -> ToolCall:
    """A whole tool call of a JSON answer; an id the server left out is made."""
    call = need_object(provider, item, where)
    function = need_object(provider, call.get("function"), f"{where}.function")
    return ToolCall(
        id=tool_call_id(provider, call.get("id"), f"{where}.id") or _new_call_id(),
        name=need_text(provider, function.get("name"), f"{where}.function.name"),
        arguments=_arguments_text(function.get("arguments")),
    )


class _StreamState:
    """Folds chat-completion chunks into stream parts."""

    def __init__(self, provider: str = "openai") -> None:
        self.provider = provider
        """The provider's name, for the errors about a malformed chunk."""
        self.finish: str | None = None
        self.model: str | None = None
        self.done = False
        self.refused = False
        """Whether the model refused (``refusal`` instead of ``content``)."""
        self._ids: dict[int, str] = {}
        self._last = -1
        """The highest index seen (kept, not searched for at each delta)."""

    def feed(self, data: dict[str, Any]) -> Iterator[StreamPart]:
        """The parts of one chunk; a malformed field is ``ProviderUnavailable`` naming it."""
        provider = self.provider
        if self.model is None and data.get("model"):
            self.model = data["model"]
        for number, item in enumerate(optional_list(provider, data.get("choices"), "choices")):
            choice = need_object(provider, item, f"choices[{number}]")
            if choice.get("index", 0) != 0:
                continue
            where = f"choices[{number}].delta"
            delta = optional_object(provider, choice.get("delta"), where)
            content, thought = content_text(provider, delta.get("content"), f"{where}.content")
            reasoning = f"{_reasoning(provider, delta, where)}{thought}"
            if reasoning:
                yield ReasoningDelta(reasoning)
            if content:
                yield TextDelta(content)
            refusal = optional_text(provider, delta.get("refusal"), f"{where}.refusal")
            if refusal:  # what the model said instead of an answer
                self.refused = True
                yield TextDelta(refusal)
            calls = optional_list(provider, delta.get("tool_calls"), f"{where}.tool_calls")
            for index, call in enumerate(calls):
                yield self._call_delta(call, f"{where}.tool_calls[{index}]")
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        groq = optional_object(provider, data.get("x_groq"), "x_groq")  # Groq's usage place
        usage_field = "usage" if data.get("usage") else "x_groq.usage"
        usage = optional_object(provider, data.get("usage") or groq.get("usage"), usage_field)
        if usage:
            yield UsageUpdate(openai_usage(usage, provider))

    def _call_delta(self, item: Any, where: str) -> ToolCallDelta:
        provider = self.provider
        call = need_object(provider, item, where)
        function = optional_object(provider, call.get("function"), f"{where}.function")
        call_id = tool_call_id(provider, call.get("id"), f"{where}.id")
        name = function.get("name")
        if name is not None and name != "":  # a later fragment of a call may repeat ""
            name = need_text(provider, name, f"{where}.function.name")
        index = self._index(call, call_id)
        if index not in self._ids:
            self._ids[index] = call_id = call_id or _new_call_id()
            self._last = max(self._last, index)
        return ToolCallDelta(
            index=index,
            id=call_id or None,
            name=name or None,
            arguments=_arguments_text(function.get("arguments")),
        )

    def _index(self, call: dict[str, Any], call_id: str | None) -> int:
        """The wire's ``index``; servers that omit it start a new call with each new id."""
        if call.get("index") is not None:
            return index_of(self.provider, call, "index", "tool_calls[]")
        last = self._last
        if last < 0 or (call_id and call_id != self._ids[last]):
            return last + 1
        return last


def _arguments_text(arguments: Any) -> str:
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return arguments
    return tool_call_arguments_json(arguments)


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


_ALNUM = string.ascii_letters + string.digits


def short_call_id(call_id: str) -> str:
    """``call_id`` as nine letters and digits (kept if it is already): the same id always
    gives the same short one, so a call and its result still match."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        number, digit = divmod(number, len(_ALNUM))
        out.append(_ALNUM[digit])
    return "".join(out)


def _shorten_call_ids(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        for call in message.get("tool_calls") or ():
            call["id"] = short_call_id(call["id"])
        if "tool_call_id" in message:
            message["tool_call_id"] = short_call_id(message["tool_call_id"])


def _tool(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.parameters}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def _tool_choice(choice: str) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if choice == "any":
        return "required"
    return {"type": "function", "function": {"name": choice}}


def image_url(image: ImagePart) -> str:
    """The URL of an image, or a ``data:`` URL for inline data."""
    if image.url:
        return image.url
    return f"data:{image.media_type or 'image/png'};base64,{image.data or ''}"


def openai_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Neutral messages as chat-completions messages (one ``tool`` message per result)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            out.extend(
                _tool_message(part) for part in message.content if isinstance(part, ToolResult)
            )
        elif message.role == "assistant":
            out.append(_assistant_message(message))
        else:
            out.append(_plain_message(message))
    return out


def _plain_message(message: Message) -> dict[str, Any]:
    images = [p for p in message.content if isinstance(p, ImagePart)]
    content: Any
    if images:
        content = []
        for part in message.content:
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart):
                content.append({"type": "image_url", "image_url": {"url": image_url(part)}})
    else:
        content = message.text
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.name:
        out["name"] = message.name
    return out


def _assistant_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.text or None}
    calls = message.tool_calls
    if calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments or "{}"},
            }
            for call in calls
        ]
    if message.name:
        out["name"] = message.name
    return out


def _tool_message(result: ToolResult) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": result.tool_call_id, "content": result.content}
