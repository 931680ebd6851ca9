"""Ollama's native chat API: ``POST {host}/api/chat``, streamed as NDJSON.

Tool calls arrive whole (arguments as an object) and become ``ToolCallDone``;
``thinking`` becomes ``ReasoningDelta``; ``prompt_eval_count``/``eval_count`` are usage.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

import httpx

from statekernel._records.messages import (
    FinishReason,
    ImagePart,
    Message,
    ModelRequest,
    ReasoningPart,
    ToolCall,
    ToolResult,
    Usage,
)
from statekernel._storage.provider import (
    ReasoningDelta,
    StreamEnd,
    StreamPart,
    TextDelta,
    ToolCallDone,
    UsageUpdate,
    tool_call_arguments_json,
)
from statekernel.errors import BadRequest, ProviderUnavailable
from statekernel.providers._errors import error_in_answer
from statekernel.providers._fields import (
    malformed,
    need_object,
    need_text,
    optional_list,
    optional_object,
    optional_text,
    token_count,
    tool_call_id,
)
from statekernel.providers._http import HTTPProvider

__all__ = ["OllamaProvider", "ollama_host", "ollama_messages"]

DEFAULT_HOST = "http://127.0.0.1:11434"

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}

# Request fields that go into Ollama's ``options`` object rather than the top level.
_TOP_LEVEL_OPTIONS = frozenset({"format", "keep_alive", "think", "options"})


def ollama_host(value: str | None) -> str:
    """``OLLAMA_HOST``-style values as a base URL.

    A bare ``host`` or ``host:port`` is plain HTTP on port 11434 by default; a URL with a
    scheme keeps that scheme's default port. ``0.0.0.0`` (a listen address) means this host.
    """
    if not value:
        return DEFAULT_HOST
    bare = "://" not in value
    scheme, _, rest = value.partition("://") if not bare else ("http", "", value)
    hostport, slash, path = rest.partition("/")
    if hostport.startswith("0.0.0.0"):
        hostport = "127.0.0.1" + hostport[len("0.0.0.0") :]
    if bare and ":" not in hostport.rsplit("]", 1)[-1]:
        hostport += ":11434"
    return f"{scheme}://{hostport}{slash}{path}".rstrip("/")


class OllamaProvider(HTTPProvider):
    """The ``ollama`` provider; ``host`` defaults to ``OLLAMA_HOST`` then ``127.0.0.1:11434``.

    In ``request.options``, ``format``, ``keep_alive``, ``think`` and ``options`` go to
    the top level of the payload; any other key is a model option (``top_k``, ``seed``,
    ``num_ctx``...).
    """

    name = "ollama"
    url_variable: str | None = "OLLAMA_HOST"

    def __init__(self, *, host: str | None = None, **kwargs: Any) -> None:
        super().__init__(base_url=ollama_host(host or os.environ.get("OLLAMA_HOST")), **kwargs)

    def _check_json_fallback(self, response: httpx.Response) -> bool:
        return False  # one JSON body is also one NDJSON line

    def _endpoint(self, request: ModelRequest, streaming: bool) -> str:
        return f"{self.base_url}/api/chat"

    def _payload(self, request: ModelRequest, streaming: bool) -> dict[str, Any]:
        model_options: dict[str, Any] = {}
        if request.temperature is not None:
            model_options["temperature"] = request.temperature
        if request.max_tokens is not None:
            model_options["num_predict"] = request.max_tokens
        if request.stop:
            model_options["stop"] = list(request.stop)
        payload: dict[str, Any] = {
            "model": request.model_name,
            "messages": ollama_messages(request.messages),
            "stream": streaming,
        }
        if request.tools:
            payload["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        if request.output is not None:  # structured output: the answer is such an object
            payload["format"] = request.output.schema
        options = request.options if isinstance(request.options, Mapping) else {}
        for key, value in options.items():
            if key == "options" and isinstance(value, Mapping):
                model_options.update(value)
            elif key in _TOP_LEVEL_OPTIONS:
                payload[key] = value
            elif key != "stream":
                model_options[key] = value
        if model_options:
            payload["options"] = model_options
        return payload

    async def _parse_stream(
        self, response: httpx.Response, request: ModelRequest
    ) -> AsyncGenerator[StreamPart, None]:
        done = False
        async for line in _ndjson_lines(response):
            if not line.strip():
                continue
            data = self._json(line)
            if not isinstance(data, dict):
                continue
            for part in self._parts(data):
                yield part
            if data.get("done"):
                done = True
                break
        if not done:
            raise ProviderUnavailable(f"{self.name}: stream ended before done", provider=self.name)

    def _parse_body(self, data: Any, request: ModelRequest) -> Iterable[StreamPart]:
        """One JSON answer: its ``message`` and ``done: true`` are required."""
        if not isinstance(data, dict):
            raise ProviderUnavailable(f"{self.name}: unexpected response body", provider=self.name)
        if not data.get("error"):
            need_object(self.name, data.get("message"), "message")
            if data.get("done") is not True:
                raise malformed(self.name, "done", f"is {data.get('done')!r:.80}, not true")
        return list(self._parts(data))

    def _parts(self, data: dict[str, Any]) -> Iterator[StreamPart]:
        """The parts of one line (or body); a malformed field is ``ProviderUnavailable``."""
        name = self.name
        if data.get("error"):
            raise error_in_answer(name, data["error"])
        message = optional_object(name, data.get("message"), "message")
        thinking = optional_text(name, message.get("thinking"), "message.thinking")
        if thinking:
            yield ReasoningDelta(thinking)
        content = optional_text(name, message.get("content"), "message.content")
        if content:
            yield TextDelta(content)
        calls = optional_list(name, message.get("tool_calls"), "message.tool_calls")
        for index, call in enumerate(calls):
            yield ToolCallDone(_call(name, call, f"message.tool_calls[{index}]"))
        if data.get("done"):
            yield UsageUpdate(
                Usage(
                    input_tokens=token_count(name, data, "prompt_eval_count", ""),
                    output_tokens=token_count(name, data, "eval_count", ""),
                )
            )
            yield StreamEnd(
                _FINISH.get(data.get("done_reason") or "stop", "other"), data.get("model")
            )


def _call(provider: str, item: Any, where: str) -> ToolCall:
    """A whole tool call; an id the server left out (older Ollama sends none) is made."""
    call = need_object(provider, item, where)
    function = need_object(provider, call.get("function"), f"{where}.function")
    arguments = function.get("arguments")
    text = (
        arguments
        if isinstance(arguments, str)
        else tool_call_arguments_json(arguments if arguments is not None else {})
    )
    call_id = tool_call_id(provider, call.get("id"), f"{where}.id")
    name = need_text(provider, function.get("name"), f"{where}.function.name")
    return ToolCall(call_id or f"call_{uuid.uuid4().hex[:24]}", name, text)


def ollama_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Neutral messages as Ollama chat messages; images must be inline base64 data."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            out.extend(
                {"role": "tool", "content": part.content, "tool_name": part.name}
                for part in message.content
                if isinstance(part, ToolResult)
            )
            continue
        entry: dict[str, Any] = {"role": message.role, "content": message.text}
        images = [p for p in message.content if isinstance(p, ImagePart)]
        if images:
            entry["images"] = [_image_data(image) for image in images]
        thinking = "".join(
            p.text for p in message.content if isinstance(p, ReasoningPart) and not p.redacted
        )
        if thinking:
            entry["thinking"] = thinking
        if message.tool_calls:
            entry["tool_calls"] = [
                {"function": {"name": call.name, "arguments": _arguments(call)}}
                for call in message.tool_calls
            ]
        out.append(entry)
    return out


def _image_data(image: ImagePart) -> str:
    if image.data is None:
        raise BadRequest("ollama accepts only inline image data, not image URLs", provider="ollama")
    return image.data


def _arguments(call: ToolCall) -> Any:
    try:
        return call.parsed_arguments()
    except ValueError:
        return {"invalid_json": call.arguments}


async def _ndjson_lines(response: httpx.Response) -> AsyncIterator[bytes]:
    """The lines of an NDJSON body, split at ``\n`` alone (``aiter_lines`` also splits
    at U+2028, U+0085 and other separators a JSON string may hold raw)."""
    pending = bytearray()  # a line in many chunks grows in place
    async for chunk in response.aiter_bytes():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            yield bytes(pending)
            pending.clear()
            start = end + 1
        pending += chunk[start:]
    if pending:
        yield bytes(pending)
