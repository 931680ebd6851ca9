"""SQLite group commit: one transaction per batch, an outcome per commit."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest

from statekernel.errors import StoreError
from statekernel.stores import Checkpoint, SQLiteStore
from statekernel.stores._sql.rows import CommitRows
from statekernel.stores.sqlite import _store as sqlite_module
from statekernel.stores.sqlite._schema import migrate_schema
from statekernel.stores.sqlite._writer import Pending, write_commits
from statekernel.testing._store_cases import next_revision, sample_run


async def _runs(store: SQLiteStore, count: int) -> list[Any]:
    runs = [sample_run(f"r{i}") for i in range(count)]
    for run in runs:
        await store.commit(Checkpoint.between(None, run))
    return runs


def _rows(revision: int, payload: bytes = b"{}") -> CommitRows:
    columns = (revision, "init", "m/x", 0, "t", "t", 0, payload)
    return CommitRows(columns, revision, b"[]", 0, [], 0, [], [])


def test_a_refused_commit_rolls_back_only_its_own_writes() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate_schema(conn)
    batch = [
        Pending("a", None, _rows(0)),
        Pending("b", None, attrs.evolve(_rows(0), entry=b"x", turns=[b"t"], first_turn=2**64)),
        Pending("c", (99, 0), _rows(1)),  # a head that is not there
        Pending("d", None, _rows(0)),
    ]
    outcomes = write_commits(conn, batch)
    landed = [o for o in outcomes if isinstance(o, tuple) and o[0]]
    assert landed == [outcomes[0], outcomes[3]]
    assert isinstance(outcomes[1], OverflowError)
    assert outcomes[2] == (False, None)
    assert not conn.in_transaction
    stored = conn.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()
    assert stored == [("a",), ("d",)]
    assert conn.execute("SELECT count(*) FROM commits").fetchone() == (2,)


class _FailingCommit:
    """A connection whose ``COMMIT`` fails as a full disk would."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self.conn.executemany(sql, *args)


async def test_a_failed_transaction_fails_every_commit_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")
    runs = await _runs(store, 6)
    failing = True

    def write(conn: sqlite3.Connection, batch: list[Pending]) -> Any:
        return write_commits(_FailingCommit(conn) if failing else conn, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_module, "write_commits", write)
    nexts = [next_revision(run) for run in runs]
    results = await asyncio.gather(
        *(store.commit(Checkpoint.between(r, n)) for r, n in zip(runs, nexts, strict=True)),
        return_exceptions=True,
    )
    assert all(isinstance(r, StoreError) for r in results), results
    assert len({id(r) for r in results}) == len(results), "callers share an exception"
    assert not store._raw or not store._raw.in_transaction, "a transaction was left open"
    for run in runs:
        assert await store.load(run.run_id) == run
    failing = False
    await asyncio.gather(
        *(store.commit(Checkpoint.between(r, n)) for r, n in zip(runs, nexts, strict=True))
    )
    for run in nexts:
        assert await store.load(run.run_id) == run
    await store.aclose()


async def test_commits_ready_together_share_a_transaction(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")
    runs = await _runs(store, 20)
    assert set(store._group.sizes) == {1}, "a lone commit waits for company"
    twin = next_revision(runs[0], context={"twin": True})
    await asyncio.gather(
        *(store.commit(Checkpoint.between(run, next_revision(run))) for run in runs),
        store.commit(Checkpoint.between(runs[0], twin)),
        return_exceptions=True,
    )
    assert store._group.sizes.get(21) == 1, store._group.sizes
    await store.aclose()


async def test_a_commit_cancelled_while_queued_is_not_written(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")
    big_run, small_run = await _runs(store, 2)
    big = next_revision(big_run, context={"blob": "x" * 20_000_000})
    first = asyncio.ensure_future(store.commit(Checkpoint.between(big_run, big)))
    await asyncio.sleep(0.01)  # the big commit is being written
    small = next_revision(small_run)
    queued = asyncio.ensure_future(store.commit(Checkpoint.between(small_run, small)))
    await asyncio.sleep(0)
    assert not first.done(), "the first batch ended too soon for this test"
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    await first
    assert await store.load(small_run.run_id) == small_run
    assert await store.load(big_run.run_id) == big
    await store.commit(Checkpoint.between(small_run, small))
    assert await store.load(small_run.run_id) == small
    await store.aclose()
