"""Anthropic messages API: ``POST {base_url}/v1/messages``.

Streams SSE events (``message_start``, ``content_block_start/delta/stop``,
``message_delta``, ``message_stop``, ``ping``, ``error``). Thinking blocks become
``ReasoningDelta`` with their signature; ``tool_use`` blocks become ``ToolCallDelta``
numbered by their order among the tool calls; prompt-cache usage is kept apart.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping
from typing import Any

import httpx
from httpx_sse import EventSource

from statekernel._records.messages import (
    FinishReason,
    ImagePart,
    Message,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
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
    index_of,
    malformed,
    need_list,
    need_object,
    need_text,
    optional_object,
    shown,
    token_count,
)
from statekernel.providers._http import HTTPProvider
from statekernel.providers._keys import api_key as provider_key
from statekernel.providers._responses_wire import reasoning_item

__all__ = ["AnthropicProvider", "anthropic_messages", "anthropic_usage"]

OFFICIAL_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096

_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


def anthropic_usage(data: Mapping[str, Any], provider: str = "anthropic") -> Usage:
    """An Anthropic ``usage`` object (input tokens already exclude cache reads and writes).

    Raises:
        ProviderUnavailable: a count is not a non-negative int (missing or null is 0).
    """

    def count(key: str) -> int:
        return token_count(provider, data, key, "usage")

    return Usage(
        input_tokens=count("input_tokens"),
        output_tokens=count("output_tokens"),
        cache_read_tokens=count("cache_read_input_tokens"),
        cache_write_tokens=count("cache_creation_input_tokens"),
    )


class AnthropicProvider(HTTPProvider):
    """The ``anthropic`` provider.

    ``api_key`` and ``base_url`` default to ``ANTHROPIC_API_KEY`` and
    ``ANTHROPIC_BASE_URL``. ``max_tokens`` is required by the API: requests without
    one use ``default_max_tokens``. Keys in ``request.options`` (for instance
    ``thinking``, ``top_k``, ``metadata``; not ``stream``) are added to the payload.
    """

    name = "anthropic"
    url_variable: str | None = "ANTHROPIC_BASE_URL"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        beta: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or OFFICIAL_BASE_URL
        api_key = provider_key(api_key, "ANTHROPIC_API_KEY")
        if not api_key and base_url.rstrip("/") == OFFICIAL_BASE_URL:
            raise ConfigError("the anthropic provider needs ANTHROPIC_API_KEY (or api_key=...)")
        super().__init__(base_url=base_url, **kwargs)
        self._api_key = api_key or None
        self.default_max_tokens = default_max_tokens
        self._beta = ",".join(beta)

    def _secrets(self) -> Iterable[str]:
        return (self._api_key,) if self._api_key else ()

    def _endpoint(self, request: ModelRequest, streaming: bool) -> str:
        return f"{self.base_url}/v1/messages"

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        if self._beta:
            headers["anthropic-beta"] = self._beta
        return headers

    def _payload(self, request: ModelRequest, streaming: bool) -> dict[str, Any]:
        system, messages = anthropic_messages(request.messages)
        payload: dict[str, Any] = {
            "model": request.model_name,
            "max_tokens": request.max_tokens or self.default_max_tokens,
            "messages": messages,
        }
        if system:
            payload["system"] = system
        if streaming:
            payload["stream"] = True
        if request.tools:
            payload["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
        if request.tool_choice:
            payload["tool_choice"] = _tool_choice(request.tool_choice)
        output, spec = output_tool(request), request.output
        if output is not None and spec is not None:  # structured output: a tool to end with
            tool = {"name": output, "description": _OUTPUT_TOOL_TEXT, "input_schema": spec.schema}
            payload["tools"] = [*payload.get("tools", []), tool]
            choice = {"type": "any"} if request.tools else {"type": "tool", "name": output}
            payload["tool_choice"] = choice
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.stop:
            payload["stop_sequences"] = list(request.stop)
        options = request.options if isinstance(request.options, Mapping) else {}
        payload.update({k: v for k, v in options.items() if k != "stream"})
        return payload

    async def _parse_stream(
        self, response: httpx.Response, request: ModelRequest
    ) -> AsyncGenerator[StreamPart, None]:
        state = _StreamState(output_tool(request))
        async for sse in EventSource(response).aiter_sse():
            if not sse.data:
                continue
            data = self._json(sse.data)
            if not isinstance(data, dict):
                continue
            kind = data.get("type") or sse.event
            if kind == "error":
                raise error_in_answer(self.name, data.get("error"), secrets=self._secrets())
            for part in state.feed(kind, data, self.name):
                yield part
            if state.stopped:
                break
        if not state.stopped:
            raise ProviderUnavailable(
                f"{self.name}: stream ended before message_stop", provider=self.name
            )
        yield StreamEnd(state.finish, state.model)

    def _parse_body(self, data: Any, request: ModelRequest) -> Iterable[StreamPart]:
        if not isinstance(data, dict):
            raise ProviderUnavailable(f"{self.name}: unexpected response body", provider=self.name)
        if data.get("type") == "error" or data.get("error"):
            raise error_in_answer(self.name, data.get("error"), secrets=self._secrets())
        parts: list[StreamPart] = []
        output = output_tool(request)
        for index, block in enumerate(need_list(self.name, data.get("content"), "content")):
            parts.extend(_whole_block(self.name, block, f"content[{index}]", output))
        usage = optional_object(self.name, data.get("usage"), "usage")
        if usage:
            parts.append(UsageUpdate(anthropic_usage(usage, self.name)))
        finish = _FINISH.get(data.get("stop_reason") or "", "other")
        if finish == "tool_calls" and not any(isinstance(p, ToolCallDone) for p in parts):
            finish = "stop"  # it called the output tool alone: that is its final answer
        parts.append(StreamEnd(finish, data.get("model")))
        return parts


_OUTPUT_TOOL = "final_result"
_OUTPUT_TOOL_TEXT = "Give your final answer with this tool, once you have it."


def output_tool(request: ModelRequest) -> str | None:
    """The name of the tool that carries a structured final answer (None without
    ``request.output``): ``final_result``, unless a tool of the request has that name."""
    if request.output is None:
        return None
    names = {t.name for t in request.tools}
    name, n = _OUTPUT_TOOL, 1
    while name in names:
        n += 1
        name = f"{_OUTPUT_TOOL}_{n}"
    return name


def _whole_block(
    provider: str, item: Any, where: str, output: str | None = None
) -> Iterator[StreamPart]:
    """The parts of one content block of a JSON answer (unknown block types carry none)."""
    block = need_object(provider, item, where)
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise malformed(provider, f"{where}.text", f"{shown(text)}, not a string")
        if text:
            yield TextDelta(text)
    elif kind == "thinking":
        yield ReasoningDelta(block.get("thinking") or "", block.get("signature") or "")
    elif kind == "redacted_thinking":
        yield ReasoningDelta("", block.get("data") or "", redacted=True)
    elif kind == "tool_use":
        call_id = need_text(provider, block.get("id"), f"{where}.id")
        name = need_text(provider, block.get("name"), f"{where}.name")
        arguments = need_object(provider, block.get("input"), f"{where}.input")
        if name == output:  # the structured final answer: its input is the answer's text
            yield TextDelta(tool_call_arguments_json(arguments))
        else:
            yield ToolCallDone(ToolCall(call_id, name, tool_call_arguments_json(arguments)))


class _StreamState:
    """Folds Anthropic stream events into stream parts."""

    def __init__(self, output: str | None = None) -> None:
        self.model: str | None = None
        self.finish: FinishReason = "other"
        self.stopped = False
        self._tool_index: dict[int, int] = {}  # content block index -> tool call ordinal
        self._output = output  # the tool carrying a structured final answer, if any
        self._answer: set[int] = set()  # content blocks of that tool: the answer's text

    def feed(self, kind: str, data: dict[str, Any], provider: str) -> Iterator[StreamPart]:
        """The parts of one event; malformed usage or tool use is ``ProviderUnavailable``."""
        if kind == "message_start":
            message = optional_object(provider, data.get("message"), "message")
            self.model = message.get("model")
            usage = optional_object(provider, message.get("usage"), "message.usage")
            if usage:
                yield UsageUpdate(anthropic_usage(usage, provider))
        elif kind == "content_block_start":
            block = optional_object(provider, data.get("content_block"), "content_block")
            if block.get("type") == "tool_use":
                need_text(provider, block.get("id"), "content_block.id")
                need_text(provider, block.get("name"), "content_block.name")
            yield from self._block_start(index_of(provider, data, "index", ""), block)
        elif kind == "content_block_delta":
            delta = optional_object(provider, data.get("delta"), "delta")
            yield from self._block_delta(index_of(provider, data, "index", ""), delta)
        elif kind == "message_delta":
            reason = (data.get("delta") or {}).get("stop_reason")
            if reason:
                self.finish = _FINISH.get(reason, "other")
                if self.finish == "tool_calls" and not self._tool_index and self._answer:
                    self.finish = "stop"  # the output tool alone: the final answer
            usage = optional_object(provider, data.get("usage"), "usage")
            if usage:
                yield UsageUpdate(anthropic_usage(usage, provider))
        elif kind == "message_stop":
            self.stopped = True
        # ping, content_block_stop and unknown events carry nothing to yield

    def _block_start(self, index: int, block: dict[str, Any]) -> Iterator[StreamPart]:
        kind = block.get("type")
        if kind == "tool_use" and self._output is not None and block.get("name") == self._output:
            self._answer.add(index)  # its input streams as the answer's text
        elif kind == "tool_use":
            ordinal = self._tool_index.setdefault(index, len(self._tool_index))
            yield ToolCallDelta(ordinal, id=block.get("id"), name=block.get("name"))
        elif kind == "redacted_thinking":
            yield ReasoningDelta("", block.get("data") or "", redacted=True)
        elif kind == "text" and block.get("text"):
            yield TextDelta(block["text"])
        elif kind == "thinking" and block.get("thinking"):
            yield ReasoningDelta(block["thinking"])

    def _block_delta(self, index: int, delta: dict[str, Any]) -> Iterator[StreamPart]:
        kind = delta.get("type")
        if kind == "text_delta":
            yield TextDelta(delta.get("text") or "")
        elif kind == "input_json_delta" and index in self._answer:
            yield TextDelta(delta.get("partial_json") or "")
        elif kind == "input_json_delta":
            ordinal = self._tool_index.setdefault(index, len(self._tool_index))
            yield ToolCallDelta(ordinal, arguments=delta.get("partial_json") or "")
        elif kind == "thinking_delta":
            yield ReasoningDelta(delta.get("thinking") or "")
        elif kind == "signature_delta":
            yield ReasoningDelta("", delta.get("signature") or "")


def _tool_choice(choice: str) -> dict[str, Any]:
    if choice in ("auto", "none", "any"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


def anthropic_messages(messages: Iterable[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The system text and the messages as Anthropic turns.

    Tool results become ``tool_result`` blocks in a user turn; consecutive turns of one
    role (several tool messages, then maybe user text) are merged into one turn.
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system.append(message.text)
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = [b for part in message.content if (b := _block(part)) is not None]
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return "\n\n".join(s for s in system if s), turns


def _block(part: object) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, ImagePart):
        if part.url:
            return {"type": "image", "source": {"type": "url", "url": part.url}}
        source = {"type": "base64", "media_type": part.media_type or "image/png", "data": part.data}
        return {"type": "image", "source": source}
    if isinstance(part, ToolCall):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": _input(part)}
    if isinstance(part, ToolResult):
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": part.tool_call_id,
            "content": part.content,
        }
        if part.is_error:
            block["is_error"] = True
        return block
    if isinstance(part, ReasoningPart):
        if part.redacted:
            return {"type": "redacted_thinking", "data": part.signature or ""}
        # unsigned reasoning, or an OpenAI reasoning item, is another provider's: not sent
        if part.signature and reasoning_item(part) is None:
            return {"type": "thinking", "thinking": part.text, "signature": part.signature}
    return None


def _input(call: ToolCall) -> Any:
    """The call's arguments as an object; text that is not a JSON object is kept visible."""
    try:
        value = call.parsed_arguments()
    except ValueError:
        return {"invalid_json": call.arguments}
    return value if isinstance(value, dict) else {"value": value}
