"""A PostgreSQL commit that creates a run, or is fenced by the run's current lease (and
gives it up with it, ``ReleasesWithCommit``), lands in one statement (one round trip);
one that would be refused writes nothing there, and the transaction that follows
refuses it as before (``ConflictError``, ``LeaseLost``, another head)."""

from __future__ import annotations

from typing import Any

import pytest

from statekernel.errors import ConflictError, LeaseLost, RunBusy
from statekernel.stores import Checkpoint, PostgresStore
from statekernel.stores.postgres import _ops, _writer
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.testing._store_cases import next_revision, sample_run

from ..conftest import pg_admin

pytestmark = pytest.mark.postgres


def one_statement_commits(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What each one-statement commit the writer tries returns (the new head, or None when
    it wrote nothing), in order, wrapped through the writer's module."""
    at_once: list[Any] = []
    real = _ops.commit_at_once

    async def counted(*args: Any) -> Any:
        stored = await real(*args)
        at_once.append(stored)
        return stored

    monkeypatch.setattr(_writer, "commit_at_once", counted)
    return at_once


async def test_a_fenced_commit_lands_in_one_statement(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_once = one_statement_commits(monkeypatch)
    store = PostgresStore(postgres_store_url)
    try:
        first = sample_run("r")
        await store.commit(Checkpoint.between(None, first))  # a new run: one statement too
        assert len(at_once) == 1
        assert at_once[0] is not None, "the run was not created in one statement"
        with pytest.raises(ConflictError):  # its id is taken: nothing written, then refused
            await store.commit(Checkpoint.between(None, first))
        assert len(at_once) == 2
        assert at_once[1] is None
        held = await store.acquire("r", "a", ttl=60)
        second = next_revision(first)
        await store.commit(Checkpoint.between(first, second), lease=held)
        assert len(at_once) == 3
        assert at_once[2] is not None, "the commit did not land in one statement"
        assert await store.load("r") == second
        await store.release(held)
        taken = await store.acquire("r", "b", ttl=60)
        third = next_revision(second)
        with pytest.raises(LeaseLost):  # the old owner's commit: refused
            await store.commit(Checkpoint.between(second, third), lease=held)
        assert at_once[-1] is None
        assert (await store.load("r")).revision == second.revision  # nothing written
        await store.commit(Checkpoint.between(second, third), lease=taken)
        assert at_once[-1] is not None
        assert await store.load("r") == third
        assert await store.load("r", revision=second.revision) == second
    finally:
        await store.aclose()


async def test_a_commit_that_gives_its_lease_up_lands_in_one_statement(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_once = one_statement_commits(monkeypatch)
    store = PostgresStore(postgres_store_url)
    try:
        first = sample_run("r")
        await store.commit(Checkpoint.between(None, first))
        held = await store.acquire("r", "a", ttl=60)
        second = next_revision(first)
        await store.commit_and_release(Checkpoint.between(first, second), lease=held)
        assert len(at_once) == 2
        assert at_once[1] is not None, "not one statement"
        assert await store.load("r") == second
        assert await store.holder("r") is None
        taken = await store.acquire("r", "b", ttl=60)  # at once: the lease went with the commit
        third = next_revision(second)
        with pytest.raises(LeaseLost):  # the given-up lease commits nothing more
            await store.commit_and_release(Checkpoint.between(second, third), lease=held)
        assert at_once[-1] is None
        assert await store.holder("r") == "b"  # the refused commit gave nothing up
        await store.commit_and_release(Checkpoint.between(second, third), lease=taken)
        assert await store.load("r") == third
    finally:
        await store.aclose()


async def test_a_new_connection_prepares_the_statements_of_a_drive(
    postgres_store_url: str,
) -> None:
    """A run's first steps prepare nothing: each connection of the store's pool has the
    drive's statements prepared when it opens (and none behind PgBouncer)."""
    store = PostgresStore(postgres_store_url)
    bouncer = PostgresStore(f"{postgres_store_url}&pgbouncer=1")
    try:
        for each in (store, bouncer):
            await each.list_runs()  # opens the pool
        pool, plain = store._pool, bouncer._pool
        assert pool is not None
        assert plain is not None
        async with pool.acquire() as conn:
            prepared = [
                r[0] for r in await conn.fetch("SELECT statement FROM pg_prepared_statements")
            ]
        kinds = {
            "create": "WITH landed AS (INSERT INTO",
            "commit": "FOR SHARE), landed AS (UPDATE",
            "commit and release": "freed AS (UPDATE",
            "take a free lease": "l SET token = GREATEST(l.token, r.fence) + 1",
            "load a head": "UNION ALL SELECT 3, NULL, b.key",
        }
        for kind, text in kinds.items():
            assert any(text in p for p in prepared), f"{kind}: not prepared"
        async with plain.acquire() as conn:
            assert await conn.fetch("SELECT statement FROM pg_prepared_statements") == []
        # and the statements it prepared write nothing
        assert (await store.list_runs()).runs == ()
    finally:
        await store.aclose()
        await bouncer.aclose()


async def _idle_connections(store: PostgresStore) -> list[Any]:
    """Every idle connection of the store's pool, taken (give each back after)."""
    pool = store._pool
    assert pool is not None
    return [await pool.acquire() for _ in range(pool.get_idle_size())]


async def test_a_commit_is_one_round_trip(postgres_store_url: str) -> None:
    """A connection goes back to the store's pool without asyncpg's reset statements (a
    second round trip after every commit): a drive's commit (fenced by its lease) sends
    its one statement."""
    store = PostgresStore(postgres_store_url)
    try:
        run = sample_run("r")
        await store.commit(Checkpoint.between(None, run))
        lease = await store.acquire("r", "owner-a", ttl=60)
        sent: list[str] = []
        pool = store._pool
        assert pool is not None
        for conn in await _idle_connections(store):
            conn.add_query_logger(lambda record: sent.append(record.query))
            await pool.release(conn)
        sent.clear()  # what releasing them sent
        for _ in range(5):
            nxt = next_revision(run)
            await store.commit(Checkpoint.between(run, nxt), lease=lease)
            run = nxt
        assert len(sent) == 5, sent
        assert await store.load("r") == run
    finally:
        await store.aclose()


async def test_a_connection_goes_back_with_nothing_of_its_session(
    postgres_store_url: str,
) -> None:
    """What a session kept (an owner's advisory lock, a watch's ``LISTEN`` and its lock)
    is cleared before its connection serves anything else."""
    store = PostgresStore(postgres_store_url)
    try:
        await store.commit(Checkpoint.between(None, sample_run("r")))
        lease = await store.acquire("r", "owner-a", ttl=60)  # an owner's advisory lock
        async with store.watch("r"):
            pass
        await store.release(lease)  # the owner's last lease: its lock goes, and its session
        pool = store._pool
        assert pool is not None
        taken = await _idle_connections(store)
        try:
            assert taken, "no idle connection to look at"
            for conn in taken:
                assert await conn.fetch("SELECT pg_listening_channels()") == []
                locks = await conn.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1",
                    conn.get_server_pid(),
                )
                assert locks == 0
        finally:
            for conn in taken:
                await pool.release(conn)
    finally:
        await store.aclose()


async def test_a_new_run_takes_its_lease_in_the_same_statement_or_after_a_kept_lease_row(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``create_leased`` lands in one statement with token 1. Where the id kept a lease row
    (a run deleted by hand, its lease row left), the run is created without its lease
    (None), and ``acquire`` decides about that row as always: a dead owner's is taken
    with a larger token, a live one's stays its own."""
    at_once = one_statement_commits(monkeypatch)
    store = PostgresStore(postgres_store_url)
    parsed = parse_postgres_url(postgres_store_url)
    try:
        lease = await store.create_leased(Checkpoint.between(None, sample_run("new")), "a", ttl=60)
        assert lease is not None
        assert (lease.token, at_once[-1] is not None) == ("1", True)
        with pytest.raises(RunBusy):
            await store.acquire("new", "b", ttl=60)
        await store.release(lease)
        for expires, owner in ((0, "dead"), (4e9, "live-elsewhere/1/x")):
            run_id = f"kept-{owner[:4]}"
            pg_admin(
                parsed.dsn,
                f'INSERT INTO "{parsed.schema}".leases (run_id, token, owner, expires, proof)'
                f" VALUES (convert_to('{run_id}', 'UTF8'), 7, convert_to('{owner}', 'UTF8'),"
                f" {expires}, 'renewal')",
            )
        for run_id in ("kept-dead", "kept-live"):
            run = sample_run(run_id)
            assert await store.create_leased(Checkpoint.between(None, run), "a", ttl=60) is None
            assert at_once[-1] is None  # not in one statement: the kept row is there
            assert await store.load(run_id) == run
        dead = await store.acquire("kept-dead", "a", ttl=60)
        assert int(dead.token) == 8
        await store.release(dead)
        with pytest.raises(RunBusy):
            await store.acquire("kept-live", "a", ttl=60)
    finally:
        await store.aclose()
