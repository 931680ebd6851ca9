"""The stored encoding: every record field is encoded, old schema versions are migrated."""

from __future__ import annotations

import json
import sqlite3
import types
import typing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import attrs
import pytest

from statekernel._records import convert
from statekernel._records.events import Event
from statekernel._records.fallback import Fallback
from statekernel._records.lazy import LazyTuple
from statekernel._records.messages import (
    ModelRequest,
    ToolSpec,
)
from statekernel._records.run import Run, ToolCallRecord, Turn
from statekernel.errors import CorruptCheckpoint, StoreError
from statekernel.stores import Checkpoint, open_store
from statekernel.stores._format.blobs import blob_bytes, blob_text
from statekernel.stores._format.codec import decode_run, encode_commit
from statekernel.stores._format.dicts import dump_entry, load_entry
from statekernel.stores._format.events import decode_events, encode_events
from statekernel.stores.sqlite._schema import SCHEMA
from statekernel.testing._store_cases import next_revision, sample_run

# -- a record with every field set to something that is not its default ----------------

_AT = datetime(2031, 2, 3, 4, 5, 6, 789, tzinfo=UTC)


def full(cls: type, tag: str = "x") -> Any:
    """An instance of ``cls`` with every field different from its default."""
    if cls is Fallback:  # models are provider/name strings, given positionally
        return Fallback("a/one", f"b/{tag}", on=("refused", "unavailable"))
    attrs.resolve_types(cls)
    values = {f.name: _value(f.type, f"{tag}.{f.name}", f.default) for f in attrs.fields(cls)}
    if cls is Run:
        values["schema_version"] = convert.SCHEMA_VERSION
    return cls(**values)


def _value(kind: Any, tag: str, default: Any) -> Any:
    origin, args = get_origin(kind), get_args(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _value(options[len(tag) % len(options)], tag, None)
    if origin is Literal:
        return next(a for a in args if a != default)
    if origin in (tuple, LazyTuple):
        item = args[0]
        if get_origin(item) in (typing.Union, types.UnionType):  # one of each kind
            return tuple(_value(a, f"{tag}[{i}]", None) for i, a in enumerate(get_args(item)))
        return (_value(item, tag + "[0]", None), _value(item, tag + "[1]", None))
    if origin is dict:  # str keys; a union of values: one of each kind
        kinds = get_args(args[1]) if get_origin(args[1]) in (typing.Union, types.UnionType) else ()
        values = [_value(a, f"{tag}[{i}]", None) for i, a in enumerate(kinds or (args[1],))]
        return {f"{tag} key {i}": v for i, v in enumerate(values)}
    if attrs.has(kind):
        return full(kind, tag)
    return _scalar(kind, tag, default)


def _scalar(kind: Any, tag: str, default: Any) -> Any:
    if kind is str:
        return f"{tag} " + "long text " * (40 if len(tag) % 2 else 1)
    if kind is bool:
        return default is not True
    if kind is int:
        return 7 + len(tag)
    if kind is float:
        return 0.25
    if kind is datetime:
        return _AT.astimezone(timezone(timedelta(hours=2))) if len(tag) % 2 else _AT
    if kind is Any:  # JSON values
        return {"tag": tag, "$b": [1, 2.5, None, True], "n": {"$v": "x" * 300}}
    raise AssertionError(f"no value for a field of type {kind!r} ({tag}): extend this test")


def test_every_field_set_round_trips_through_the_encoding() -> None:
    run = full(Run)
    for record in (run, *run.turns, run.current_turn):
        for f in attrs.fields(type(record)):
            if f.name != "schema_version":
                assert getattr(record, f.name) != f.default, f"{f.name} has its default"
    cp = Checkpoint.between(None, run)
    enc = encode_commit(cp, None)
    messages = [json.loads(m) for m in enc.messages]
    turns = [json.loads(t) for t in enc.turns]
    assert decode_run(enc.head, messages, turns, enc.blobs) == run


def test_event_with_every_field_set_round_trips() -> None:
    events = [full(Event), attrs.evolve(full(Event), type="turn_started", data={"index": 3})]
    docs = encode_events(events, "other run", 99, 1000, 123)
    entry = {"p": {"updated_at": 123}, "q": 1000, "E": json.loads(json.dumps(docs))}
    assert decode_events([(99, entry)], "other run") == events


# -- schema_version: older versions migrate, unknown ones are refused --------------------


KINDS = ["file", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "file":
        return f"file://{tmp_path}/files"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    return str(request.getfixturevalue("redis_store_url"))


@pytest.mark.parametrize("kind", KINDS)
async def test_older_schema_version_goes_through_the_migrations(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _url(kind, tmp_path, request)
    store = open_store(url)
    run = sample_run("old")
    one = next_revision(run)
    await store.commit(Checkpoint.between(None, run))
    await store.commit(Checkpoint.between(run, one))
    await store.aclose()

    def to_next(kind: str, doc: Any) -> Any:
        if kind == "head":
            doc["context"] = {"migrated": doc["context"]}
        return doc

    current = convert.SCHEMA_VERSION
    monkeypatch.setattr(convert, "SCHEMA_VERSION", current + 1)
    monkeypatch.setattr(convert, "_MIGRATIONS", {current: to_next})
    store = open_store(url)
    for revision, expected in ((None, one), (0, run)):
        got = await store.load("old", revision=revision)
        assert got.schema_version == current + 1
        assert got == attrs.evolve(
            expected, context={"migrated": expected.context}, schema_version=current + 1
        )
    await store.aclose()

    monkeypatch.setattr(convert, "_MIGRATIONS", {})
    store = open_store(url)
    refused = f"no migration from schema_version {current}"
    with pytest.raises(CorruptCheckpoint, match=refused) as info:
        await store.load("old")
    assert _where(url) in str(info.value)
    await store.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_newer_schema_version_is_refused_naming_the_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _url(kind, tmp_path, request)
    store = open_store(url)
    await store.commit(Checkpoint.between(None, sample_run("new")))
    await store.aclose()
    current = convert.SCHEMA_VERSION
    monkeypatch.setattr(convert, "SCHEMA_VERSION", current - 1)
    store = open_store(url)
    with pytest.raises(CorruptCheckpoint, match=f"unknown schema_version {current}") as info:
        await store.load("new")
    assert _where(url) in str(info.value)
    await store.aclose()


def _where(url: str) -> str:
    """The part of a store URL that an error about it names (the path for files)."""
    if url.startswith("file://"):
        return url.removeprefix("file://")
    return url


async def test_sqlite_unreleased_layouts_are_refused_not_misread(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE statekernel_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO statekernel_schema VALUES (3)")
        conn.executescript(SCHEMA)
    store = open_store(f"sqlite:///{path}")
    with pytest.raises(StoreError, match="layout version 3 was written by an unreleased"):
        await store.load("r")
    await store.aclose()


# -- stored forms ----------------------------------------------------------------------


def test_entries_and_blobs_are_read_in_every_form_they_are_written() -> None:
    turn_started = {"type": "turn_started", "data": {"index": 2}}
    entry = {"p": {"updated_at": 1_000_000}, "q": 3, "E": [turn_started, {"type": "custom"}]}
    events = decode_events([(4, entry)], "r")
    assert [(e.type, e.seq, e.revision, e.data) for e in events] == [
        ("turn_started", 3, 4, {"index": 2}),
        ("custom", 4, 4, {}),
    ]
    assert events[0].at == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    new_entry = {"p": {"updated_at": 5}, "q": 3, "E": [turn_started]}
    assert load_entry(dump_entry(new_entry), "entry") == new_entry
    assert dump_entry(new_entry)[:2] == b"\x00\x01"
    text = "héllo " * 200
    assert blob_text(text.encode()) == text  # plain UTF-8
    assert blob_text(b"\x00" + json.dumps("\x00nul first").encode()) == "\x00nul first"
    assert blob_bytes(text)[:2] == b"\x00z"
    assert blob_text(blob_bytes(text)) == text
    assert blob_bytes("\x00z looks zipped") == b'\x00"\\u0000z looks zipped"'


def test_damaged_compressed_parts_are_corrupt_checkpoints() -> None:
    with pytest.raises(CorruptCheckpoint):
        load_entry(b"\x00\x01not deflate at all", "entry")
    packed = dump_entry({"p": {"updated_at": 1}})
    with pytest.raises(CorruptCheckpoint):
        load_entry(packed[:-3], "entry")


def test_tool_specs_are_encoded_from_the_tuple_they_are() -> None:
    from statekernel._records.messages import ToolSpec
    from statekernel.stores._format.converter import Loading, Storing, reading, writing

    def round_trip(tools: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
        ctx = Storing()
        with writing(ctx) as conv:
            doc = conv.unstructure(ModelRequest("p/m", (), tools), ModelRequest)
        stored = json.loads(json.dumps(doc))
        with reading(Loading(ctx.blobs.blobs)) as conv:
            first = conv.structure(stored, ModelRequest).tools
            again = conv.structure(stored, ModelRequest).tools
        if len(json.dumps(doc["tools"])) > 50:  # a blob: read once, shared
            assert again is first, "requests loaded together share their tool specs"
        return first

    first = (ToolSpec("search", "Search the web " * 5, {"type": "object", "properties": {}}),)
    assert round_trip(first) == first
    assert round_trip(first) == first  # served from the cache
    changed = (ToolSpec("search", "Search the web " * 5, {"type": "object", "required": ["q"]}),)
    assert round_trip(changed) == changed
    tiny = (ToolSpec("x", "", {}),)
    assert round_trip(tiny) == tiny


def test_an_input_stored_as_its_parsed_arguments_keeps_keys_that_look_like_markers() -> None:
    from statekernel._records.messages import Message, ModelResult, ToolCall

    arguments = '{"$b": [null], "$e": {}, "$r": {"$v": 1}, "x": "' + "y" * 300 + '"}'
    call = ToolCall("c1", "echo", arguments)
    record = ToolCallRecord("c1", "echo", arguments, input=json.loads(arguments), output="ok")
    answer = ModelResult(Message("assistant", (call,)))
    turn = Turn(0, ModelRequest("p/m"), answer, completed=(record,))
    run = attrs.evolve(sample_run("marks"), turns=(turn,), current_turn=turn)
    enc = encode_commit(Checkpoint.between(None, run), None)
    assert b'"$a"' in enc.turns[0], "the input is stored as its arguments"
    decoded = decode_run(enc.head, [json.loads(m) for m in enc.messages], enc.turns, enc.blobs)
    assert decoded.turns[0].completed[0].input == json.loads(arguments)
    assert decoded.current_turn is not None
    assert decoded.current_turn.completed[0] == record


@pytest.mark.parametrize("number", [2**64, -(2**64), -(2**63) - 1, 10**30, 2**63])
def test_integers_beyond_64_bits_read_back_exactly(number: int) -> None:
    from statekernel.stores._format.documents import load_json

    doc = {"n": number, "list": [number, 1.5, "12345678901234567890"]}
    for stored in (json.dumps(doc).encode(), json.dumps(doc)):
        loaded = load_json(stored, "a document")
        assert loaded == doc
        assert type(loaded["n"]) is int


@pytest.mark.parametrize(
    "doc",
    [
        {"a": [1, 2.5, True, None, "x"], "b": {"c": "é\n\u2028"}},
        {"nan": float("nan"), "inf": [float("inf"), float("-inf")]},
        {"surrogate": "\ud800 alone"},
        {"key": "a text that says null"},
        {1: "an int key"},
    ],
)
def test_dumped_documents_read_back_as_the_same_values(doc: dict[Any, Any]) -> None:
    """Whichever encoder writes a document (orjson or json), it reads back as the same
    values: a non-finite float stays one (never ``null``), lone surrogates are kept,
    an int key becomes its text as ``json`` writes it."""
    from statekernel.stores._format.documents import dump_bytes, load_json

    expected = json.loads(json.dumps(doc))
    found = load_json(dump_bytes(doc), "a document")
    assert json.dumps(found, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert repr(found) == repr(expected)


def test_integers_beyond_64_bits_are_written_as_json_writes_them() -> None:
    """orjson refuses them: the document is written by ``json``, digit for digit."""
    from statekernel.stores._format.documents import dump_bytes

    doc = {"big": 2**70, "neg": -(2**64)}
    assert dump_bytes(doc) == json.dumps(doc, separators=(",", ":")).encode()
