"""Provider-neutral messages, content parts, model requests and results.

Every record is a frozen ``attrs`` class; collections are tuples so a record can be
shared between revisions without copying. JSON-like values (tool input, output,
options) are plain ``dict``/``list`` values that must be treated as read-only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import attrs

from statekernel._records.lazy import LazyTuple, as_lazy

__all__ = [
    "JSON",
    "ContentPart",
    "FinishReason",
    "ImagePart",
    "Message",
    "ModelRequest",
    "ModelResult",
    "OutputSpec",
    "ReasoningPart",
    "Role",
    "TextPart",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Usage",
]

JSON: TypeAlias = Any
"""A JSON-compatible value: None, bool, int, float, str, list or dict with str keys."""

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "error", "other"]


@attrs.frozen
class TextPart:
    """Plain text content."""

    text: str


@attrs.frozen
class ImagePart:
    """An image given by URL or by base64 ``data`` with its ``media_type``."""

    url: str | None = None
    data: str | None = None
    media_type: str | None = None


@attrs.frozen
class ReasoningPart:
    """Model reasoning ("thinking"); ``signature`` is the provider's opaque token, if any."""

    text: str
    signature: str | None = None
    redacted: bool = False


@attrs.frozen
class ToolCall:
    """A tool call the model asked for; ``arguments`` is the raw JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> JSON:
        """The arguments parsed as JSON; raises ``ValueError`` when they are not valid JSON.

        Returns:
            The parsed arguments; ``{}`` when the model wrote none (blank text).

        Raises:
            ValueError: ``arguments`` is not valid JSON (``json.JSONDecodeError``).
        """
        return json.loads(self.arguments) if self.arguments.strip() else {}


@attrs.frozen
class ToolResult:
    """The result of one tool call, as text fed back to the model."""

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False


ContentPart: TypeAlias = TextPart | ImagePart | ReasoningPart | ToolCall | ToolResult


def _parts(value: Sequence[ContentPart]) -> tuple[ContentPart, ...]:
    return tuple(value)


def _messages(value: Sequence[Message]) -> LazyTuple[Message]:
    return as_lazy(value)


def _specs(value: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
    return tuple(value)


def _strings(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class Message:
    """One message of the transcript: a role and a tuple of content parts."""

    role: Role
    content: tuple[ContentPart, ...] = attrs.field(converter=_parts, default=())
    name: str | None = None

    @classmethod
    def system(cls, text: str) -> Message:
        """A system message.

        Returns:
            A ``system`` message of one text part.
        """
        return cls("system", (TextPart(text),))

    @classmethod
    def user(cls, text: str, *, images: Sequence[ImagePart] = ()) -> Message:
        """A user message with text and optional images.

        Returns:
            A ``user`` message: the text part, then the images.
        """
        return cls("user", (TextPart(text), *images))

    @classmethod
    def assistant(
        cls,
        text: str = "",
        *,
        tool_calls: Sequence[ToolCall] = (),
        reasoning: Sequence[ReasoningPart] = (),
    ) -> Message:
        """An assistant message: optional reasoning, text, then tool calls.

        Returns:
            An ``assistant`` message (no text part when ``text`` is empty).
        """
        text_parts: tuple[ContentPart, ...] = (TextPart(text),) if text else ()
        return cls("assistant", (*reasoning, *text_parts, *tool_calls))

    @classmethod
    def tool(cls, tool_call_id: str, name: str, content: str, *, is_error: bool = False) -> Message:
        """A tool-result message answering one tool call.

        Returns:
            A ``tool`` message of one ``ToolResult``.
        """
        return cls("tool", (ToolResult(tool_call_id, name, content, is_error),))

    @property
    def text(self) -> str:
        """The concatenated text parts."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls in this message, in order."""
        return tuple(p for p in self.content if isinstance(p, ToolCall))


@attrs.frozen
class Usage:
    """Token counts; cache tokens are counted apart from plain input tokens.

    ``cost``: what the tokens cost, in the currency of the kernel's price table
    (``Kernel(prices=...)``), set by the kernel when a model answer is committed and the
    table has the price of the model that answered; None when it had none. A sum of
    usages costs the sum of the priced ones (None only when none was priced).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None

    def __add__(self, other: Usage) -> Usage:
        cost = self.cost
        if other.cost is not None:
            cost = other.cost if cost is None else cost + other.cost
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            cost,
        )

    @property
    def total_tokens(self) -> int:
        """Input (including cache) plus output tokens."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )


@attrs.frozen
class ToolSpec:
    """A tool as the model sees it: name, description and a JSON schema of its parameters."""

    name: str
    description: str = ""
    parameters: JSON = attrs.field(factory=lambda: {"type": "object", "properties": {}})


@attrs.frozen
class OutputSpec:
    """The typed final answer a run asks for (``start(output_type=...)``): the JSON Schema
    of an object its final answer must satisfy, under ``name``.

    Providers that support structured output are asked for it. A final answer that is
    not a JSON value satisfying ``schema`` is sent back to the model with what is wrong,
    up to ``retries`` times in a row; the next one fails the run (``OUTPUT_INVALID``).
    """

    name: str
    schema: JSON = attrs.field(factory=lambda: {"type": "object"})
    retries: int = 1
    failures: int = 0
    """Final answers in a row that did not satisfy ``schema`` (back to 0 with ``retry``)."""


@attrs.frozen
class ModelRequest:
    """Exactly what is sent to a model. ``model`` is ``"provider/name"``; no credentials."""

    model: str
    messages: LazyTuple[Message] = attrs.field(converter=_messages, factory=LazyTuple)
    """The exact messages sent, in order (any sequence is accepted). Usually a prefix of
    the run's transcript that shares its items and their storage with it (and with
    every other request of the run), so a run's requests cost memory linear in its
    length; a hook may send any other sequence."""
    tools: tuple[ToolSpec, ...] = attrs.field(converter=_specs, default=())
    tool_choice: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stop: tuple[str, ...] = attrs.field(converter=_strings, default=())
    options: JSON = attrs.field(factory=dict)
    output: OutputSpec | None = None
    """The typed final answer asked for: a provider that supports structured output
    asks its model for a JSON value of ``output.schema`` (OpenAI's ``response_format``,
    a forced tool on Anthropic, ``format`` on Ollama)."""

    @property
    def provider(self) -> str:
        """The provider part of ``model`` (before the first slash)."""
        return self.model.partition("/")[0]

    @property
    def model_name(self) -> str:
        """The model part of ``model`` (after the first slash)."""
        return self.model.partition("/")[2]


@attrs.frozen
class ModelResult:
    """What a model answered: the assistant message, usage and a normalized finish reason."""

    message: Message
    usage: Usage = attrs.field(factory=Usage)
    finish_reason: FinishReason = "stop"
    model: str | None = None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls the model asked for."""
        return self.message.tool_calls

    @property
    def text(self) -> str:
        """The answer's text."""
        return self.message.text
