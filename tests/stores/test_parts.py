"""SQLite layout 7 and PostgreSQL layout 8: a commit's messages, completed turns and
blobs in one ``parts`` row; a store of an older layout read as it is, and upgraded
keeping its rows."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import asyncpg
import attrs
import pytest

from statekernel._records.run import Run
from statekernel.errors import CorruptCheckpoint
from statekernel.stores import Checkpoint, PostgresStore, SQLiteStore
from statekernel.stores._sql.bundles import bundle, gather, unbundle
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.stores.sqlite._schema import STORE_VERSION
from statekernel.testing._raw import SQLiteRecords
from statekernel.testing._store_cases import sample_run

from .layouts import as_sqlite_layout, unbundle_postgres

_NOTE = "a note long enough to be stored as a blob of its own; " * 8


def _at(turns: int) -> Run:
    """The run "r" after ``turns`` completed turns (revision ``turns``), with a blob."""
    run = sample_run("r", turns=turns)
    later = run.updated_at + timedelta(seconds=turns)
    return attrs.evolve(
        run, revision=turns, updated_at=later, context={"notes": _NOTE, "turns": turns}
    )


async def _grow(store: SQLiteStore | PostgresStore, first: int, last: int) -> list[Run]:
    """Commit the revisions ``first`` to ``last`` of "r" (a new run when ``first`` is 0)."""
    chain = []
    for n in range(first, last + 1):
        before = None if n == 0 else _at(n - 1)
        await store.commit(Checkpoint.between(before, _at(n)))
        chain.append(_at(n))
    return chain


def _count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as conn:
        (n,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    conn.close()
    return int(n)


async def test_each_commit_writes_its_parts_in_one_row(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        chain = await _grow(store, 0, 4)
        assert await store.load("r") == chain[-1]
        for n, run in enumerate(chain):
            assert await store.load("r", revision=n) == run
        assert [r for r, _ in [x async for x in store.history("r")]] == chain
    finally:
        await store.aclose()
    assert _count(path, "parts") == 5  # one a commit
    for table in ("messages", "turns", "blobs"):
        assert _count(path, table) == 0, f"a record was written to {table}"


async def test_an_older_store_is_read_as_it_is_then_upgraded_keeping_its_rows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    older = await _grow(store, 0, 2)
    await store.aclose()
    as_sqlite_layout(path, 6)
    kept = {t: _count(path, t) for t in ("messages", "turns", "blobs")}
    assert all(kept.values()), kept
    reader = SQLiteStore(f"sqlite:///{path}", read_only=True)
    try:
        assert await reader.load("r") == older[-1]
        assert await reader.load("r", revision=1) == older[1]
    finally:
        await reader.aclose()
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        newer = await _grow(store, 3, 5)
        assert await store.load("r") == newer[-1]
        for n, run in enumerate([*older, *newer]):
            assert await store.load("r", revision=n) == run, f"revision {n}"
        history = [r async for r, _ in store.history("r")]
        assert history == [*older, *newer]
    finally:
        await store.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM statekernel_schema").fetchall() == [
            (STORE_VERSION,)
        ]
    conn.close()
    assert {t: _count(path, t) for t in kept} == kept, "the older rows were changed"
    assert _count(path, "parts") == 3
    fresh = SQLiteStore(f"sqlite:///{path}", read_only=True)  # reads both
    try:
        assert await fresh.load("r") == newer[-1]
    finally:
        await fresh.aclose()


async def test_a_lost_part_row_is_named(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        await _grow(store, 0, 3)
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM parts WHERE revision = 2")
        conn.close()
        store.forget("r")
        with pytest.raises(CorruptCheckpoint, match=r"parts of revision 3 of run 'r'"):
            await store.load("r")
    finally:
        await store.aclose()


async def test_a_damaged_record_inside_a_part_row_is_named_by_its_position(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        await _grow(store, 0, 2)
        raw = SQLiteRecords()
        records = await raw.read(store, "r")
        message = records[("message", 3)]
        await raw.write(store, "r", ("message", 3), message[:-1] + bytes([message[-1] ^ 1]))
        with pytest.raises(CorruptCheckpoint, match=r"message 3 of run 'r'"):
            await store.load("r")
    finally:
        await store.aclose()


def test_a_bundle_holds_its_records_as_they_are() -> None:
    messages, turns = [b"m0", b"", b"m2" * 300], [b"t0"]
    blobs = [("k1", b"\x00z data"), ("k2", b"")]
    assert unbundle(bundle(messages, turns, blobs), "parts") == (messages, turns, blobs)
    assert unbundle(bundle([], [], []), "parts") == ([], [], [])
    rows = [
        (1, 0, 0, bundle([b"a"], [], [("k", b"1")])),
        (2, 1, 0, bundle([b"b"], [b"t"], [("k", b"2")])),
    ]
    assert gather(rows, "run") == ([b"a", b"b"], [b"t"], {"k": b"1"})
    assert gather(rows[1:], "run", messages=1) == ([b"b"], [b"t"], {"k": b"2"})


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:-1],  # cut short
        lambda d: d + b"x",  # longer than its sizes
        lambda d: b"\x02" + d[1:],  # another format version
        lambda d: d[:1] + b"\xff\xff\xff\xff" + d[5:],  # a count past its length
        lambda d: d[:3],  # shorter than its header
        lambda d: "text",  # stored as text
    ],
)
def test_a_damaged_bundle_is_corrupt_checkpoint(damage: object) -> None:
    doc = bundle([b"m0", b"m1"], [b"t0"], [("key", b"data")])
    with pytest.raises(CorruptCheckpoint, match="parts of revision 4"):
        unbundle(damage(doc), "parts of revision 4")  # type: ignore[operator]


def test_part_rows_out_of_place_are_corrupt_checkpoint() -> None:
    rows = [(1, 0, 0, bundle([b"a"], [], [])), (3, 2, 0, bundle([b"c"], [], []))]
    with pytest.raises(CorruptCheckpoint, match=r"revision 3 of run 'x'.*after 1 messages"):
        gather(rows, "run 'x'")


@pytest.mark.parametrize("bundled", [False, True])
async def test_an_older_row_lost_is_never_filled_by_the_next(tmp_path: Path, bundled: bool) -> None:
    """A message row of an older layout lost in the middle: the ones after it are not
    read at its position, whether parts follow them or not."""
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await _grow(store, 0, 2)
    await store.aclose()
    as_sqlite_layout(path, 6)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM messages WHERE pos = 7")
    conn.close()
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        if bundled:
            await _grow(store, 3, 3)
        with pytest.raises(CorruptCheckpoint, match="message"):
            await store.load("r")
    finally:
        await store.aclose()


async def _pg_counts(url: str) -> dict[str, int]:
    target = parse_postgres_url(url)
    conn = await asyncpg.connect(target.dsn)
    try:
        return {
            t: int(await conn.fetchval(f'SELECT count(*) FROM "{target.schema}".{t}'))
            for t in ("messages", "turns", "blobs", "parts")
        }
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_postgres_an_older_store_is_read_as_it_is_then_upgraded_keeping_its_rows(
    postgres_store_url: str,
) -> None:
    store = PostgresStore(postgres_store_url)
    try:
        older = await _grow(store, 0, 2)
    finally:
        await store.aclose()
    assert await _pg_counts(postgres_store_url) == {
        "messages": 0,
        "turns": 0,
        "blobs": 0,
        "parts": 3,
    }
    target = parse_postgres_url(postgres_store_url)
    conn = await asyncpg.connect(target.dsn)
    try:
        await unbundle_postgres(conn, target.schema)
        await conn.execute(f'UPDATE "{target.schema}".statekernel_schema SET version = 7')
    finally:
        await conn.close()
    reader = PostgresStore(postgres_store_url, read_only=True)
    try:
        assert await reader.load("r") == older[-1]
        assert await reader.load("r", revision=1) == older[1]
    finally:
        await reader.aclose()
    store = PostgresStore(postgres_store_url)
    try:
        newer = await _grow(store, 3, 5)
        store.forget("r")
        assert await store.load("r") == newer[-1]
        for n, run in enumerate([*older, *newer]):
            assert await store.load("r", revision=n) == run, f"revision {n}"
        assert [r async for r, _ in store.history("r")] == [*older, *newer]
    finally:
        await store.aclose()
    counts = await _pg_counts(postgres_store_url)
    assert counts["parts"] == 3, counts
    assert all(counts.values()), counts
