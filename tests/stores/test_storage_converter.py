"""The storage converter: built from the plain one, lent for each use, never global."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import attrs

from statekernel._records import convert
from statekernel._records.messages import Message
from statekernel._records.run import Run
from statekernel._storage.protocol import Checkpoint
from statekernel.stores._format.codec import decode_run, encode_commit
from statekernel.stores._format.converter import (
    INLINE,
    NO_BLOBS,
    Loading,
    Storing,
    reading,
    writing,
)
from statekernel.testing._store_cases import sample_run

ROOT = Path(__file__).resolve().parents[2]
LONG = "x" * 300
AT = datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC)


def test_plain_data_stays_plain_while_a_store_encodes() -> None:
    message = Message.user(LONG)
    with writing(Storing()) as conv:
        stored = conv.unstructure(message, Message)
        plain = convert.unstructure(message)
        plain_time = convert.converter.unstructure(AT, datetime)
        stored_time = conv.unstructure(AT, datetime)
    assert '"$b"' in json.dumps(stored)
    assert LONG not in json.dumps(stored)
    assert LONG in json.dumps(plain)
    assert "$b" not in json.dumps(plain)
    assert plain_time == AT.isoformat()
    assert type(stored_time) is int


def test_the_plain_converter_reads_no_markers() -> None:
    with reading(NO_BLOBS):
        assert convert.structure("5", int) == 5  # plain data: converted
        assert convert.structure({"$b": "k"}, str) == "{'$b': 'k'}"


def test_each_use_has_its_own_converter_and_gives_it_back() -> None:
    outer_ctx, inner_ctx = Storing(), Storing()
    with writing(outer_ctx) as outer:
        with writing(inner_ctx) as inner:
            assert inner is not outer
            assert inner.storing is inner_ctx
            assert outer.storing is outer_ctx
        loading = Loading({})
        with reading(loading) as reader:
            assert reader is not outer
            assert reader.loading is loading
    assert outer.storing is INLINE, "a converter given back keeps no commit alive"
    assert reader.loading is NO_BLOBS


def test_threads_encoding_at_once_write_what_one_thread_writes() -> None:
    runs = [
        attrs.evolve(sample_run(f"run-{i}", turns=3), context={"note": LONG + str(i)})
        for i in range(4)
    ]
    alone = [_encoded(run) for run in runs]
    found: dict[int, list[tuple[object, ...]]] = {}
    start = threading.Barrier(len(runs))

    def encode(i: int) -> None:
        start.wait()
        found[i] = [_encoded(runs[i]) for _ in range(30)]

    threads = [threading.Thread(target=encode, args=(i,)) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, expected in enumerate(alone):
        assert all(got == expected for got in found[i])


def _encoded(run: Run) -> tuple[object, ...]:
    enc = encode_commit(Checkpoint.between(None, run), None)
    back = decode_run(enc.head, enc.messages, enc.turns, enc.blobs)
    assert back == run
    return (enc.head, enc.entry, enc.messages, enc.turns, enc.blobs)


def test_the_stored_format_keeps_no_context_variable() -> None:
    folders = [ROOT / "statekernel" / "_records", ROOT / "stores" / "_format"]
    found = [
        str(path.relative_to(ROOT))
        for folder in folders
        for path in sorted(folder.glob("*.py"))
        if "ContextVar" in path.read_text()
    ]
    assert found == []
