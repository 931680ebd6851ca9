"""A PostgreSQL run's cancel request (``CancelsRuns``): kept in its row, checked in the
commit's one statement, ordered with commits by the row's lock, behind PgBouncer too,
and added to an older layout by its upgrade (a read-only store of that layout has none)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import attrs
import pytest

from statekernel.errors import CancelRequested, InvalidTransition, LeaseLost
from statekernel.stores import Checkpoint, PostgresStore
from statekernel.stores._format.cancels import encode_cancel
from statekernel.stores.postgres import _ops, _writer
from statekernel.stores.postgres._schema import CANCELS_VERSION, STORE_VERSION
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.testing._store_cancels import ASKED, LATER, check_cancels_runs
from statekernel.testing._store_cases import next_revision, sample_run

pytestmark = pytest.mark.postgres


@pytest.fixture
async def store(postgres_store_url: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore(postgres_store_url)
    try:
        yield opened
    finally:
        await opened.aclose()


async def _raw(url: str) -> Any:
    return await asyncpg.connect(parse_postgres_url(url).dsn)


def _runs(url: str) -> str:
    return f'"{parse_postgres_url(url).schema}".runs'


async def test_behind_pgbouncer_too(postgres_store_url: str) -> None:
    bouncer = PostgresStore(f"{postgres_store_url}&pgbouncer=1")
    try:
        await check_cancels_runs(bouncer)
    finally:
        await bouncer.aclose()


async def test_a_refused_commit_is_one_statement_and_gives_nothing_up(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-statement commit reports the request (no transaction follows it), and a
    ``commit_and_release`` refused for it keeps its lease; an old owner's commit is
    ``LeaseLost``, not ``CancelRequested``: the lease check comes first."""
    tried: list[Any] = []
    real_at_once, real_apply = _ops.commit_at_once, _ops.apply_commit

    async def at_once(*args: Any) -> Any:
        tried.append("at once")
        return await real_at_once(*args)

    async def apply(*args: Any) -> Any:
        tried.append("apply")
        return await real_apply(*args)

    monkeypatch.setattr(_writer, "commit_at_once", at_once)
    monkeypatch.setattr(_writer, "apply_commit", apply)
    run = sample_run("r")
    await store.commit(Checkpoint.between(None, run))
    lease = await store.acquire("r", "a", ttl=60)
    assert await store.request_cancel("r", ASKED) is None
    tried.clear()
    with pytest.raises(CancelRequested) as refused:
        await store.commit_and_release(Checkpoint.between(run, next_revision(run)), lease=lease)
    assert (refused.value.reason, refused.value.by) == (ASKED.reason, ASKED.by)
    assert tried == ["at once"]
    assert await store.holder("r") == "a"
    assert await store.load("r") == run
    await store.release(lease)
    taken = await store.acquire("r", "b", ttl=60)
    with pytest.raises(LeaseLost):
        await store.commit(Checkpoint.between(run, next_revision(run)), lease=lease)
    failed = next_revision(run, state="failed")
    carried = attrs.evolve(Checkpoint.between(run, failed), cancels=True)
    await store.commit_and_release(carried, lease=taken)
    assert await store.load("r") == failed
    assert await store.cancel_request("r") is None
    assert await store.holder("r") is None


async def test_a_request_kept_while_a_commit_waits_for_the_row_refuses_it(
    store: PostgresStore, postgres_store_url: str
) -> None:
    """A commit that waited for the run row's lock reads the row the request left."""
    run = sample_run("r")
    await store.commit(Checkpoint.between(None, run))
    lease = await store.acquire("r", "a", ttl=60)
    conn = await _raw(postgres_store_url)
    try:
        async with conn.transaction():
            await conn.execute(
                f"UPDATE {_runs(postgres_store_url)} SET cancel = $1 WHERE run_id = $2",
                encode_cancel(ASKED),
                b"r",
            )
            commit = asyncio.ensure_future(
                store.commit(Checkpoint.between(run, next_revision(run)), lease=lease)
            )
            await asyncio.sleep(0.3)
            assert not commit.done(), "the commit did not wait for the run row"
        with pytest.raises(CancelRequested):
            await commit
    finally:
        await conn.close()
    assert await store.load("r") == run
    assert await store.cancel_request("r") == ASKED


@pytest.mark.parametrize("state", ["failed", "paused"])
async def test_a_request_waits_for_a_commit_holding_the_row(
    store: PostgresStore, postgres_store_url: str, state: str
) -> None:
    """A request that waited for the run row's lock reads the row the commit left: one
    that made the run failed keeps no request, one that left it running does."""
    await store.commit(Checkpoint.between(None, sample_run("r")))
    conn = await _raw(postgres_store_url)
    try:
        async with conn.transaction():
            await conn.execute(
                f"UPDATE {_runs(postgres_store_url)} SET state = $1, revision = 1"
                " WHERE run_id = $2",
                state,
                b"r",
            )
            asked = asyncio.ensure_future(store.request_cancel("r", ASKED))
            await asyncio.sleep(0.3)
            assert not asked.done(), "the request did not wait for the run row"
        if state == "failed":
            with pytest.raises(InvalidTransition):
                await asked
            assert await store.cancel_request("r") is None
        else:
            assert await asked is None
            assert await store.cancel_request("r") == ASKED
            assert await store.request_cancel("r", LATER) == ASKED
    finally:
        await conn.close()


async def test_commits_and_requests_race(store: PostgresStore) -> None:
    """A request sent while a run's commits go on: each commit lands before it or is
    refused after it, never after it lands."""
    run = sample_run("r")
    await store.commit(Checkpoint.between(None, run))
    lease = await store.acquire("r", "a", ttl=60)

    async def commits() -> int:
        nonlocal run
        landed = 0
        while True:
            nxt = next_revision(run)
            try:
                await store.commit(Checkpoint.between(run, nxt), lease=lease)
            except CancelRequested:
                return landed
            run, landed = nxt, landed + 1

    going = asyncio.ensure_future(commits())
    await asyncio.sleep(0.2)
    assert await store.request_cancel("r", ASKED) is None
    landed = await asyncio.wait_for(going, 10)
    assert landed > 0
    assert (await store.load("r")).revision == landed
    assert await store.cancel_request("r") == ASKED


async def test_a_group_with_fenced_commits(store: PostgresStore) -> None:
    """A batch of fenced commits (the transaction with a savepoint each): those of runs
    with a request are refused, the cancellation lands, the others land."""
    runs = [sample_run(f"g{i}") for i in range(6)]
    for run in runs:
        await store.commit(Checkpoint.between(None, run))
    leases = [await store.acquire(r.run_id, "a", ttl=60) for r in runs]
    for run in runs[:4]:
        assert await store.request_cancel(run.run_id, ASKED) is None
    checkpoints = [Checkpoint.between(r, next_revision(r)) for r in runs]
    checkpoints[0] = attrs.evolve(checkpoints[0], cancels=True)
    outcomes = await asyncio.gather(
        *(store.commit(c, lease=lease) for c, lease in zip(checkpoints, leases, strict=True)),
        return_exceptions=True,
    )
    assert outcomes[0] is None
    assert all(isinstance(o, CancelRequested) for o in outcomes[1:4]), outcomes
    assert outcomes[4:] == [None, None]
    assert [(await store.load(r.run_id)).revision for r in runs] == [1, 0, 0, 0, 1, 1]
    kept = [await store.cancel_request(r.run_id) for r in runs]
    assert kept == [None, ASKED, ASKED, ASKED, None, None]


async def test_a_layout_5_store_is_upgraded(postgres_store_url: str) -> None:
    """A store of layout 5 gets the cancel column; read-only before, it keeps none."""
    first = PostgresStore(postgres_store_url)
    try:
        await first.commit(Checkpoint.between(None, sample_run("r")))
    finally:
        await first.aclose()
    schema = f'"{parse_postgres_url(postgres_store_url).schema}"'
    conn = await _raw(postgres_store_url)
    try:
        await conn.execute(f"ALTER TABLE {schema}.runs DROP COLUMN cancel")
        for column in ("ready_at", "key", "key_limit"):  # the index on key goes with it
            await conn.execute(f"ALTER TABLE {schema}.queue_entries DROP COLUMN {column}")
        await conn.execute(f"UPDATE {schema}.statekernel_schema SET version = 5")
    finally:
        await conn.close()
    reader = PostgresStore(postgres_store_url, read_only=True)
    try:
        assert await reader.cancel_request("r") is None
        assert (await reader.load("r")).revision == 0
    finally:
        await reader.aclose()
    upgraded = PostgresStore(postgres_store_url)
    try:
        assert await upgraded.request_cancel("r", ASKED) is None
        assert await upgraded.cancel_request("r") == ASKED
    finally:
        await upgraded.aclose()
    conn = await _raw(postgres_store_url)
    try:
        version = await conn.fetchval(f"SELECT version FROM {schema}.statekernel_schema")
    finally:
        await conn.close()
    assert version == STORE_VERSION >= CANCELS_VERSION


async def test_a_warm_connection_has_the_read_of_a_request_prepared(
    store: PostgresStore,
) -> None:
    await store.list_runs()
    pool = store._pool
    assert pool is not None
    async with pool.acquire() as conn:
        prepared = [r[0] for r in await conn.fetch("SELECT statement FROM pg_prepared_statements")]
    assert any(p.startswith("SELECT cancel FROM") for p in prepared), prepared
