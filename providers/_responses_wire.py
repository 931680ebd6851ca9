"""The Responses API's wire format: neutral messages as ``input`` items, and the items,
events and usage of an answer as stream parts.

A reasoning item is kept whole, as the API sent it (``id``, ``summary`` and, when asked
for, ``encrypted_content``), as the ``signature`` of the ``ReasoningPart`` it becomes:
compact JSON that is sent back unchanged as an input item on the next request. The
part's ``text`` is the summary, for people to read.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from statekernel._records.messages import (
    FinishReason,
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    Usage,
)
from statekernel._storage.provider import (
    ReasoningDelta,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    UsageUpdate,
)
from statekernel.errors import ProviderError
from statekernel.providers._errors import error_in_answer
from statekernel.providers._fields import (
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
from statekernel.providers._openai import image_url

__all__ = [
    "ResponsesStream",
    "answer_parts",
    "failure",
    "reasoning_item",
    "responses_input",
    "responses_usage",
]

_INCOMPLETE: dict[str, FinishReason] = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}


def responses_usage(data: Mapping[str, Any], provider: str) -> Usage:
    """A Responses ``usage`` object: cached input tokens
    (``input_tokens_details.cached_tokens``, a part of ``input_tokens``) are counted
    apart, reasoning tokens (``output_tokens_details.reasoning_tokens``, a part of
    ``output_tokens``) are given as well.

    Raises:
        ProviderUnavailable: a count is not a non-negative int, or a details field is
            not an object.
    """
    where_in = "usage.input_tokens_details"
    where_out = "usage.output_tokens_details"
    given = token_count(provider, data, "input_tokens", "usage")
    in_details = optional_object(provider, data.get("input_tokens_details"), where_in)
    out_details = optional_object(provider, data.get("output_tokens_details"), where_out)
    cached = token_count(provider, in_details, "cached_tokens", where_in)
    return Usage(
        input_tokens=given - cached if cached <= given else given,
        output_tokens=token_count(provider, data, "output_tokens", "usage"),
        cache_read_tokens=cached,
        reasoning_tokens=token_count(provider, out_details, "reasoning_tokens", where_out),
    )


_REFUSED = frozenset(
    {
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    }
)
"""Codes of a failed response (besides those starting ``invalid_``) that a retry of the
same request cannot mend: the prompt or an image in it is refused."""


def failure(provider: str, error: Any, secrets: Iterable[str] = ()) -> ProviderError:
    """The typed error for the ``error`` of a failed response or an ``error`` event: its
    ``code`` picks the class (``rate_limit_exceeded`` is ``RateLimited``; a code starting
    ``invalid_`` or naming a refused image is ``BadRequest``; ``server_error``,
    ``vector_store_timeout`` and unknown codes are ``ProviderUnavailable``)."""
    if not isinstance(error, dict):
        return error_in_answer(provider, error, secrets=secrets)
    code = error.get("code") or error.get("type")
    message = error.get("message") or json.dumps(error)[:500]
    refused = code in _REFUSED or (isinstance(code, str) and code.startswith("invalid_"))
    if refused and code != "invalid_api_key":
        return error_in_answer(
            provider,
            {"type": "invalid_request_error", "message": f"{code}: {message}"},
            secrets=secrets,
        )
    return error_in_answer(provider, {"type": code, "message": message}, secrets=secrets)


def reasoning_item(part: ReasoningPart) -> dict[str, Any] | None:
    """The Responses reasoning item a ``ReasoningPart`` keeps in its ``signature``, or
    None when the part holds none (reasoning from another provider)."""
    signature = part.signature
    if part.redacted or not signature or not signature.startswith("{"):
        return None
    try:
        item = json.loads(signature)
    except ValueError:
        return None
    if isinstance(item, dict) and item.get("type") == "reasoning" and item.get("id"):
        return item
    return None


def _kept(item: dict[str, Any]) -> str:
    """A reasoning item as the ``signature`` that keeps it (compact JSON)."""
    return json.dumps(item, separators=(",", ":"), ensure_ascii=False)


def _summary_text(provider: str, item: dict[str, Any], where: str) -> str:
    """The text of a reasoning item's summary parts (and of its ``reasoning_text``
    content, which some models give instead), a blank line between parts."""
    texts: list[str] = []
    for key in ("summary", "content"):
        for index, entry in enumerate(optional_list(provider, item.get(key), f"{where}.{key}")):
            piece = need_object(provider, entry, f"{where}.{key}[{index}]")
            texts.append(optional_text(provider, piece.get("text"), f"{where}.{key}[{index}].text"))
    return "\n\n".join(text for text in texts if text)


def responses_input(messages: Iterable[Message], *, stateless: bool) -> list[dict[str, Any]]:
    """Neutral messages as ``input`` items: user and system messages as messages, an
    assistant message as its reasoning items, its text and its ``function_call`` items
    (in its order), each tool result as a ``function_call_output`` item.

    ``stateless`` (``store`` false): a reasoning item without ``encrypted_content`` is
    left out, as the server kept nothing its ``id`` could name.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            out.extend(
                {
                    "type": "function_call_output",
                    "call_id": part.tool_call_id,
                    "output": part.content,
                }
                for part in message.content
                if isinstance(part, ToolResult)
            )
        elif message.role == "assistant":
            out.extend(_assistant_items(message, stateless))
        else:
            out.append(_plain_message(message))
    return out


def _plain_message(message: Message) -> dict[str, Any]:
    if not any(isinstance(part, ImagePart) for part in message.content):
        return {"role": message.role, "content": message.text}
    content: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):
            content.append({"type": "input_text", "text": part.text})
        elif isinstance(part, ImagePart):
            content.append({"type": "input_image", "image_url": image_url(part), "detail": "auto"})
    return {"role": message.role, "content": content}


def _assistant_items(message: Message, stateless: bool) -> Iterator[dict[str, Any]]:
    text: list[str] = []
    for part in message.content:
        if isinstance(part, TextPart):
            text.append(part.text)
            continue
        if text:
            yield {"type": "message", "role": "assistant", "content": "".join(text)}
            text = []
        if isinstance(part, ReasoningPart):
            item = reasoning_item(part)
            if item is not None and not (stateless and not item.get("encrypted_content")):
                yield item
        elif isinstance(part, ToolCall):
            yield {
                "type": "function_call",
                "call_id": part.id,
                "name": part.name,
                "arguments": part.arguments or "{}",
            }
    if text:
        yield {"type": "message", "role": "assistant", "content": "".join(text)}


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _function_call(provider: str, item: dict[str, Any], where: str) -> ToolCall:
    arguments = optional_text(provider, item.get("arguments"), f"{where}.arguments")
    return ToolCall(
        id=tool_call_id(provider, item.get("call_id"), f"{where}.call_id") or _new_call_id(),
        name=need_text(provider, item.get("name"), f"{where}.name"),
        arguments=arguments,
    )


def _message_text(provider: str, item: dict[str, Any], where: str) -> tuple[str, bool]:
    """The text of an output message and whether it is a refusal."""
    texts: list[str] = []
    refused = False
    for index, entry in enumerate(optional_list(provider, item.get("content"), f"{where}.content")):
        part = need_object(provider, entry, f"{where}.content[{index}]")
        if part.get("type") == "refusal":
            refused = True
            texts.append(optional_text(provider, part.get("refusal"), f"{where}.content[{index}]"))
        elif part.get("type") == "output_text":
            field = f"{where}.content[{index}].text"
            texts.append(optional_text(provider, part.get("text"), field))
    return "".join(texts), refused


def _answer_finish(provider: str, response: dict[str, Any], refused: bool) -> FinishReason:
    """The finish reason of a finished response object (its ``status``)."""
    if refused:
        return "content_filter"
    status = response.get("status")
    if status == "incomplete":
        details = optional_object(
            provider, response.get("incomplete_details"), "incomplete_details"
        )
        return _INCOMPLETE.get(str(details.get("reason")), "other")
    return "stop" if status in ("completed", None) else "other"


def answer_parts(
    provider: str, data: dict[str, Any], secrets: Iterable[str]
) -> tuple[list[StreamPart], FinishReason]:
    """The parts of a whole response object and its finish reason; a failed one (or an
    ``error`` in it) is raised by its code, a malformed field is ``ProviderUnavailable``."""
    if data.get("error") or data.get("status") == "failed":
        raise failure(provider, data.get("error") or "the response failed", secrets)
    parts: list[StreamPart] = []
    refused = False
    for index, entry in enumerate(need_list(provider, data.get("output"), "output")):
        where = f"output[{index}]"
        item = need_object(provider, entry, where)
        kind = item.get("type")
        if kind == "message":
            text, refusal = _message_text(provider, item, where)
            refused = refused or refusal
            if text:
                parts.append(TextDelta(text))
        elif kind == "reasoning":
            need_text(provider, item.get("id"), f"{where}.id")
            parts.append(ReasoningDelta(_summary_text(provider, item, where), _kept(item)))
        elif kind == "function_call":
            parts.append(ToolCallDone(_function_call(provider, item, where)))
    usage = optional_object(provider, data.get("usage"), "usage")
    if usage:
        parts.append(UsageUpdate(responses_usage(usage, provider)))
    return parts, _answer_finish(provider, data, refused)


class ResponsesStream:
    """Folds the Responses API's stream events into stream parts.

    Text, refusal, reasoning and argument deltas stream as they come; an item's
    ``response.output_item.done`` completes what its deltas did not give (a reasoning
    item's whole JSON is its signature then). ``finish`` is set by the terminal event
    (``response.completed`` or ``response.incomplete``); ``response.failed`` and
    ``error`` events are raised as typed errors.
    """

    def __init__(self, provider: str, secrets: Iterable[str] = ()) -> None:
        self.provider = provider
        self.secrets = tuple(secrets)
        self.finish: FinishReason | None = None
        self.model: str | None = None
        self.refused = False
        self._streamed: set[str] = set()
        """Ids of the items whose text (or reasoning) came as deltas."""
        self._calls: dict[int, bool] = {}
        """Output indices of the function calls begun: whether arguments streamed."""

    def feed(self, event: dict[str, Any]) -> Iterator[StreamPart]:
        """The parts of one event; a malformed field is ``ProviderUnavailable`` naming it."""
        provider = self.provider
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self._note_model(optional_object(provider, event.get("response"), "response"))
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            delta = optional_text(provider, event.get("delta"), f"{kind}.delta")
            self._streamed.add(str(event.get("item_id")))
            if kind == "response.refusal.delta":
                self.refused = True
            if delta:
                yield TextDelta(delta)
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            delta = optional_text(provider, event.get("delta"), f"{kind}.delta")
            item_id = str(event.get("item_id"))
            if delta:
                yield ReasoningDelta(delta)
            self._streamed.add(item_id)
        elif kind == "response.reasoning_summary_part.added":
            if index_of(provider, event, "summary_index", kind) > 0:
                yield ReasoningDelta("\n\n")
        elif kind == "response.function_call_arguments.delta":
            index = index_of(provider, event, "output_index", kind)
            delta = optional_text(provider, event.get("delta"), f"{kind}.delta")
            if index not in self._calls:
                raise malformed(
                    provider, f"{kind}.output_index", f"is {index}, no call begun there"
                )
            if delta:
                self._calls[index] = True
                yield ToolCallDelta(index, arguments=delta)
        elif kind in ("response.output_item.added", "response.output_item.done"):
            yield from self._item(event, kind)
        elif kind in ("response.completed", "response.incomplete"):
            yield from self._finished(event, kind)
        elif kind == "response.failed":
            response = optional_object(provider, event.get("response"), "response")
            raise failure(provider, response.get("error") or "the response failed", self.secrets)
        elif kind == "error":
            raise failure(provider, event.get("error") or event, self.secrets)

    def _note_model(self, response: dict[str, Any]) -> None:
        model = response.get("model")
        if isinstance(model, str) and model:
            self.model = model

    def _item(self, event: dict[str, Any], kind: str) -> Iterator[StreamPart]:
        provider = self.provider
        index = index_of(provider, event, "output_index", kind)
        where = f"{kind}.item"
        item = need_object(provider, event.get("item"), where)
        done = kind == "response.output_item.done"
        item_kind = item.get("type")
        if item_kind == "function_call":
            call = _function_call(provider, item, where)
            if index not in self._calls:
                self._calls[index] = bool(call.arguments)
                yield ToolCallDelta(index, call.id, call.name, call.arguments)
            elif done and not self._calls[index] and call.arguments:
                self._calls[index] = True
                yield ToolCallDelta(index, arguments=call.arguments)
        elif done and item_kind == "reasoning":
            item_id = need_text(provider, item.get("id"), f"{where}.id")
            text = "" if item_id in self._streamed else _summary_text(provider, item, where)
            yield ReasoningDelta(text, _kept(item))
        elif done and item_kind == "message" and str(item.get("id")) not in self._streamed:
            text, refused = _message_text(provider, item, where)
            self.refused = self.refused or refused
            if text:
                yield TextDelta(text)

    def _finished(self, event: dict[str, Any], kind: str) -> Iterator[StreamPart]:
        provider = self.provider
        response = need_object(provider, event.get("response"), f"{kind}.response")
        self._note_model(response)
        usage = optional_object(provider, response.get("usage"), "usage")
        if usage:
            yield UsageUpdate(responses_usage(usage, provider))
        if kind == "response.incomplete" and response.get("status") is None:
            response = {**response, "status": "incomplete"}
        self.finish = _answer_finish(provider, response, self.refused)
