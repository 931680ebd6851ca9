"""A run's fencing tokens only grow, whatever happens to its lease record: ``migrate``
carries them between every pair of stores, a lease record lost or deleted (a PostgreSQL
or SQLite row, a file store's lease file) never hands out a token given before, and a
Redis fence counter never expires."""

from __future__ import annotations

import itertools
import sqlite3
import uuid
from pathlib import Path

import pytest

from statekernel.errors import CorruptCheckpoint, RunBusy
from statekernel.stores import (
    Checkpoint,
    CheckpointStore,
    FileStore,
    KeepsFences,
    Lease,
    RedisStore,
    SQLiteStore,
    migrate,
    open_store,
)
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.stores.sqlite._schema import STORE_VERSION
from statekernel.testing._store_cases import next_revision, sample_run

from ..conftest import pg_admin

KINDS = ("memory", "sqlite", "file", "redis", "postgres")
SERVERS = {"redis": pytest.mark.redis, "postgres": pytest.mark.postgres}


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest, side: str) -> str:
    if kind == "postgres":
        return f"{request.getfixturevalue('postgres_store_url')}_{side}"
    if kind == "redis":
        return f"{request.getfixturevalue('redis_store_url')}-{side}"
    return {
        "memory": f"memory://fences-{uuid.uuid4().hex}",
        "sqlite": f"sqlite:///{tmp_path}/{side}.db",
        "file": f"file://{tmp_path}/{side}",
    }[kind]


PAIRS = [
    pytest.param(a, b, marks=[SERVERS[k] for k in {a, b} if k in SERVERS])
    for a, b in itertools.product(KINDS, KINDS)
]


@pytest.mark.parametrize(("source_kind", "target_kind"), PAIRS)
async def test_migrate_carries_the_fence(
    source_kind: str, target_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    source = open_store(_url(source_kind, tmp_path, request, "a"))
    target = open_store(_url(target_kind, tmp_path, request, "b"))
    try:
        run = sample_run("fenced")
        await source.commit(Checkpoint.between(None, run))
        for _ in range(3):  # tokens 1, 2, 3; the last one commits
            lease = await source.acquire("fenced", "owner-a", ttl=60)
            await source.release(lease)
        lease = await source.acquire("fenced", "owner-a", ttl=60)
        await source.commit(Checkpoint.between(run, next_revision(run)), lease=lease)
        await source.release(lease)
        assert isinstance(source, KeepsFences)
        assert await source.fence("fenced") == 4
        await migrate(source, target)
        taken = await target.acquire("fenced", "owner-b", ttl=60)
        assert taken.generation == 5
        await target.release(taken)
    finally:
        await source.aclose()
        await target.aclose()


@pytest.mark.postgres
async def test_a_deleted_postgres_lease_row_never_restarts_the_tokens(
    postgres_store_url: str,
) -> None:
    store = open_store(postgres_store_url)
    try:
        run = sample_run("fenced")
        await store.commit(Checkpoint.between(None, run))
        for _ in range(3):
            lease = await store.acquire("fenced", "owner", ttl=60)
            run_next = next_revision(run)
            await store.commit(Checkpoint.between(run, run_next), lease=lease)
            await store.release(lease)
            run = run_next
        schema = parse_postgres_url(postgres_store_url).schema
        pg_admin(parse_postgres_url(postgres_store_url).dsn, f'DELETE FROM "{schema}".leases')
        lease = await store.acquire("fenced", "owner", ttl=60)
        assert lease.generation == 4
    finally:
        await store.aclose()


@pytest.mark.redis
async def test_the_redis_fence_counter_never_expires(redis_store_url: str) -> None:
    store = RedisStore(redis_store_url)
    try:
        await store.commit(Checkpoint.between(None, sample_run("fenced")))
        lease = await store.acquire("fenced", "owner", ttl=60)
        await store.release(lease)
        client = store.client
        key = store.run_key("fenced", "fence")
        assert await client.pttl(key) == -1  # no expiry
        await client.pexpire(key, 60_000)  # as a release of an older layout left it
        lease = await store.acquire("fenced", "owner", ttl=60)
        assert lease.generation == 2
        assert await client.pttl(key) == -1
        await store.release(lease)
    finally:
        await store.aclose()


def _forget_lease(store: CheckpointStore, run_id: str) -> None:
    """Delete the run's lease record by hand, as an operator or a lost file would."""
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))
        conn.close()
    else:
        assert isinstance(store, FileStore)
        (leases,) = store.root.glob("*/lease.json")
        leases.unlink()


@pytest.mark.parametrize("kind", ["sqlite", "file"])
async def test_a_deleted_lease_record_never_restarts_the_tokens(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = open_store(_url(kind, tmp_path, request, "a"))
    try:
        run = sample_run("fenced")
        await store.commit(Checkpoint.between(None, run))
        for _ in range(3):  # tokens 1, 2, 3, each carried by a commit
            lease = await store.acquire("fenced", "owner", ttl=60)
            run_next = next_revision(run)
            await store.commit(Checkpoint.between(run, run_next), lease=lease)
            await store.release(lease)
            run = run_next
        _forget_lease(store, "fenced")
        lease = await store.acquire("fenced", "owner", ttl=60)
        assert lease.generation == 4
        run_next = next_revision(run)  # the new owner's commits land
        await store.commit(Checkpoint.between(run, run_next), lease=lease)
        await store.release(lease)
        assert await store.load("fenced") == run_next
        _forget_lease(store, "fenced")
        assert isinstance(store, KeepsFences)
        assert await store.fence("fenced") == 4
    finally:
        await store.aclose()


async def test_a_deleted_sqlite_lease_row_never_repeats_a_token_given_without_a_commit(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")
    try:
        await store.commit(Checkpoint.between(None, sample_run("fenced")))
        for _ in range(2):  # tokens 1 and 2, no commit under either
            await store.release(await store.acquire("fenced", "owner", ttl=60))
        _forget_lease(store, "fenced")
        lease = await store.acquire("fenced", "owner", ttl=60)
        assert lease.generation == 3
        await store.release(lease)
    finally:
        await store.aclose()


async def test_a_run_created_with_its_lease_takes_a_token_above_a_kept_lease_row(
    tmp_path: Path,
) -> None:
    """A lease row its id kept (the run deleted by hand): ``create_leased`` takes the next
    token after it in the creation's transaction (its owner of another process is dead:
    its owner lock is free); a live owner's row (one of this process, holding a lease)
    is left to it: the run is created without its lease (None), which stays the live
    owner's until it gives it back."""
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")
    try:
        await store.commit(Checkpoint.between(None, sample_run("first")))  # the tables exist
        alive = await store.acquire("first", "live", ttl=60)  # "live" holds a lease here
        with sqlite3.connect(store.path) as conn:
            conn.execute("INSERT INTO leases VALUES ('kept', 7, 'h/1/gone', 4e9)")
            conn.execute("INSERT INTO leases VALUES ('held', 3, 'live', 4e9)")
        conn.close()
        lease = await store.create_leased(Checkpoint.between(None, sample_run("kept")), "o", ttl=60)
        assert lease is not None
        assert lease.generation == 8
        assert await store.fence("kept") == 8
        await store.release(lease)
        held = sample_run("held")
        assert await store.create_leased(Checkpoint.between(None, held), "o", ttl=60) is None
        assert await store.load("held") == held
        with pytest.raises(RunBusy):
            await store.acquire("held", "o", ttl=60)
        await store.release(Lease("held", "live", "3"))
        taken = await store.acquire("held", "o", ttl=60)
        assert taken.generation == 4
        await store.release(taken)
        await store.release(alive)
    finally:
        await store.aclose()


def _as_layout_4(path: Path) -> None:
    """Turn a SQLite store back into layout 4, as the release before the fence column
    left it."""
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN fence")
        conn.execute("UPDATE statekernel_schema SET version = 4")
    conn.close()


async def test_a_sqlite_store_of_layout_4_is_read_as_it_is_and_upgraded_keeping_its_tokens(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    run = sample_run("fenced")
    await store.commit(Checkpoint.between(None, run))
    for _ in range(3):
        await store.release(await store.acquire("fenced", "owner", ttl=60))
    await store.aclose()
    _as_layout_4(path)
    reader = SQLiteStore(f"sqlite:///{path}", read_only=True)
    try:  # read as it is, nothing written
        assert await reader.load("fenced") == run
        assert [r.run_id for r in (await reader.list_runs()).runs] == ["fenced"]
    finally:
        await reader.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM statekernel_schema").fetchall() == [(4,)]
    conn.close()
    store = SQLiteStore(f"sqlite:///{path}")
    try:  # the first writer upgrades it; the tokens the lease rows held become the fences
        assert await store.load("fenced") == run
        _forget_lease(store, "fenced")
        lease = await store.acquire("fenced", "owner", ttl=60)
        assert lease.generation == 4
        await store.release(lease)
    finally:
        await store.aclose()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM statekernel_schema").fetchall() == [
            (STORE_VERSION,)
        ]
    conn.close()


async def test_a_damaged_sqlite_fence_is_a_typed_error_naming_the_run(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        await store.commit(Checkpoint.between(None, sample_run("fenced")))
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE runs SET fence = 'x'")
        conn.close()
        with pytest.raises(CorruptCheckpoint, match=r"'fenced'.*fence is 'x'"):
            await store.acquire("fenced", "owner", ttl=60)
    finally:
        await store.aclose()
