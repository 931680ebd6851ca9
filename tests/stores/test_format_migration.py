"""A run stored at an older schema version is read through migrations on its stored
documents, and the commit after the load leaves its head reading current records only.

The older version is synthetic: version 0, where a head calls the model ``model_name``
(not ``model``), a turn its index ``number`` (not ``index``) and a message's content
``parts`` (not ``content``). The test writes a run in that shape into each store's own
storage through ``RawRecords``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statekernel import _convert
from statekernel._checksum import seal, seal_line, unseal, unseal_line
from statekernel._codec_base import dump_bytes
from statekernel._codec_dict import dump_entry, load_entry
from statekernel._messages import Message
from statekernel._storage import Checkpoint
from statekernel.errors import CorruptCheckpoint
from statekernel.stores import CheckpointStore, open_store
from statekernel.testing import (
    FileRecords,
    MemoryRecords,
    RawRecords,
    RecordKey,
    RedisRecords,
    SQLiteRecords,
)
from statekernel.testing._store_cases import next_revision, sample_run

KINDS = ["memory", "file", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]
RAW: dict[str, RawRecords] = {
    "memory": MemoryRecords(),
    "file": FileRecords(),
    "sqlite": SQLiteRecords(),
    "redis": RedisRecords(),
}


# -- the synthetic version 0 and its migration -------------------------------------------


def _old_turn(doc: dict[str, Any]) -> dict[str, Any]:
    doc["number"] = doc.pop("index")
    return doc


def _old_head(doc: dict[str, Any]) -> dict[str, Any]:
    doc["schema_version"] = 0
    doc["model_name"] = doc.pop("model")
    if "current_turn" in doc:
        _old_turn(doc["current_turn"])
    return doc


def _old_message(doc: dict[str, Any]) -> dict[str, Any]:
    doc["parts"] = doc.pop("content")
    return doc


def _old_entry(entry: dict[str, Any]) -> dict[str, Any]:
    if "f" in entry:
        _old_head(entry["f"])
    patch = entry.get("p", {})
    if "model" in patch:
        patch["model_name"] = patch.pop("model")
    if "current_turn" in patch:
        _old_turn(patch["current_turn"])
    return entry


def to_current(kind: str, doc: Any) -> Any:
    """The migration from version 0 to 1: renames the fields back."""
    if kind == "head":
        doc["model"] = doc.pop("model_name")
    elif kind == "turn":
        doc["index"] = doc.pop("number")
    elif kind == "message":
        doc["content"] = doc.pop("parts")
    return doc


# -- rewriting raw records -------------------------------------------------------------

Change = Callable[[Any], Any]


def _binary(key: RecordKey, data: bytes) -> bytes:
    kind = key[0]
    if kind == "entry":
        return seal(dump_entry(_old_entry(load_entry(unseal(data, "entry"), "entry"))))
    doc = json.loads(unseal(data, kind))
    change: dict[str, Change] = {"head": _old_head, "turn": _old_turn, "message": _old_message}
    return seal(dump_bytes(change[kind](doc)))


def _line(key: RecordKey, data: bytes) -> bytes:
    kind = key[0]
    doc = json.loads(unseal_line(data, kind))
    if kind == "head":
        _old_head(doc["head"])
    elif kind == "entry":
        entry = _old_entry(load_entry(base64.b64decode(doc[2]), "entry"))
        doc[2] = base64.b64encode(dump_entry(entry)).decode()
    elif kind == "turn":
        _old_turn(doc[2])
    elif kind == "message":
        doc[2] = _old_message(doc[2])
    return seal_line(dump_bytes(doc))


async def make_old(store: CheckpointStore, raw: RawRecords, run_id: str, file: bool) -> None:
    """Rewrite every head, entry, turn and message of the run in the version 0 shape."""
    records = await raw.read(store, run_id)
    for key, data in records.items():
        if key[0] == "blob":
            continue
        await raw.write(store, run_id, key, (_line if file else _binary)(key, data))


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "memory":
        return f"memory://old-{uuid.uuid4().hex}"
    if kind == "file":
        return f"file://{tmp_path}/files"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    base = request.getfixturevalue("redis_url")
    return f"{base}/0?prefix={request.getfixturevalue('redis_prefix')}"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_migrated_run_is_written_back_at_the_current_version(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _url(kind, tmp_path, request)
    raw = RAW[kind]
    keep = open_store(url)  # a memory store's data lives while a store of its name does
    run = sample_run("old")
    one = next_revision(run, messages=(*run.messages, Message.user("more")))
    await keep.commit(Checkpoint.between(None, run))
    await keep.commit(Checkpoint.between(run, one))
    await make_old(keep, raw, "old", kind == "file")

    monkeypatch.setattr(_convert, "_MIGRATIONS", {})
    store = open_store(url)
    with pytest.raises(CorruptCheckpoint, match="unknown schema_version 0"):
        await store.load("old")
    await store.aclose()

    monkeypatch.setattr(_convert, "_MIGRATIONS", {0: to_current})
    store = open_store(url)
    loaded = await store.load("old")
    assert loaded == one
    assert list(loaded.turns) == list(one.turns)
    assert await store.load("old", revision=0) == run
    assert [s.model for s in (await store.list_runs()).runs] == [run.model]
    two = next_revision(loaded, messages=(*loaded.messages, Message.user("after")))
    await store.commit(Checkpoint.between(loaded, two))
    await store.aclose()

    head = (await raw.read(keep, "old"))[("head", 0)]
    doc = json.loads(unseal_line(head, "head"))["head"] if kind == "file" else None
    doc = doc or json.loads(unseal(head, "head"))
    assert doc["schema_version"] == _convert.SCHEMA_VERSION
    assert doc["model"] == run.model

    monkeypatch.setattr(_convert, "_MIGRATIONS", {})  # the head reads current records only
    store = open_store(url)
    loaded = await store.load("old")
    assert loaded == two
    assert list(loaded.turns) == list(two.turns)
    three = next_revision(loaded, state="completed", current_turn=None)
    await store.commit(Checkpoint.between(loaded, three))
    assert await store.load("old") == three
    assert await store.load("old", revision=2) == two
    with pytest.raises(CorruptCheckpoint, match="unknown schema_version 0"):
        await store.load("old", revision=0)  # the revisions before stay as they were stored
    await store.aclose()
    await keep.aclose()
