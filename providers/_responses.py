"""OpenAI's Responses API: the ``openai-responses`` provider (``POST {base_url}/responses``).

Streaming reads the API's typed SSE events (``response.output_text.delta``,
``response.reasoning_summary_text.delta``, ``response.function_call_arguments.delta``,
``response.output_item.added``/``done``, ``response.completed`` ...). Function tools are
sent as ``{"type": "function", "name", "parameters", "strict"}``; the calls come back as
``function_call`` items keyed by ``call_id`` and their results go out as
``function_call_output`` items. Reasoning items are kept whole in the run's messages
and sent back on the next request, as a stateless (``store: false``) conversation
requires.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any

import httpx
from httpx_sse import EventSource

from statekernel._records.messages import ModelRequest, ToolSpec
from statekernel._storage.provider import StreamEnd, StreamPart
from statekernel.errors import BadRequest, ProviderUnavailable
from statekernel.providers._openai import OpenAIAccount
from statekernel.providers._responses_wire import (
    ResponsesStream,
    answer_parts,
    responses_input,
)

__all__ = ["OpenAIResponsesProvider"]


class OpenAIResponsesProvider(OpenAIAccount):
    """The ``openai-responses`` provider: OpenAI's Responses API, ``POST {base_url}/responses``.

    ``api_key`` and ``base_url`` default to ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``
    (a compatible server without authentication needs no key). Each request carries the
    whole transcript, so ``store`` is false by default: the server keeps nothing, and
    reasoning items come with their ``encrypted_content`` (``include:
    ["reasoning.encrypted_content"]``) to be sent back. ``encrypted_reasoning=False``
    leaves that out, for models that refuse it (reasoning items then stay in the run's
    messages but are not sent back unless ``store`` is true). ``reasoning`` is sent as
    the request's ``reasoning`` object (``{"effort": "low", "summary": "auto"}``), and
    ``strict_tools`` as each function tool's ``strict``. Keys in ``request.options``
    (except ``stream``) are added to the payload.
    """

    name = "openai-responses"
    url_variable: str | None = "OPENAI_BASE_URL"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        organization: str | None = None,
        store: bool = False,
        encrypted_reasoning: bool = True,
        reasoning: Mapping[str, Any] | None = None,
        strict_tools: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(api_key=api_key, base_url=base_url, organization=organization, **kwargs)
        self.store = store
        self.encrypted_reasoning = encrypted_reasoning
        self.reasoning = dict(reasoning) if reasoning is not None else None
        self.strict_tools = strict_tools

    def _endpoint(self, request: ModelRequest, streaming: bool) -> str:
        return f"{self.base_url}/responses"

    def _payload(self, request: ModelRequest, streaming: bool) -> dict[str, Any]:
        if request.stop:
            raise BadRequest(
                f"{self.name}: the Responses API takes no stop sequences"
                f" (stop={list(request.stop)!r})",
                provider=self.name,
            )
        payload: dict[str, Any] = {
            "model": request.model_name,
            "input": responses_input(request.messages, stateless=not self.store),
            "store": self.store,
        }
        if streaming:
            payload["stream"] = True
        if not self.store and self.encrypted_reasoning:
            payload["include"] = ["reasoning.encrypted_content"]
        if self.reasoning is not None:
            payload["reasoning"] = self.reasoning
        if request.tools:
            payload["tools"] = [self._tool(spec) for spec in request.tools]
        if request.tool_choice:
            payload["tool_choice"] = _tool_choice(request.tool_choice)
        if request.output is not None:  # structured output: the answer is such an object
            spec = request.output
            payload["text"] = {
                "format": {"type": "json_schema", "name": spec.name, "schema": spec.schema}
            }
        if request.max_tokens is not None:
            payload["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        options = request.options if isinstance(request.options, Mapping) else {}
        payload.update({k: v for k, v in options.items() if k != "stream"})
        return payload

    def _tool(self, spec: ToolSpec) -> dict[str, Any]:
        tool: dict[str, Any] = {
            "type": "function",
            "name": spec.name,
            "parameters": spec.parameters,
            "strict": self.strict_tools,
        }
        if spec.description:
            tool["description"] = spec.description
        return tool

    async def _parse_stream(
        self, response: httpx.Response, request: ModelRequest
    ) -> AsyncGenerator[StreamPart, None]:
        state = ResponsesStream(self.name, self._secrets())
        async for sse in EventSource(response).aiter_sse():
            if not sse.data or sse.data == "[DONE]":
                continue
            event = self._json(sse.data)
            if not isinstance(event, dict):
                raise ProviderUnavailable(
                    f"{self.name}: unexpected event {sse.data[:200]!r}", provider=self.name
                )
            if "type" not in event and sse.event:
                event = {**event, "type": sse.event}
            for part in state.feed(event):
                yield part
            if state.finish is not None:
                break
        if state.finish is None:
            raise ProviderUnavailable(
                f"{self.name}: stream ended before the answer was complete", provider=self.name
            )
        yield StreamEnd(state.finish, state.model)

    def _parse_body(self, data: Any, request: ModelRequest) -> Iterable[StreamPart]:
        """The parts of one JSON response object; a failed one (or an ``error`` in it) is
        raised as the stream's would be, a missing or malformed field is
        ``ProviderUnavailable``."""
        if not isinstance(data, dict):
            raise ProviderUnavailable(f"{self.name}: unexpected response body", provider=self.name)
        parts, finish = answer_parts(self.name, data, self._secrets())
        model = data.get("model")
        return [*parts, StreamEnd(finish, model if isinstance(model, str) else None)]


def _tool_choice(choice: str) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if choice == "any":
        return "required"
    return {"type": "function", "name": choice}
