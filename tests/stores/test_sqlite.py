"""SQLite store: a cancelled commit has settled when the cancellation reaches the caller;
a write held up by another writer says so."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import attrs
import pytest

from statekernel.errors import StoreError
from statekernel.stores import Checkpoint, SQLiteStore
from statekernel.stores.sqlite._file import FIRST_WAIT_MS
from statekernel.testing._store_cases import next_revision, sample_run


async def test_cancelled_commit_lands_whole_or_not_before_the_cancellation(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")
    other = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")  # another process, in effect
    assert store.settles_on_cancel
    run = sample_run("big")
    await store.commit(Checkpoint.between(None, run))
    for delay in (0, 0.001, 0.003, 0.01):
        big = attrs.evolve(next_revision(run), context={"blob": "x" * 5_000_000 + str(delay)})
        task = asyncio.ensure_future(store.commit(Checkpoint.between(run, big)))
        await asyncio.sleep(delay)
        task.cancel()
        landed = True
        try:
            await task
        except asyncio.CancelledError:
            landed = False
        at_cancel = await other.load("big")
        await asyncio.sleep(0.05)  # an orphaned write would land now
        assert await other.load("big") == at_cancel
        assert at_cancel in (run, big), "a cancelled commit landed in part"
        if landed:
            assert at_cancel == big
        run = at_cancel
    await store.aclose()
    await other.aclose()


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_synchronous_option(tmp_path: Path, sync: str) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db?synchronous={sync}")
    run = sample_run("r")
    await store.commit(Checkpoint.between(None, run))
    assert await store.load("r") == run
    await store.aclose()


async def test_a_write_waiting_for_the_lock_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit held up by another connection's write lock logs one warning naming the
    store after ``FIRST_WAIT_MS``, then lands once the lock is released; a commit that
    waits past ``busy_timeout`` fails with ``StoreError``."""
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}?busy_timeout=4000")
    run = sample_run("held")
    await store.commit(Checkpoint.between(None, run))
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    loop = asyncio.get_running_loop()
    loop.call_later(FIRST_WAIT_MS / 1000 + 0.5, blocker.execute, "COMMIT")
    nxt = next_revision(run)
    with caplog.at_level(logging.WARNING, logger="statekernel.stores"):
        await store.commit(Checkpoint.between(run, nxt))
    waits = [r for r in caplog.records if "waiting for its write lock" in r.getMessage()]
    assert len(waits) == 1
    assert str(path) in waits[0].getMessage()
    assert await store.load("held") == nxt
    await store.aclose()

    impatient = SQLiteStore(f"sqlite:///{path}?busy_timeout=1500")
    blocker.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreError, match="database is locked"):
        await impatient.commit(Checkpoint.between(nxt, next_revision(nxt)))
    blocker.execute("ROLLBACK")
    assert await impatient.load("held") == nxt
    await impatient.aclose()
    blocker.close()


async def test_commits_set_no_pragma_and_a_commit_after_a_lease_is_durable_again(
    tmp_path: Path,
) -> None:
    """The connection keeps the busy_timeout and synchronous it last set: a run of commits
    sets no PRAGMA; a lease transaction runs at synchronous NORMAL and the commit after
    it is back at the store's FULL before its BEGIN."""
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")
    run = sample_run("quiet")
    await store.commit(Checkpoint.between(None, run))
    lease = await store.acquire("quiet", "owner", ttl=30)
    nxt = next_revision(run)
    await store.commit(Checkpoint.between(run, nxt), lease=lease)  # back at FULL
    run = nxt
    statements: list[str] = []
    conn = store._conn
    raw = store._raw
    assert conn is not None
    assert raw is not None
    await conn.call(raw.set_trace_callback, statements.append)
    for _ in range(5):
        nxt = next_revision(run)
        await store.commit(Checkpoint.between(run, nxt), lease=lease)
        run = nxt
    assert statements
    assert not [s for s in statements if s.startswith("PRAGMA")]
    statements.clear()
    await store.renew(lease, ttl=30)
    nxt = next_revision(run)
    await store.commit(Checkpoint.between(run, nxt), lease=lease)
    pragmas = [s for s in statements if s.startswith("PRAGMA")]
    assert pragmas == ["PRAGMA synchronous = NORMAL", "PRAGMA synchronous = FULL"]
    begins = [i for i, s in enumerate(statements) if s == "BEGIN IMMEDIATE"]
    assert statements.index("PRAGMA synchronous = FULL") < begins[-1]
    await conn.call(raw.set_trace_callback, None)
    await store.release(lease)
    assert await store.load("quiet") == nxt
    await store.aclose()


@pytest.mark.parametrize("ms", [0, 1, 5000, 10000])
def test_a_connection_waits_what_the_store_asks(tmp_path: Path, ms: int) -> None:
    """``busy_timeout=0`` means no wait, not ``sqlite3.connect``'s own 5 s."""
    import contextlib

    from statekernel.stores.sqlite._file import connect

    with contextlib.closing(
        connect(str(tmp_path / "x.db"), read_only=False, timeout_ms=ms)
    ) as conn:
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (ms,)
