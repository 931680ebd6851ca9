"""How a store's records become documents: the storage hooks of the one converter.

``statekernel._records.convert.converter`` unstructures and structures every stored record.
The hooks here change what it does while a store encodes or decodes a run (inside
``storing(...)`` or ``loading(...)``, which set a context variable), so that the
documents of a run hold each thing once:

* a string of at least ``BLOB_MIN`` characters is a *blob* (``{"$b": key}``), kept
  once per run by a hash of its text: a tool's output and the tool message that
  carries it share one;
* a JSON value (context, tool input and output, options, metadata, event data):
  strings as above; an object or array whose text is that long is one blob
  (``{"$v": key}``); an object with a key starting with ``$`` is wrapped as
  ``{"$e": {...}}``, so it is never read back as a marker;
* a request's messages that start like the transcript: ``{"$r": [pos, n], "x": [...]}``
  (positions in the run's append-only message log, then the messages that differ);
* a model result's message that is in the transcript: ``{"$m": pos}``;
* a tool call record whose id, name and arguments are those of its turn's ``k``-th
  tool call: ``"call": k`` in their place; its input when it is its arguments
  parsed: ``{"$a": 1}``;
* a request's tool specs: one blob (they repeat in every request of a run);
* a time in UTC: integer microseconds since the epoch.

Markers appear only where a field of one of those types is, so a user's value is
never mistaken for one. Outside a store's context the hooks give plain data (ISO
times, lists, strings), as ``statekernel._records.convert.unstructure`` documents. While
loading, values are checked strictly: a stored ``"5"`` is not an integer.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from datetime import datetime
from typing import Any, TypeVar

from statekernel._records.encoding import (
    BlobReader,
    BlobWriter,
    canonical,
    dec_time,
    enc_time,
    escape,
    same,
)
from statekernel._records.lazy import LazyTuple
from statekernel._records.messages import Message, ModelResult, ToolCall, ToolSpec
from statekernel._records.run import ToolCallRecord, Turn

__all__ = [
    "NO_BLOBS",
    "TOOLS_BLOB_MIN",
    "Loading",
    "Storing",
    "loading",
    "storing",
]

_V = TypeVar("_V")

TOOLS_BLOB_MIN = 48
"""Tool specs whose JSON text is at least this long are stored as one blob."""

_RESULT_SCAN = 64
"""How far from the end of the transcript a result's message is looked for."""


class Storing:
    """Encoding one commit of a run: the blobs it writes and where its transcript is.

    ``transcript`` starts at position ``m0`` of the run's message log. With
    ``inline``, strings and JSON values stay in the document (commit log events,
    which are read without the run's blobs).
    """

    def __init__(
        self,
        known: frozenset[str] = frozenset(),
        transcript: LazyTuple[Message] | None = None,
        m0: int = 0,
        *,
        inline: bool = False,
    ) -> None:
        self.blobs = BlobWriter(known, inline=inline)
        self.transcript: LazyTuple[Message] = transcript if transcript is not None else LazyTuple()
        self.m0 = m0
        self.sent = -1
        """How many messages the request of the turn being encoded sent."""
        self.calls: dict[str, tuple[int, ToolCall]] = {}
        """The tool calls of the turn being encoded, by id: (position, call)."""


class Loading:
    """Decoding a run: its blobs, and its message log by position."""

    def __init__(
        self,
        blobs: Mapping[str, bytes | str],
        message_at: Callable[[int], Message] | None = None,
        message_range: Callable[[int, int], LazyTuple[Message]] | None = None,
    ) -> None:
        self.blobs = BlobReader(blobs)
        self.message_at = message_at
        self.message_range = message_range
        self.tools: dict[str, tuple[ToolSpec, ...]] = {}
        """Tool specs by blob key: every request of a loaded run shares one tuple."""
        self.calls: tuple[ToolCall, ...] = ()
        """The tool calls of the turn being decoded (its result comes before its records)."""


NO_BLOBS = Loading({})
"""Decoding documents that never refer to blobs (events, a head's pause)."""

_CONTEXT: ContextVar[Storing | Loading | None] = ContextVar("statekernel_codec", default=None)


_C = TypeVar("_C", Storing, Loading)


@contextlib.contextmanager
def _within(ctx: _C) -> Iterator[_C]:
    token = _CONTEXT.set(ctx)
    try:
        yield ctx
    finally:
        _CONTEXT.reset(token)


storing = _within
"""``with storing(Storing(...))``: unstructure records for a store inside the block."""
loading = _within
"""``with loading(Loading(...))``: structure a store's documents inside the block."""


def loading_now() -> Loading | None:
    """The ``Loading`` in effect, if any."""
    ctx = _CONTEXT.get()
    return ctx if type(ctx) is Loading else None


# -- scalars ---------------------------------------------------------------------------


def unstructure_str(value: str) -> Any:
    ctx = _CONTEXT.get()
    return ctx.blobs.s(value) if type(ctx) is Storing else value


def structure_str(value: Any, _: Any) -> str:
    if type(value) is str:
        return value
    ctx = _CONTEXT.get()
    if type(ctx) is Loading:
        return ctx.blobs.s(value)  # a blob marker, else TypeError
    return str(value)


def unstructure_json(value: Any) -> Any:
    ctx = _CONTEXT.get()
    return ctx.blobs.json(value) if type(ctx) is Storing else value


def structure_json(value: Any, _: Any) -> Any:
    ctx = _CONTEXT.get()
    return ctx.blobs.json(value) if type(ctx) is Loading else value


def inline(value: Any) -> Any:
    """A string or JSON value kept in the document (escaped, never a blob)."""
    return escape(value) if type(_CONTEXT.get()) is Storing else value


def unstructure_inline(value: _V, each: Callable[[_V], Any]) -> Any:
    """``each(value)``: a record kept whole in the document, its strings and JSON values
    escaped, never blobs (a head's pause, read by listings without the run's blobs)."""
    if type(_CONTEXT.get()) is not Storing:
        return each(value)
    with storing(Storing(inline=True)):
        return each(value)


def unstructure_time(value: datetime) -> Any:
    return enc_time(value) if type(_CONTEXT.get()) is Storing else value.isoformat()


def structure_time(value: Any, _: Any) -> datetime:
    if type(_CONTEXT.get()) is Loading or type(value) is str:
        return dec_time(value)
    raise TypeError(f"expected an ISO datetime string, got {type(value).__name__}")


def _strict(kind: type) -> Callable[[Any, Any], Any]:
    """Structure ``kind`` (int, bool, float) as cattrs does, but strictly while loading."""

    def structure(value: Any, _: Any) -> Any:
        if type(value) is kind or (kind is float and type(value) is int):
            return value
        if type(_CONTEXT.get()) is Loading:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return kind(value)

    return structure


structure_int = _strict(int)
structure_bool = _strict(bool)
structure_float = _strict(float)


# -- references ------------------------------------------------------------------------

_PARSED = {"$a": 1}


def turn_calls(turn: Turn | None) -> None:
    """Before a turn is encoded or decoded: the tool calls its records may refer to."""
    ctx = _CONTEXT.get()
    if type(ctx) is Storing:
        ctx.sent = len(turn.request.messages) if turn is not None else -1
        ctx.calls = {}
        if turn is not None and turn.result is not None:
            for k, call in enumerate(turn.result.tool_calls):
                ctx.calls.setdefault(call.id, (k, call))
    elif type(ctx) is Loading:
        ctx.calls = ()


def result_calls(result: ModelResult) -> ModelResult:
    """A decoded result: its tool calls are what the turn's records refer to."""
    ctx = _CONTEXT.get()
    if type(ctx) is Loading:
        ctx.calls = result.tool_calls
    return result


def unstructure_record(record: ToolCallRecord, doc: dict[str, Any]) -> dict[str, Any]:
    """A tool call record's document: ``"call": k`` for the id, name and arguments of
    the turn's ``k``-th call, ``{"$a": 1}`` for an input that is the arguments parsed."""
    ctx = _CONTEXT.get()
    if type(ctx) is not Storing:
        return doc
    hit = ctx.calls.get(record.id)
    if hit is not None and hit[1].name == record.name and hit[1].arguments == record.arguments:
        for key in ("id", "name", "arguments"):
            del doc[key]
        doc["call"] = hit[0]
    if "input" in doc and _parses_to(record):
        doc["input"] = _PARSED
    return doc


def structure_record(doc: Any) -> Any:
    """The inverse of ``unstructure_record``: the document with what it refers to put
    back (the strings of the call itself, so the record shares them)."""
    ctx = _CONTEXT.get()
    if type(ctx) is not Loading or type(doc) is not dict:
        return doc
    if "call" in doc:
        k = doc["call"]
        if type(k) is not int or not 0 <= k < len(ctx.calls):
            raise ValueError(f"a tool call record refers to call {k!r} of {len(ctx.calls)}")
        call = ctx.calls[k]
        doc = {key: v for key, v in doc.items() if key != "call"}
        doc.update(id=call.id, name=call.name, arguments=call.arguments)
    if doc.get("input") == _PARSED:
        arguments = doc.get("arguments")
        if type(arguments) is dict:  # a long argument text, stored as a blob
            arguments = structure_str(arguments, str)
        if type(arguments) is not str:
            raise TypeError("a parsed input without its arguments")
        parsed = json.loads(arguments) if arguments.strip() else {}
        doc = {**doc, "input": escape(parsed)}  # as stored: the JSON hook reads it back
    return doc


def _parses_to(record: ToolCallRecord) -> bool:
    text = record.arguments
    try:
        parsed = json.loads(text) if text.strip() else {}
    except ValueError:
        return False
    return same(parsed, record.input)


def unstructure_sent(messages: LazyTuple[Message], each: Callable[[Message], Any]) -> Any:
    """A request's messages: a reference to the transcript's prefix they share, then
    the ones that differ."""
    ctx = _CONTEXT.get()
    if type(ctx) is not Storing:
        return [each(m) for m in messages]
    t = ctx.transcript
    n = len(messages)
    k = t.shares_prefix(messages)
    while k < n and k < len(t) and (messages[k] is t[k] or messages[k] == t[k]):
        k += 1
    if k == 0:
        return [each(m) for m in messages]
    doc: dict[str, Any] = {"$r": [ctx.m0, k]}
    if k < n:
        doc["x"] = [each(m) for m in messages[k:]]
    return doc


def structure_sent(doc: Any, each: Callable[[Any], Message]) -> LazyTuple[Message]:
    """The inverse of ``unstructure_sent``."""
    if type(doc) is list:
        return LazyTuple([each(m) for m in doc])
    ctx = _CONTEXT.get()
    if type(ctx) is not Loading or ctx.message_range is None or type(doc) is not dict:
        raise TypeError("expected a list of messages")
    start, n = doc["$r"]
    if type(start) is not int or type(n) is not int or doc.keys() - {"$r", "x"}:
        raise ValueError(f"bad message reference {doc!r}")
    found = ctx.message_range(start, n)
    extra = doc.get("x")
    return found + tuple([each(m) for m in extra]) if extra else found


def unstructure_answer(message: Message, each: Callable[[Message], Any]) -> Any:
    """A model result's message: its position in the message log when it is in the
    transcript (right after what its request sent, or near the end)."""
    ctx = _CONTEXT.get()
    if type(ctx) is Storing:
        t = ctx.transcript
        if 0 <= ctx.sent < len(t) and t[ctx.sent] is message:
            return {"$m": ctx.m0 + ctx.sent}
        for i in range(len(t) - 1, max(len(t) - _RESULT_SCAN, 0) - 1, -1):
            if t[i] is message:
                return {"$m": ctx.m0 + i}
    return each(message)


def structure_answer(doc: Any, each: Callable[[Any], Message]) -> Message:
    """The inverse of ``unstructure_answer``."""
    if type(doc) is dict and "$m" in doc:
        ctx = _CONTEXT.get()
        pos = doc["$m"]
        if type(ctx) is not Loading or ctx.message_at is None or len(doc) != 1:
            raise ValueError(f"bad message reference {doc!r}")
        if type(pos) is not int or pos < 0:
            raise ValueError(f"bad message position {pos!r}")
        return ctx.message_at(pos)
    return each(doc)


_TOOLS_TEXT: dict[int, tuple[tuple[ToolSpec, ...], str]] = {}


def unstructure_tools(tools: tuple[ToolSpec, ...], each: Callable[[ToolSpec], Any]) -> Any:
    """A request's tool specs: one blob unless tiny. The kernel hands the same tuple to
    every request of every run: its text is made once (an identity cache; specs are
    frozen records)."""
    ctx = _CONTEXT.get()
    if type(ctx) is not Storing or not tools:
        return [each(t) for t in tools]
    hit = _TOOLS_TEXT.get(id(tools))
    if hit is None or hit[0] is not tools:
        with storing(Storing(inline=True)):
            docs = [each(t) for t in tools]
        if len(_TOOLS_TEXT) >= 64:
            _TOOLS_TEXT.clear()
        hit = _TOOLS_TEXT[id(tools)] = (tools, canonical(docs))
    text = hit[1]
    if len(text) < TOOLS_BLOB_MIN:
        return [each(t) for t in tools]
    return {"$v": ctx.blobs.put(text)}


def structure_tools(doc: Any, each: Callable[[Any], tuple[ToolSpec, ...]]) -> tuple[ToolSpec, ...]:
    """The inverse of ``unstructure_tools``; one stored blob gives one shared tuple."""
    ctx = _CONTEXT.get()
    key = doc.get("$v") if type(doc) is dict and len(doc) == 1 else None
    if type(ctx) is not Loading or type(key) is not str:
        return each(doc)
    found = ctx.tools.get(key)
    if found is None:
        found = ctx.tools[key] = each(json.loads(ctx.blobs.text(key)))
    return found
