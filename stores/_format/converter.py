"""The storage converter: records as a store's documents, each thing kept once.

It is the plain converter (``statekernel._records.convert``) built with other hooks
for strings, numbers, JSON values and times, and for a few records, so that the
documents of a run hold each thing once:

* a string of at least ``BLOB_MIN`` characters is a *blob* (``{"$b": key}``), kept
  once per run by a hash of its text: a tool's output and the tool message that
  carries it share one;
* a JSON value (context, tool input and output, options, metadata, event data):
  strings as above; an object or array whose text is that long is one blob
  (``{"$v": key}``); an object with a key starting with ``$`` is wrapped as
  ``{"$e": {...}}``, so it is never read back as a marker (``blobs``);
* a request's messages that start like the transcript: ``{"$r": [pos, n], "x": [...]}``
  (positions in the run's append-only message log, then the messages that differ);
* a model result's message that is in the transcript: ``{"$m": pos}``;
* a tool call record whose id, name and arguments are those of its turn's ``k``-th
  tool call: ``"call": k`` in their place; its input when it is its arguments
  parsed: ``{"$a": 1}``;
* a request's tool specs: one blob (they repeat in every request of a run);
* a head's pause, and events: kept whole, never blobs (listings and event reads do
  without the run's blobs);
* a time in UTC: integer microseconds since the epoch (``documents``).

Markers appear only where a field of one of those types is, so a user's value is
never mistaken for one. While decoding, values are checked strictly: a stored ``"5"``
is not an integer.

What a converter encodes for (``Storing``: the commit's known blobs and transcript)
or decodes from (``Loading``: the run's blobs and message log) is given to it for
each use: ``with writing(storing) as conv`` and ``with reading(loading) as conv``
lend a converter from a small pool with that set, and take it back after the block.
A converter is built once (its hooks generated once, each resolved where it is
built) and serves one use at a time, so threads and nested uses each get their own;
its hooks read what it was given from the converter itself, not from a global or a
context variable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from statekernel._records.convert import configure_converter as configure_records
from statekernel._records.lazy import LazyTuple
from statekernel._records.messages import Message, ModelRequest, ModelResult, ToolCall, ToolSpec
from statekernel._records.run import PauseInfo, Run, ToolCallRecord, Turn
from statekernel.errors import CorruptCheckpoint
from statekernel.stores._format.blobs import BlobReader, BlobWriter, escape
from statekernel.stores._format.documents import canonical, dec_time, enc_time
from statekernel.stores._format.patches import same

__all__ = [
    "INLINE",
    "NO_BLOBS",
    "TOOLS_BLOB_MIN",
    "Loading",
    "StorageConverter",
    "Storing",
    "configure_converter",
    "make_converter",
    "reading",
    "writing",
]

_V = TypeVar("_V")

TOOLS_BLOB_MIN = 48
"""Tool specs whose JSON text is at least this long are stored as one blob."""

_RESULT_SCAN = 64
"""How far from the end of the transcript a result's message is looked for."""

_PARSED = {"$a": 1}


class Storing:
    """Encoding one commit of a run: the blobs it writes and where its transcript is.

    ``transcript`` starts at position ``m0`` of the run's message log. With
    ``inline``, strings and JSON values stay in the document (commit log events and a
    head's pause, which are read without the run's blobs).
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


INLINE = Storing(inline=True)
"""Encoding documents kept whole (events, a head's pause): it never writes a blob."""

NO_BLOBS = Loading({})
"""Decoding documents that never refer to blobs (events, a head's pause)."""


class StorageConverter(cattrs.Converter):
    """The plain converter's shapes with the stored format's hooks (``make_converter``).

    ``storing`` is what it encodes for and ``loading`` what it decodes from; both are
    set for each use by ``writing`` and ``reading``.
    """

    def __init__(self) -> None:
        super().__init__(omit_if_default=True, forbid_extra_keys=True)
        self.storing = INLINE
        self.writer = INLINE.blobs
        """The blob writer of ``storing`` (what the string hooks call)."""
        self.loading = NO_BLOBS
        self.reader = NO_BLOBS.blobs
        """The blob reader of ``loading``."""
        self.calls: tuple[ToolCall, ...] = ()
        """The tool calls of the turn being decoded (its result comes before its records)."""
        self.unstructure_head: Callable[[Run], dict[str, Any]] = _no_head
        """A run without its transcript and completed turns: what a store's head holds
        (its revision, state and times always, so a listing reads them off the head)."""

    def use(self, storing: Storing, loading: Loading) -> None:
        """Encode for ``storing`` and decode from ``loading`` from now on."""
        self.storing, self.writer = storing, storing.blobs
        self.loading, self.reader = loading, loading.blobs
        self.calls = ()

    def load(self, doc: Any, cls: type[_V], what: str) -> _V:
        """``doc`` as a ``cls``; any mismatch raises ``CorruptCheckpoint`` naming ``what``
        (as ``statekernel._records.convert.structure`` does for plain data)."""
        try:
            return self.structure(doc, cls)
        except Exception as exc:
            detail = "; ".join(cattrs.transform_error(exc))
            raise CorruptCheckpoint(f"invalid {what}: {detail or exc}") from exc

    def __enter__(self) -> StorageConverter:
        return self

    def __exit__(self, *exc: object) -> None:
        """Give the converter back (``writing``, ``reading``), keeping no run alive."""
        self.use(INLINE, NO_BLOBS)
        _FREE.append(self)


def _no_head(run: Run) -> dict[str, Any]:
    raise TypeError("the converter is not configured")


def make_converter() -> StorageConverter:
    """A new storage converter, configured."""
    made = StorageConverter()
    configure_converter(made)
    return made


def configure_converter(conv: StorageConverter) -> None:
    """Register the stored format's hooks on ``conv``: scalars first, then the records'
    shapes (``statekernel._records.convert.configure_converter``), then the records
    that refer to what the run keeps elsewhere."""
    _configure_scalars(conv)
    configure_records(conv)
    _configure_requests(conv)
    _configure_turns(conv)


_FREE: list[StorageConverter] = []
"""Converters not lent out (a thread or a nested use takes one more; there are few)."""


def _lend(storing: Storing, loading: Loading) -> StorageConverter:
    try:
        conv = _FREE.pop()
    except IndexError:
        conv = make_converter()
    conv.use(storing, loading)
    return conv


def writing(storing: Storing) -> StorageConverter:
    """``with writing(Storing(...)) as conv``: a converter that encodes for ``storing``,
    given back at the end of the block."""
    return _lend(storing, NO_BLOBS)


def reading(loading: Loading) -> StorageConverter:
    """``with reading(Loading(...)) as conv``: a converter that decodes from ``loading``,
    given back at the end of the block."""
    return _lend(INLINE, loading)


# -- scalars ---------------------------------------------------------------------------


def _configure_scalars(conv: StorageConverter) -> None:
    conv.register_unstructure_hook(str, lambda value: conv.writer.s(value))
    conv.register_structure_hook(
        str, lambda value, _: value if type(value) is str else conv.reader.s(value)
    )
    for kind in (int, bool, float):
        conv.register_structure_hook(kind, _strict(kind))
    conv.register_unstructure_hook_func(_is_any, lambda value: conv.writer.json(value))
    conv.register_structure_hook_func(_is_any, lambda value, _: conv.reader.json(value))
    conv.register_unstructure_hook(datetime, enc_time)
    conv.register_structure_hook(datetime, lambda value, _: dec_time(value))


def _is_any(cls: Any) -> bool:
    return cls is Any


def _strict(kind: type) -> Callable[[Any, Any], Any]:
    """Structure ``kind`` (int, bool, float): only itself (or an int for a float)."""

    def structure(value: Any, _: Any) -> Any:
        if type(value) is kind or (kind is float and type(value) is int):
            return value
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")

    return structure


# -- requests and results: references into the message log ------------------------------


def _configure_requests(conv: StorageConverter) -> None:
    message = conv.get_unstructure_hook(Message)
    message_hook = conv.get_structure_hook(Message)
    spec = conv.get_unstructure_hook(ToolSpec)
    specs_hook = conv.get_structure_hook(tuple[ToolSpec, ...])

    def message_of(doc: Any) -> Message:
        return message_hook(doc, Message)  # type: ignore[no-any-return]

    def specs_of(doc: Any) -> tuple[ToolSpec, ...]:
        return specs_hook(doc, tuple[ToolSpec, ...])  # type: ignore[no-any-return]

    conv.register_unstructure_hook(
        ModelRequest,
        make_dict_unstructure_fn(
            ModelRequest,
            conv,
            _cattrs_omit_if_default=True,
            messages=override(unstruct_hook=lambda v: _sent(conv.storing, v, message)),
            tools=override(unstruct_hook=lambda v: _tools(conv.storing, v, spec)),
        ),
    )
    conv.register_structure_hook(
        ModelRequest,
        make_dict_structure_fn(
            ModelRequest,
            conv,
            _cattrs_forbid_extra_keys=True,
            messages=override(struct_hook=lambda v, _: _sent_of(conv.loading, v, message_of)),
            tools=override(struct_hook=lambda v, _: _tools_of(conv.loading, v, specs_of)),
        ),
    )
    conv.register_unstructure_hook(
        ModelResult,
        make_dict_unstructure_fn(
            ModelResult,
            conv,
            _cattrs_omit_if_default=True,
            message=override(unstruct_hook=lambda v: _answer(conv.storing, v, message)),
        ),
    )
    result_of = make_dict_structure_fn(
        ModelResult,
        conv,
        _cattrs_forbid_extra_keys=True,
        message=override(struct_hook=lambda v, _: _answer_of(conv.loading, v, message_of)),
    )

    def structure_result(doc: Any, cls: Any) -> ModelResult:
        result = result_of(doc, cls)
        conv.calls = result.tool_calls  # what the turn's records refer to
        return result

    conv.register_structure_hook(ModelResult, structure_result)


def _sent(ctx: Storing, messages: LazyTuple[Message], each: Callable[[Message], Any]) -> Any:
    """A request's messages: a reference to the transcript's prefix they share, then
    the ones that differ."""
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


def _sent_of(ctx: Loading, doc: Any, each: Callable[[Any], Message]) -> LazyTuple[Message]:
    """The inverse of ``_sent``."""
    if type(doc) is list:
        return LazyTuple([each(m) for m in doc])
    if ctx.message_range is None or type(doc) is not dict:
        raise TypeError("expected a list of messages")
    start, n = doc["$r"]
    if type(start) is not int or type(n) is not int or doc.keys() - {"$r", "x"}:
        raise ValueError(f"bad message reference {doc!r}")
    found = ctx.message_range(start, n)
    extra = doc.get("x")
    return found + tuple([each(m) for m in extra]) if extra else found


def _answer(ctx: Storing, message: Message, each: Callable[[Message], Any]) -> Any:
    """A model result's message: its position in the message log when it is in the
    transcript (right after what its request sent, or near the end)."""
    t = ctx.transcript
    if 0 <= ctx.sent < len(t) and t[ctx.sent] is message:
        return {"$m": ctx.m0 + ctx.sent}
    for i in range(len(t) - 1, max(len(t) - _RESULT_SCAN, 0) - 1, -1):
        if t[i] is message:
            return {"$m": ctx.m0 + i}
    return each(message)


def _answer_of(ctx: Loading, doc: Any, each: Callable[[Any], Message]) -> Message:
    """The inverse of ``_answer``."""
    if type(doc) is dict and "$m" in doc:
        pos = doc["$m"]
        if ctx.message_at is None or len(doc) != 1:
            raise ValueError(f"bad message reference {doc!r}")
        if type(pos) is not int or pos < 0:
            raise ValueError(f"bad message position {pos!r}")
        return ctx.message_at(pos)
    return each(doc)


_TOOLS_TEXT: dict[int, tuple[tuple[ToolSpec, ...], str]] = {}


def _tools(ctx: Storing, tools: tuple[ToolSpec, ...], each: Callable[[ToolSpec], Any]) -> Any:
    """A request's tool specs: one blob unless tiny. The kernel hands the same tuple to
    every request of every run: its text is made once (an identity cache; specs are
    frozen records)."""
    if ctx.blobs.inline or not tools:
        return [each(t) for t in tools]
    hit = _TOOLS_TEXT.get(id(tools))
    if hit is None or hit[0] is not tools:
        with writing(INLINE) as inline:
            docs = [inline.unstructure(t, ToolSpec) for t in tools]
        if len(_TOOLS_TEXT) >= 64:
            _TOOLS_TEXT.clear()
        hit = _TOOLS_TEXT[id(tools)] = (tools, canonical(docs))
    text = hit[1]
    if len(text) < TOOLS_BLOB_MIN:
        return [each(t) for t in tools]
    return {"$v": ctx.blobs.put(text)}


def _tools_of(
    ctx: Loading, doc: Any, each: Callable[[Any], tuple[ToolSpec, ...]]
) -> tuple[ToolSpec, ...]:
    """The inverse of ``_tools``; one stored blob gives one shared tuple."""
    key = doc.get("$v") if type(doc) is dict and len(doc) == 1 else None
    if type(key) is not str:
        return each(doc)
    found = ctx.tools.get(key)
    if found is None:
        found = ctx.tools[key] = each(json.loads(ctx.blobs.text(key)))
    return found


# -- turns, tool call records, a head ----------------------------------------------------


def _configure_turns(conv: StorageConverter) -> None:
    pause_doc = make_dict_unstructure_fn(PauseInfo, conv, _cattrs_omit_if_default=True)

    def unstructure_pause(pause: PauseInfo) -> Any:
        """Kept whole in the head, its strings and JSON values escaped, never blobs (a
        head's pause is read by listings without the run's blobs)."""
        if conv.writer.inline:
            return pause_doc(pause)
        with writing(INLINE) as inline:
            return inline.unstructure(pause, PauseInfo)

    conv.register_unstructure_hook(PauseInfo, unstructure_pause)
    record_doc = make_dict_unstructure_fn(ToolCallRecord, conv, _cattrs_omit_if_default=True)
    record_of = make_dict_structure_fn(ToolCallRecord, conv, _cattrs_forbid_extra_keys=True)
    conv.register_unstructure_hook(
        ToolCallRecord, lambda record: _record(conv.storing, record, record_doc(record))
    )
    conv.register_structure_hook(
        ToolCallRecord, lambda doc, cls: record_of(_record_of(conv, doc), cls)
    )
    turn_doc = make_dict_unstructure_fn(Turn, conv, _cattrs_omit_if_default=True)
    turn_of = make_dict_structure_fn(Turn, conv, _cattrs_forbid_extra_keys=True)

    def unstructure_turn(turn: Turn) -> dict[str, Any]:
        _turn_calls(conv.storing, turn)
        return turn_doc(turn)

    def structure_turn(doc: Any, cls: Any) -> Turn:
        conv.calls = ()
        return turn_of(doc, cls)

    conv.register_unstructure_hook(Turn, unstructure_turn)
    conv.register_structure_hook(Turn, structure_turn)
    conv.unstructure_head = make_dict_unstructure_fn(
        Run,
        conv,
        _cattrs_omit_if_default=True,
        schema_version=override(omit_if_default=False),
        revision=override(omit_if_default=False),
        state=override(omit_if_default=False),
        created_at=override(omit_if_default=False),
        updated_at=override(omit_if_default=False),
        messages=override(omit=True),
        turns=override(omit=True),
        tags=override(unstruct_hook=dict),  # kept whole: listings read them off the head
    )


def _turn_calls(ctx: Storing, turn: Turn) -> None:
    """Before a turn is encoded: the tool calls its records may refer to."""
    ctx.sent = len(turn.request.messages)
    ctx.calls = {}
    if turn.result is not None:
        for k, call in enumerate(turn.result.tool_calls):
            ctx.calls.setdefault(call.id, (k, call))


def _record(ctx: Storing, record: ToolCallRecord, doc: dict[str, Any]) -> dict[str, Any]:
    """A tool call record's document: ``"call": k`` for the id, name and arguments of
    the turn's ``k``-th call, ``{"$a": 1}`` for an input that is the arguments parsed."""
    hit = ctx.calls.get(record.id)
    if hit is not None and hit[1].name == record.name and hit[1].arguments == record.arguments:
        for key in ("id", "name", "arguments"):
            del doc[key]
        doc["call"] = hit[0]
    if "input" in doc and _parses_to(record):
        doc["input"] = _PARSED
    return doc


def _record_of(conv: StorageConverter, doc: Any) -> Any:
    """The inverse of ``_record``: the document with what it refers to put back (the
    strings of the call itself, so the record shares them)."""
    if type(doc) is not dict:
        return doc
    if "call" in doc:
        k, calls = doc["call"], conv.calls
        if type(k) is not int or not 0 <= k < len(calls):
            raise ValueError(f"a tool call record refers to call {k!r} of {len(calls)}")
        call = calls[k]
        doc = {key: v for key, v in doc.items() if key != "call"}
        doc.update(id=call.id, name=call.name, arguments=call.arguments)
    if doc.get("input") == _PARSED:
        arguments = doc.get("arguments")
        if type(arguments) is dict:  # a long argument text, stored as a blob
            arguments = conv.reader.s(arguments)
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
