"""A store a newer release wrote, read by an older one (a roll back): what the older
release cannot read is refused with a typed error that names the version it found and
the versions it reads, never read wrongly and never left out of a listing unnamed
(docs/operations/compatibility.md)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from statekernel._records import convert
from statekernel.errors import CorruptCheckpoint, StoreError
from statekernel.stores import Checkpoint, CheckpointStore, SQLiteStore, open_store
from statekernel.stores._format.checksum import seal_line, unseal_line
from statekernel.stores._format.dicts import dump_entry, load_entry
from statekernel.stores._format.documents import dump_bytes
from statekernel.stores.file._log import LAYOUT_VERSION
from statekernel.stores.sqlite._schema import STORE_VERSION
from statekernel.testing._store_cases import next_revision, sample_run

RUNS = ("a", "b", "c")


async def _written(url: str) -> None:
    store = open_store(url)
    await _commit(store)
    await store.aclose()


async def _commit(store: CheckpointStore) -> None:
    for run_id in RUNS:
        await store.commit(Checkpoint.between(None, sample_run(run_id)))


async def test_runs_a_newer_release_wrote_are_refused_naming_both_versions(
    every_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(every_store_url)
    await _commit(store)
    if every_store_url != "memory://":  # read through a store opened anew (a memory
        await store.aclose()  # store keeps encoded documents too: it is read as it is)
        store = open_store(every_store_url)
    newer = convert.SCHEMA_VERSION
    older = newer - 1
    monkeypatch.setattr(convert, "SCHEMA_VERSION", older)  # this process is now the older
    both = f"schema_version {newer}, newer than {older} .*upgrade"
    try:
        with pytest.raises(CorruptCheckpoint, match=both):
            await store.load("a")
        page = await store.list_runs()
        assert page.runs == ()
        assert sorted(d.run_id for d in page.damaged) == list(RUNS), "a run left out unnamed"
        for damaged in page.damaged:
            assert re.search(both, damaged.problem), damaged.problem
        run = sample_run("a")
        with pytest.raises(CorruptCheckpoint, match=both):  # never written over
            await store.commit(Checkpoint.between(run, next_revision(run)))
        monkeypatch.setattr(convert, "SCHEMA_VERSION", newer)  # the newer release again
        assert await store.load("a") == run
    finally:
        await store.aclose()


async def test_a_file_store_run_of_a_newer_layout_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path}/runs"
    await _written(url)
    hint = tmp_path / "runs" / "b" / "head.json"
    doc = json.loads(unseal_line(hint.read_bytes(), "hint"))
    doc["v"] = LAYOUT_VERSION + 1
    hint.write_bytes(seal_line(dump_bytes(doc)))
    both = (
        rf"unknown file store layout {LAYOUT_VERSION + 1} \(this release reads layouts 3"
        rf" to {LAYOUT_VERSION}: .*upgrade"
    )
    store = open_store(url)
    assert (await store.load("a")).run_id == "a"
    with pytest.raises(StoreError, match=both):
        await store.load("b")
    with pytest.raises(StoreError, match=both):  # the listing fails rather than hide it
        await store.list_runs()
    await store.aclose()


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_sqlite_store_of_a_newer_layout_is_refused_naming_both(
    tmp_path: Path, read_only: bool
) -> None:
    path = tmp_path / "runs.db"
    await _written(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE statekernel_schema SET version = ?", (STORE_VERSION + 1,))
    conn.close()
    store = SQLiteStore(f"sqlite:///{path}", read_only=read_only)
    both = f"layout version {STORE_VERSION + 1}.* newer than this release \\({STORE_VERSION}\\)"
    with pytest.raises(StoreError, match=both):
        await store.list_runs()
    await store.aclose()
    with sqlite3.connect(path) as conn:  # refused before anything was written
        assert conn.execute("SELECT version FROM statekernel_schema").fetchall() == [
            (STORE_VERSION + 1,)
        ]
    conn.close()


def test_a_commit_log_entry_of_a_newer_format_is_refused_naming_both() -> None:
    stored = dump_entry({"r": 0, "f": {}})
    assert load_entry(stored, "entry") == {"r": 0, "f": {}}
    newer = b"\x00\x02" + stored[2:]  # a later preset dictionary's marker
    with pytest.raises(CorruptCheckpoint, match=r"entry format 2, newer than 1 .*upgrade"):
        load_entry(newer, "entry")
    with pytest.raises(CorruptCheckpoint, match="not a stored commit log entry"):
        load_entry(b"\x01\x01" + stored[2:], "entry")
