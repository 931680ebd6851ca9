"""``ScriptedProvider``: a deterministic model for tests, demos and benchmarks (also
exported by ``statekernel.testing``, with ``Fail`` and ``call``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeAlias

import attrs

from statekernel._records.messages import FinishReason, ModelRequest, ToolCall, Usage
from statekernel._storage.provider import (
    ReasoningDelta,
    StreamEnd,
    StreamPart,
    TextDelta,
    ToolCallDelta,
    UsageUpdate,
)
from statekernel.errors import ProviderError

__all__ = ["Fail", "Reply", "ScriptedProvider", "call"]


def call(name: str, arguments: object = None, *, id: str | None = None) -> ToolCall:
    """A tool call for a script; ``arguments`` is JSON-encoded unless it is a string.

    Returns:
        The call, with ``arguments`` as JSON text (``{}`` for None) and ``id`` empty
            unless given (the provider then numbers it).
    """
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=id or "", name=name, arguments=text)


def _calls(value: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(value)


@attrs.frozen
class Reply:
    """One scripted answer (text, reasoning, tool calls), streamed in ``chunk``-sized deltas.

    ``between_calls``: seconds the stream waits before each tool call after the first
    (a call started early runs meanwhile). ``cut_off``: raised once the tool calls have
    streamed, before the answer ends (a stream that failed half way).
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = attrs.field(converter=_calls, default=())
    reasoning: str = ""
    usage: Usage = attrs.field(factory=lambda: Usage(input_tokens=10, output_tokens=5))
    finish_reason: FinishReason | None = None
    chunk: int = 0
    delay: float = 0.0
    between_calls: float = 0.0
    cut_off: Exception | None = None


@attrs.frozen
class Fail:
    """Raise ``error`` on the first ``times`` calls for this turn, then answer ``then``."""

    error: Exception
    times: int = 1
    then: Reply | None = None


ScriptItem: TypeAlias = (
    "Reply | Fail | str | ToolCall | Sequence[ToolCall] | Callable[[ModelRequest], Reply]"
)


def _as_reply(item: object, request: ModelRequest) -> Reply:
    if isinstance(item, Reply):
        return item
    if isinstance(item, str):
        return Reply(text=item)
    if isinstance(item, ToolCall):
        return Reply(tool_calls=(item,))
    if isinstance(item, list | tuple) and all(isinstance(c, ToolCall) for c in item):
        return Reply(tool_calls=tuple(item))
    if callable(item):
        return _as_reply(item(request), request)
    raise TypeError(f"not a script item: {item!r}")


def _chunks(text: str, size: int) -> list[str]:
    if not text:
        return []
    if size <= 0:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)]


class ScriptedProvider:
    """Answers from a script, deterministically.

    The answer to a request is chosen by how many assistant messages its transcript
    already holds: item 0 answers the first turn, item 1 the second, and so on. A
    re-sent request (after a crash, a retry or a fork) therefore gets the same
    answer. Past the end of the script the last item repeats when ``repeat_last``,
    else the provider raises ``ProviderError``. Tool call ids left empty become
    ``call_<turn>_<index>``. ``requests`` records every request received.
    """

    def __init__(self, script: Sequence[object], *, repeat_last: bool = False) -> None:
        self.script = list(script)
        self.repeat_last = repeat_last
        self.requests: list[ModelRequest] = []
        self._failures: dict[int, int] = {}
        self._counted: tuple[int, int, object] = (0, 0, None)

    def _turn_of(self, request: ModelRequest) -> int:
        """Assistant messages in the request, counted incrementally when the transcript
        extends the previous request's (the common case), so long runs stay cheap."""
        messages = request.messages
        seen, count, last = self._counted
        if seen and len(messages) >= seen and messages[seen - 1] is last:
            count += sum(1 for m in messages[seen:] if m.role == "assistant")
        else:
            count = sum(1 for m in messages if m.role == "assistant")
        self._counted = (len(messages), count, messages[-1] if messages else None)
        return count

    def _item(self, request: ModelRequest) -> tuple[int, object]:
        turn = self._turn_of(request)
        if turn >= len(self.script):
            if not self.repeat_last or not self.script:
                raise ProviderError(
                    f"script has no answer for turn {turn} ({len(self.script)} items)",
                    provider="scripted",
                )
            return turn, self.script[-1]
        return turn, self.script[turn]

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamPart]:
        """Stream the scripted answer for ``request`` as deltas.

        Yields:
            The answer's reasoning, text and tool-call deltas, its usage, then a
                ``StreamEnd``.

        Raises:
            ProviderError: the script has no answer for this turn (and
                ``repeat_last`` is off or the script is empty).

        A ``Fail`` item's ``error`` and a ``Reply``'s ``cut_off`` are raised as given.
        """
        self.requests.append(request)
        turn, item = self._item(request)
        if isinstance(item, Fail):
            seen = self._failures.get(turn, 0)
            if seen < item.times:
                self._failures[turn] = seen + 1
                raise item.error
            item = item.then if item.then is not None else Reply(text="")
        reply = _as_reply(item, request)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        for piece in _chunks(reply.reasoning, reply.chunk):
            yield ReasoningDelta(piece)
        for piece in _chunks(reply.text, reply.chunk):
            yield TextDelta(piece)
        for index, tc in enumerate(reply.tool_calls):
            if index and reply.between_calls:
                await asyncio.sleep(reply.between_calls)
            call_id = tc.id or f"call_{turn}_{index}"
            pieces = _chunks(tc.arguments, reply.chunk) or [""]
            yield ToolCallDelta(index, call_id, tc.name, pieces[0])
            for piece in pieces[1:]:
                yield ToolCallDelta(index, None, None, piece)
        if reply.cut_off is not None:
            raise reply.cut_off
        yield UsageUpdate(reply.usage)
        default: FinishReason = "tool_calls" if reply.tool_calls else "stop"
        yield StreamEnd(reply.finish_reason or default, model=request.model_name)

    async def aclose(self) -> None:
        """Nothing to close."""
