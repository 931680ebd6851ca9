"""Run queues on the Postgres store: entries taken once by readers racing on two pools
(``SKIP LOCKED``), a waiting reader woken by the submit's ``NOTIFY``, polling behind
PgBouncer, reclaim on the server's clock, dead letters kept to their bound, and
layouts of versions 1, 6 and 8 upgraded to hold queues, delayed and keyed entries, and
entries' trace contexts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Literal

import asyncpg
import pytest

from statekernel.errors import InvalidArgument, RunNotFound, StoreError
from statekernel.stores import Checkpoint, PostgresStore
from statekernel.stores.postgres import _queue
from statekernel.stores.postgres._queue import PostgresRunQueue
from statekernel.stores.postgres._schema import SCHEMA, STORE_VERSION
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.telemetry import TraceParent
from statekernel.testing._store_cases import sample_run

from .conftest import HeldUnlisten

pytestmark = pytest.mark.postgres


@pytest.fixture
async def store(postgres_store_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(postgres_store_url)
    yield s
    await s.aclose()


async def _runs(store: PostgresStore, n: int) -> list[str]:
    ids = [f"run-{i}" for i in range(n)]
    for run_id in ids:
        await store.commit(Checkpoint.between(None, sample_run(run_id)))
    return ids


async def test_two_readers_on_two_pools_take_each_entry_once(
    store: PostgresStore, postgres_store_url: str
) -> None:
    ids = await _runs(store, 40)
    for run_id in ids:
        await store.submit(run_id)
    other = PostgresStore(postgres_store_url)
    try:
        a, b = store.run_queue("default"), other.run_queue("default")
        taken: list[str] = []

        async def drain(q: PostgresRunQueue, consumer: str) -> None:
            while batch := await q.read(consumer, 3, 0):
                taken.extend(e.run_id for e in batch)
                assert {e.deliveries for e in batch} == {1}

        await asyncio.gather(drain(a, "a"), drain(b, "b"), drain(a, "a2"), drain(b, "b2"))
        assert sorted(taken) == sorted(ids)
        assert (await a.pending(), await a.waiting()) == (40, 0)
        assert (
            await a.pending("a")
            + await a.pending("a2")
            + await b.pending("b")
            + await b.pending("b2")
            == 40
        )
    finally:
        await other.aclose()


async def test_a_waiting_reader_is_woken_by_the_notice_of_a_submit(
    store: PostgresStore, postgres_store_url: str
) -> None:
    (run_id,) = await _runs(store, 1)
    q = store.run_queue("default")
    notices: list[Any] = []

    def notified(*args: Any) -> None:
        notices.append(args)
        q._wake.set()

    class Parked(asyncio.Event):
        """The reader's wake-up, which says when the reader waits on it."""

        def __init__(self) -> None:
            super().__init__()
            self.waited = asyncio.Event()

        async def wait(self) -> Literal[True]:
            self.waited.set()
            return await super().wait()

    q._notified = notified  # type: ignore[method-assign]
    q._wake = parked = Parked()
    await q.prepare()
    reader = asyncio.create_task(q.read("reader", 10, 600_000))
    await asyncio.wait_for(parked.waited.wait(), 60)  # it looked, found nothing, and waits
    submitter = PostgresStore(postgres_store_url)  # another pool: the notice crosses the server
    try:
        await submitter.submit(run_id)
        entries = await asyncio.wait_for(reader, 60)
    finally:
        await submitter.aclose()
    assert [e.run_id for e in entries] == [run_id]
    assert notices
    assert notices[0][2] == q.channel


async def test_behind_pgbouncer_a_reader_looks_again_instead_of_listening(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_queue, "POLL_SECONDS", 0.01)
    store = PostgresStore(postgres_store_url + "&pgbouncer=1")
    try:
        (run_id,) = await _runs(store, 1)
        q = store.run_queue("default")
        await q.prepare()
        reader = asyncio.create_task(q.read("reader", 10, 600_000))
        await store.submit(run_id)
        entries = await asyncio.wait_for(reader, 60)
        assert [e.run_id for e in entries] == [run_id]
        assert q._listener is None
    finally:
        await store.aclose()


async def test_reclaim_takes_entries_whose_claim_went_stale_on_the_servers_clock(
    store: PostgresStore,
) -> None:
    ids = await _runs(store, 3)
    q = store.run_queue("jobs")
    for run_id in ids:
        await q.submit(run_id)
    first = await q.read("a", 3, 0)
    _, none = await q.reclaim("b", 10, 60_000)
    assert none == []
    await q.refresh("a", [first[0].id])
    conn = await asyncpg.connect(parse_postgres_url(store.url or "").dsn)
    try:  # the claims of the two others are an hour old
        await conn.execute(
            f'UPDATE "{store.schema}".queue_entries SET claimed_at = now() - interval'
            " '1 hour' WHERE id = ANY($1::bigint[])",
            [int(e.id) for e in first[1:]],
        )
    finally:
        await conn.close()
    _, taken = await q.reclaim("b", 10, 60_000)
    assert sorted(e.run_id for e in taken) == sorted(ids[1:])
    assert {e.deliveries for e in taken} == {2}
    assert (await q.pending("a"), await q.pending("b")) == (1, 2)


async def test_settling_acks_requeues_and_buries(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_queue, "DEAD_MAX", 2)
    ids = await _runs(store, 5)
    q = store.run_queue("default")
    for run_id in ids:
        await store.submit(run_id)
    entries = await q.read("w", 5, 0)
    await q.ack(entries[0])
    new_id = await q.requeue(entries[1])
    assert int(new_id) > max(int(e.id) for e in entries)
    for entry in entries[2:]:
        await q.dead(entry, "failed", "x" * 5000, "w")
    assert (await q.pending(), await q.waiting()) == (0, 1)
    (again,) = await q.read("w", 5, 0)
    assert (again.id, again.run_id, again.deliveries) == (new_id, ids[1], 1)
    letters = await q.dead_letters()
    assert [d.run_id for d in letters] == ids[3:]  # the oldest went beyond the bound
    assert {len(d.detail) for d in letters} == {2000}


async def test_submit_refuses_an_unknown_run_and_a_bad_queue_name(store: PostgresStore) -> None:
    with pytest.raises(RunNotFound):
        await store.submit("missing")
    await _runs(store, 1)
    with pytest.raises(InvalidArgument, match="queue name"):
        await store.submit("run-0", queue="{bad}")
    assert await store.run_queue("default").waiting() == 0


async def test_a_version_1_layout_is_upgraded_to_hold_queues(postgres_store_url: str) -> None:
    schema = parse_postgres_url(postgres_store_url).schema
    conn = await asyncpg.connect(parse_postgres_url(postgres_store_url).dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'CREATE TABLE "{schema}".statekernel_schema (version integer)')
        for statement in [s for s in SCHEMA.split(";") if s.strip()]:
            await conn.execute(statement.format(s=f'"{schema}"'))
        await conn.execute(f'INSERT INTO "{schema}".statekernel_schema VALUES (1)')
    finally:
        await conn.close()
    store = PostgresStore(postgres_store_url)
    try:
        (run_id,) = await _runs(store, 1)
        await store.submit(run_id)
        assert [e.run_id for e in await store.run_queue("default").read("w", 1, 0)] == [run_id]
    finally:
        await store.aclose()
    assert await _layout(postgres_store_url, schema) == STORE_VERSION == 9


async def _layout(url: str, schema: str) -> int:
    """The layout version stored in ``schema``."""
    conn = await asyncpg.connect(parse_postgres_url(url).dsn)
    try:
        return int(await conn.fetchval(f'SELECT version FROM "{schema}".statekernel_schema'))
    finally:
        await conn.close()


async def test_a_layout_6_store_gets_delayed_entries_and_keeps_its_waiting_ones(
    postgres_store_url: str,
) -> None:
    store = PostgresStore(postgres_store_url)
    try:
        (run_id,) = await _runs(store, 1)
        await store.submit(run_id)  # waits in the queue across the upgrade
    finally:
        await store.aclose()
    schema = parse_postgres_url(postgres_store_url).schema
    conn = await asyncpg.connect(parse_postgres_url(postgres_store_url).dsn)
    try:
        for column in ("ready_at", "key", "key_limit"):  # the index on key goes with it
            await conn.execute(f'ALTER TABLE "{schema}".queue_entries DROP COLUMN {column}')
        await conn.execute(f'UPDATE "{schema}".statekernel_schema SET version = 6')
    finally:
        await conn.close()
    upgraded = PostgresStore(postgres_store_url)
    try:
        await upgraded.submit(run_id, delay_ms=3_600_000)
        queue = upgraded.run_queue("default")
        assert [e.run_id for e in await queue.read("w", 10, 0)] == [run_id]  # the old one
        assert await queue.read("w", 10, 0) == []  # the delayed one waits
        assert await queue.waiting() == 1
    finally:
        await upgraded.aclose()


async def test_a_layout_8_store_is_listed_read_only_and_upgraded_to_carry_traces(
    postgres_store_url: str,
) -> None:
    """A store of layout 8 (queue entries and dead letters without a trace context): a
    read-only store lists its queues as they are; the first writer adds the columns, the
    entries and dead letters from before read without a trace context, new ones carry
    theirs."""
    store = PostgresStore(postgres_store_url)
    try:
        old, dead, new = await _runs(store, 3)
        await store.submit(dead)
        queue = store.run_queue("default")
        (taken,) = await queue.read("w", 10, 0)
        await queue.dead(taken, "failed", "it failed", "w")
        await store.submit(old)  # waits in the queue across the upgrade
    finally:
        await store.aclose()
    schema = parse_postgres_url(postgres_store_url).schema
    conn = await asyncpg.connect(parse_postgres_url(postgres_store_url).dsn)
    try:  # as the release before left it
        for table in ("queue_entries", "dead_letters"):
            for column in ("traceparent", "tracestate"):
                await conn.execute(f'ALTER TABLE "{schema}".{table} DROP COLUMN {column}')
        await conn.execute(f'UPDATE "{schema}".statekernel_schema SET version = 8')
    finally:
        await conn.close()
    reader = PostgresStore(postgres_store_url, read_only=True)
    try:
        listed = reader.run_queue("default")
        assert [e.run_id for e in await listed.entries()] == [old]
        assert (await listed.depth()).dead == 1
        assert [d.run_id for d in await listed.dead_letters()] == [dead]
    finally:
        await reader.aclose()
    trace = TraceParent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v")
    upgraded = PostgresStore(postgres_store_url)
    try:
        await upgraded.submit(new, trace=trace)
        queue = upgraded.run_queue("default")
        assert await queue.revive(dead) == 1
        traces = {e.run_id: e.trace for e in await queue.read("w", 10, 0)}
        assert traces == {old: None, new: trace, dead: None}
    finally:
        await upgraded.aclose()
    assert await _layout(postgres_store_url, schema) == STORE_VERSION == 9


async def test_a_dead_connection_to_listen_on_is_a_store_error(
    store: PostgresStore, postgres_store_url: str
) -> None:
    """As after a server restart, the pool hands a dead connection to listen on: the
    read fails with a ``StoreError`` (a worker waits and reads again), and the next one
    listens on a live connection."""
    (run_id,) = await _runs(store, 1)
    dead = await asyncpg.connect(parse_postgres_url(postgres_store_url).dsn)
    await dead.close()
    q = store.run_queue("default")
    given = q._acquire
    handed: list[Any] = []

    async def acquire() -> Any:
        handed.append(dead if not handed else await given())
        return handed[-1]

    q._acquire = acquire
    with pytest.raises(StoreError):
        await q.read("reader", 10, 0)
    await q.submit(run_id)
    assert [e.run_id for e in await q.read("reader", 10, 60_000)] == [run_id]
    assert q._listener is handed[-1]


async def test_a_queue_closed_while_its_task_is_cancelled_again_gives_its_connection_back(
    postgres_store_url: str, held_unlisten: HeldUnlisten
) -> None:
    """A worker cancelled while it closes its queue, and cancelled again meanwhile: the
    listening connection still goes back to the pool (or the store's close waits for it
    forever)."""
    target = parse_postgres_url(postgres_store_url)
    pool = await asyncpg.create_pool(target.dsn, min_size=1, max_size=4)
    store = PostgresStore(pool=pool, schema=target.schema)
    try:
        q = store.run_queue("default")
        await q.prepare()
        task = asyncio.create_task(q.aclose())
        await held_unlisten.removing.wait()
        task.cancel()
        held_unlisten.go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert q._listener is None
        assert store._listeners == 0
        assert pool.get_size() - pool.get_idle_size() == 0
    finally:
        await store.aclose()
        pool.terminate()  # close() would wait for a connection never given back
