"""The model provider protocol, the provider-neutral stream parts and their assembly."""

from __future__ import annotations

import bisect
import json
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Protocol, TypeAlias, runtime_checkable

import attrs

from statekernel._records.checks import (
    FINISH_REASONS,
    count_problem,
    kind_problem,
    usage_problem,
)
from statekernel._records.messages import (
    FinishReason,
    Message,
    ModelRequest,
    ModelResult,
    ReasoningPart,
    TextPart,
    ToolCall,
    Usage,
)
from statekernel._storage.streamed_json import StreamedObject
from statekernel.errors import ProviderError

__all__ = [
    "StreamEnd",
    "ModelProvider",
    "ReasoningDelta",
    "ResultBuilder",
    "StreamPart",
    "TextDelta",
    "ToolCallDelta",
    "ToolCallDone",
    "UsageUpdate",
    "assemble",
    "part_problem",
]


@attrs.frozen
class TextDelta:
    """A piece of answer text."""

    text: str


@attrs.frozen
class ReasoningDelta:
    """A piece of reasoning text; ``signature`` arrives with the last piece of a block.

    A ``redacted`` delta is a whole block the provider keeps encrypted: its opaque
    data is the ``signature`` and must be sent back unchanged.
    """

    text: str
    signature: str | None = None
    redacted: bool = False


@attrs.frozen
class ToolCallDelta:
    """A fragment of a tool call's argument JSON, keyed by the call's position ``index``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@attrs.frozen
class ToolCallDone:
    """A complete tool call (providers that deliver calls whole, or after assembly)."""

    call: ToolCall


@attrs.frozen
class UsageUpdate:
    """Token usage reported by the provider; later reports replace earlier ones field-wise."""

    usage: Usage


@attrs.frozen
class StreamEnd:
    """The end of the stream with a normalized finish reason."""

    reason: FinishReason
    model: str | None = None


StreamPart: TypeAlias = (
    TextDelta | ReasoningDelta | ToolCallDelta | ToolCallDone | UsageUpdate | StreamEnd
)


@runtime_checkable
class ModelProvider(Protocol):
    """Streams a ``ModelRequest`` as provider-neutral parts.

    The stream ends with a ``StreamEnd``. Failures raise the ``ProviderError`` tree.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamPart]:
        """Send ``request`` and yield its parts as they arrive.

        Yields:
            The stream parts of the answer, in order, the last a ``StreamEnd``.

        Raises:
            ProviderError: the request failed: ``RateLimited``,
                ``AuthenticationFailed``, ``BadRequest``, ``ProviderUnavailable`` or
                another ``ProviderError``.
        """
        ...

    async def aclose(self) -> None:
        """Close the provider's HTTP client or server."""
        ...


class ResultBuilder:
    """Assembles stream parts into a ``ModelResult`` (tool calls from split deltas)."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[ReasoningPart] = []
        self._reasoning_text: list[str] = []
        self._calls: dict[int, list[str | None]] = {}
        self._order: list[int] = []
        """The indices of ``_calls``, in order."""
        self._args: dict[int, StreamedObject] = {}
        self._built: dict[int, ToolCall] = {}
        self._done: list[ToolCall] = []
        self._usage = Usage()
        self._finish: FinishReason | None = None
        self._model: str | None = None

    def add(self, part: StreamPart) -> None:
        """Fold one part into the result; a part with a field of the wrong type or value
        (or anything that is not a stream part) is a ``ProviderError`` naming it.

        Raises:
            ProviderError: ``part`` is not a stream part, or a field of it has the
                wrong type or value.
        """
        problem = part_problem(part)
        if problem is not None:
            raise ProviderError(f"the model's stream sent {problem}")
        if isinstance(part, TextDelta):
            self._text.append(part.text)
        elif isinstance(part, ReasoningDelta):
            if part.redacted:
                self._close_reasoning(None)
                self._reasoning.append(ReasoningPart(part.text, part.signature, redacted=True))
                return
            self._reasoning_text.append(part.text)
            if part.signature is not None:
                self._close_reasoning(part.signature)
        elif isinstance(part, ToolCallDelta):
            slot = self._calls.get(part.index)
            if slot is None:
                slot = self._calls[part.index] = [None, None]
                self._args[part.index] = StreamedObject()
                bisect.insort(self._order, part.index)
            if part.id:
                slot[0] = part.id
            if part.name and not slot[1]:
                slot[1] = part.name
            self._args[part.index].add(part.arguments)
            self._built.pop(part.index, None)
        elif isinstance(part, ToolCallDone):
            self._done.append(part.call)
        elif isinstance(part, UsageUpdate):
            self._usage = _merge_usage(self._usage, part.usage)
        elif isinstance(part, StreamEnd):
            self._finish = part.reason
            self._model = part.model or self._model

    def complete_calls(self) -> list[ToolCall]:
        """The calls whose arguments have finished streaming, in call order, while the
        answer still streams: a call is complete when a later call began, when it came
        whole, or when its arguments form a whole JSON object. Stops at the first call
        not yet complete. An id the provider left out is given now (and kept).

        Returns:
            The complete calls so far, in call order.

        Raises:
            ProviderError: a complete call never got a name.
        """
        return [self.complete_call(n) for n in range(self.complete_count())]

    def complete_count(self) -> int:
        """How many calls ``complete_calls`` gives (in constant time, however long the
        answer: asked at each part, it keeps the stream linear).

        Returns:
            The number of complete calls so far.
        """
        order = self._order
        if order and not self._args[order[-1]].whole:
            return len(order) - 1
        return len(order) + len(self._done)

    def complete_call(self, position: int) -> ToolCall:
        """``complete_calls()[position]``, built once (until its call streams on).

        Returns:
            The call at ``position`` (below ``complete_count()``).

        Raises:
            ProviderError: the call never got a name.
        """
        if position >= len(self._order):
            return self._done[position - len(self._order)]
        return self._call(self._order[position])

    def _call(self, index: int) -> ToolCall:
        built = self._built.get(index)
        if built is None:
            slot = self._calls[index]
            if not slot[1]:  # complete (a later call began, or its arguments are whole)
                raise ProviderError(f"the model's stream sent tool call {index} without a name")
            call_id = slot[0] = slot[0] or f"call_{uuid.uuid4().hex[:24]}"
            arguments = self._args[index].text
            built = self._built[index] = ToolCall(call_id, slot[1] or "", arguments)
        return built

    def so_far(self, calls: list[ToolCall]) -> Message:
        """The answer streamed so far, ending with ``calls`` (the closed reasoning blocks
        and the text, then the calls).

        Returns:
            An ``assistant`` message: the closed reasoning blocks, the text so far,
                then ``calls``.
        """
        text = "".join(self._text)
        said = (TextPart(text),) if text else ()
        return Message("assistant", (*self._reasoning, *said, *calls))

    def _close_reasoning(self, signature: str | None) -> None:
        if self._reasoning_text or signature:
            self._reasoning.append(ReasoningPart("".join(self._reasoning_text), signature or None))
        self._reasoning_text = []

    def result(self) -> ModelResult:
        """The assembled result; tool calls ordered by index, then whole calls.

        A stream that ended without a ``StreamEnd`` is incomplete: ``ProviderError``.

        Returns:
            The result; its finish reason is ``tool_calls`` when the answer has calls
                and the stream said ``stop``.

        Raises:
            ProviderError: no ``StreamEnd`` part was added, or a call never got a name.
        """
        if self._finish is None:
            raise ProviderError(
                "the model's stream ended without a StreamEnd part (incomplete answer)"
            )
        self._close_reasoning(None)
        calls = [self._call(index) for index in self._order]
        calls.extend(self._done)
        text = "".join(self._text)
        content = (*self._reasoning, *((TextPart(text),) if text else ()), *calls)
        finish = self._finish
        if calls and finish == "stop":
            finish = "tool_calls"
        return ModelResult(Message("assistant", content), self._usage, finish, self._model)


_NONE = type(None)
_PART_FIELDS: dict[type, tuple[tuple[str, tuple[type, ...]], ...]] = {
    TextDelta: (("text", (str,)),),
    ReasoningDelta: (("text", (str,)), ("signature", (str, _NONE)), ("redacted", (bool,))),
    ToolCallDelta: (("id", (str, _NONE)), ("name", (str, _NONE)), ("arguments", (str,))),
    ToolCallDone: (("call", (ToolCall,)),),
    UsageUpdate: (("usage", (Usage,)),),
    StreamEnd: (("reason", (str,)), ("model", (str, _NONE))),
}
_CALL_FIELDS = (("id", (str,)), ("name", (str,)), ("arguments", (str,)))


def part_problem(part: object) -> str | None:
    """What is wrong with a stream part (naming the field and the value), or None."""
    kind = type(part)
    fields = _PART_FIELDS.get(kind)
    if fields is None:
        return f"{part!r:.80}, which is not a stream part"
    name = kind.__name__
    for field, kinds in fields:
        problem = kind_problem(getattr(part, field), kinds, f"{name}.{field}")
        if problem is not None:
            return problem
    if isinstance(part, ToolCallDelta):
        return count_problem(part.index, f"{name}.index")
    if isinstance(part, ToolCallDone):
        for field, kinds in _CALL_FIELDS:
            problem = kind_problem(getattr(part.call, field), kinds, f"{name}.call.{field}")
            if problem is not None:
                return problem
        if not part.call.name:
            return f"{name}.call.name: '' names no tool"
    if isinstance(part, UsageUpdate):
        return usage_problem(part.usage, f"{name}.usage")
    if isinstance(part, StreamEnd) and part.reason not in FINISH_REASONS:
        return f"{name}.reason: {part.reason!r:.60} is not one of {', '.join(FINISH_REASONS)}"
    return None


def _merge_usage(old: Usage, new: Usage) -> Usage:
    return Usage(
        *(n if n else o for o, n in zip(attrs.astuple(old), attrs.astuple(new), strict=True))
    )


def assemble(parts: Iterable[StreamPart]) -> ModelResult:
    """A ``ModelResult`` from a complete sequence of stream parts.

    Returns:
        The result, as ``ResultBuilder.result`` assembles it.

    Raises:
        ProviderError: a part is not a valid stream part, or no ``StreamEnd`` came.
    """
    builder = ResultBuilder()
    for part in parts:
        builder.add(part)
    return builder.result()


def tool_call_arguments_json(arguments: object) -> str:
    """Arguments given as an object (Anthropic, Ollama) as compact JSON text."""
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
