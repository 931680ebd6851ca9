"""The Postgres store beyond the conformance suite: its layout, owners proven alive by
a session's advisory lock, its URL options, a pool of the caller's, ``migrate`` with
SQLite both ways."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from statekernel.errors import ConfigError, RunBusy, RunNotFound, StoreError
from statekernel.stores import Checkpoint, Migration, PostgresStore, migrate, open_store, watch
from statekernel.stores.postgres._schema import STORE_VERSION
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.testing._store_cases import events_for, next_revision, sample_run

from ..conftest import pg_value
from .conftest import HeldUnlisten

pytestmark = pytest.mark.postgres


def _schema(url: str) -> str:
    return parse_postgres_url(url).schema


async def test_stores_starting_at_once_on_an_empty_schema_create_it_once(
    postgres_store_url: str,
) -> None:
    stores = [PostgresStore(postgres_store_url) for _ in range(6)]
    try:
        runs = [sample_run(f"first-{i}") for i in range(len(stores))]
        await asyncio.gather(
            *(s.commit(Checkpoint.between(None, r)) for s, r in zip(stores, runs, strict=True))
        )
        for run in runs:
            assert await stores[0].load(run.run_id) == run
    finally:
        for store in stores:
            await store.aclose()
    conn = await asyncpg.connect(parse_postgres_url(postgres_store_url).dsn)
    try:
        versions = await conn.fetch(
            f'SELECT version FROM "{_schema(postgres_store_url)}".statekernel_schema'
        )
    finally:
        await conn.close()
    assert [v[0] for v in versions] == [STORE_VERSION]


async def test_a_newer_layout_is_refused(postgres_store_url: str) -> None:
    store = PostgresStore(postgres_store_url)
    await store.commit(Checkpoint.between(None, sample_run("kept")))
    await store.aclose()
    conn = await asyncpg.connect(parse_postgres_url(postgres_store_url).dsn)
    schema = _schema(postgres_store_url)
    try:
        await conn.execute(
            f'UPDATE "{schema}".statekernel_schema SET version = $1', STORE_VERSION + 1
        )
    finally:
        await conn.close()
    store = PostgresStore(postgres_store_url)
    try:
        with pytest.raises(StoreError, match="newer than this release"):
            await store.load("kept")
    finally:
        await store.aclose()


_HOLDER = """
import asyncio, sys
from statekernel.stores import PostgresStore

async def main():
    store = PostgresStore(sys.argv[1])
    await store.acquire("held", "owner-elsewhere", ttl=float(sys.argv[2]))
    print(store._owners._conn.get_server_pid(), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def _gone(dsn: str, pid: int) -> None:
    """Wait until the server has ended the session of backend ``pid``."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 30
        while await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
            assert time.monotonic() < deadline, "the killed owner's session never ended"
            await asyncio.sleep(0.01)
    finally:
        await conn.close()


async def _holder(url: str, ttl: float) -> tuple[asyncio.subprocess.Process, int]:
    """A process holding run ``held`` for ``ttl`` seconds, and its lock session's pid."""
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-c", _HOLDER, url, str(ttl), stdout=asyncio.subprocess.PIPE
    )
    assert holder.stdout is not None
    return holder, int(await holder.stdout.readline())


async def test_a_live_owner_keeps_its_run_and_a_dead_one_loses_it_after_the_grace(
    postgres_store_url: str,
) -> None:
    """A held lock proves the owner alive; a free one only marks the row: the run is
    taken once the lock stayed free for the grace, long before the lease expires."""
    store = PostgresStore(postgres_store_url)
    run = sample_run("held")
    await store.commit(Checkpoint.between(None, run))
    holder, pid = await _holder(postgres_store_url, 600)
    try:
        with pytest.raises(RunBusy, match="owner-elsewhere"):
            await store.acquire("held", "owner-here", ttl=600)
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
        await _gone(parse_postgres_url(postgres_store_url).dsn, pid)
        with pytest.raises(RunBusy):  # the lock is free: the owner is suspected, not dead
            await store.acquire("held", "owner-here", ttl=600)
        deadline = time.monotonic() + 60
        while True:  # taken once the grace has passed on the server's clock
            try:
                lease = await store.acquire("held", "owner-here", ttl=600)
                break
            except RunBusy:
                assert time.monotonic() < deadline, "a dead owner's run was never taken"
                await asyncio.sleep(0.05)
        assert lease.generation == 2
        assert lease.taken_from == "owner-elsewhere"  # the dead owner's lease, taken over
        await store.commit(Checkpoint.between(run, next_revision(run)), lease=lease)
        await store.release(lease)
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await store.aclose()


async def test_an_expired_lease_is_taken_though_its_owner_s_lock_is_held(
    postgres_store_url: str,
) -> None:
    """The lease row on the server's clock is the truth: a lock still held (a vanished
    machine's session lives until TCP keepalive ends it) never outlasts the lease."""
    store = PostgresStore(postgres_store_url)
    await store.commit(Checkpoint.between(None, sample_run("held")))
    holder, _ = await _holder(postgres_store_url, 0)
    try:
        lease = await store.acquire("held", "owner-here", ttl=600)
        assert lease.generation == 2
        assert lease.taken_from == "owner-elsewhere"
        await store.release(lease)
    finally:
        holder.kill()
        await holder.wait()
        await store.aclose()


_BOUNCED_HOLDER = """
import asyncio, sys
from statekernel.stores import open_store

async def main():
    store = open_store(sys.argv[1])
    await store.acquire("bounced", "owner-elsewhere", ttl=float(sys.argv[2]))
    await store.aclose()  # the lease stays: nothing but its expiry ends it here

asyncio.run(main())
"""


async def test_behind_pgbouncer_another_process_lease_lasts_until_it_expires(
    postgres_store_url: str,
) -> None:
    """No session lock proves an owner alive behind PgBouncer: a lease of another process
    lasts until it expires on the server's clock, and is taken once it has."""
    url = f"{postgres_store_url}&pgbouncer=1"
    store = open_store(url)
    try:
        await store.commit(Checkpoint.between(None, sample_run("bounced")))
        for ttl, taken in ((0.0, True), (600.0, False)):
            holder = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",
                "-c",
                _BOUNCED_HOLDER,
                url,
                str(ttl),
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await holder.communicate()
            assert holder.returncode == 0, err.decode()
            if taken:
                lease = await store.acquire("bounced", "owner-here", ttl=600)
                assert lease.taken_from == "owner-elsewhere"
                await store.release(lease)
            else:
                with pytest.raises(RunBusy, match="owner-elsewhere"):
                    await store.acquire("bounced", "owner-here", ttl=600)
    finally:
        await store.aclose()


async def test_an_unexpired_lease_of_this_process_is_refused_to_another_store(
    postgres_store_url: str,
) -> None:
    first, second = PostgresStore(postgres_store_url), PostgresStore(postgres_store_url)
    try:
        run = sample_run("shared")
        await first.commit(Checkpoint.between(None, run))
        lease = await first.acquire("shared", "one", ttl=600)
        with pytest.raises(RunBusy):
            await second.acquire("shared", "two", ttl=600)
        await first.release(lease)
        given = await second.acquire("shared", "two", ttl=600)
        assert given.taken_from is None  # given back: free
        await second.release(given)
    finally:
        await first.aclose()
        await second.aclose()


def test_url_options() -> None:
    target = parse_postgres_url(
        "postgres://u:pw@db:5433/runs?schema=mine&pgbouncer=1&sslmode=disable"
    )
    assert target.schema == "mine"
    assert target.pgbouncer
    assert target.dsn == "postgresql://u:pw@db:5433/runs?sslmode=disable"
    assert parse_postgres_url("postgresql://db/runs").schema == "statekernel"
    assert target.notify
    assert not parse_postgres_url("postgresql://db/runs?notify=0").notify
    assert "notify" not in parse_postgres_url("postgresql://db/runs?notify=1").dsn
    for bad in ("schema=Bad-Name", "schema=1x", "pgbouncer=maybe", "notify=2"):
        with pytest.raises(ConfigError) as caught:
            parse_postgres_url(f"postgresql://u:secret-pw-123@db/runs?{bad}")
        assert "secret-pw-123" not in str(caught.value)


async def test_an_unreachable_server_is_a_store_error_without_its_password() -> None:
    store = open_store("postgresql://user:secret-pw-456@127.0.0.1:1/none")
    try:
        with pytest.raises(StoreError) as caught:
            await store.load("x")
    finally:
        await store.aclose()
    assert "secret-pw-456" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)


async def test_pgbouncer_mode_and_a_pool_of_the_callers(postgres_store_url: str) -> None:
    target = parse_postgres_url(postgres_store_url)
    pool = await asyncpg.create_pool(target.dsn, min_size=1, max_size=2, statement_cache_size=0)
    try:
        store = PostgresStore(pool=pool, schema=target.schema, pgbouncer=True)
        run = sample_run("pooled")
        await store.commit(Checkpoint.between(None, run, events_for(run, 2, 0)))
        lease = await store.acquire("pooled", "owner", ttl=600)
        assert store._owners._conn is None  # no session lock behind PgBouncer
        await store.commit(Checkpoint.between(run, next_revision(run)), lease=lease)
        await store.release(lease)
        await store.aclose()
        assert not pool._closed  # the caller's pool stays open
        bouncer = open_store(f"{postgres_store_url}&pgbouncer=1")
        assert (await bouncer.load("pooled")).revision == 1
        assert len(await bouncer.events("pooled")) == 2
        await bouncer.aclose()
    finally:
        await pool.close()


async def test_a_store_collected_unclosed_warns_and_ends_its_sessions(
    postgres_store_url: str,
) -> None:
    store = PostgresStore(postgres_store_url)
    await store.list_runs()
    pool = store._pool
    assert pool is not None
    del store
    with pytest.warns(ResourceWarning, match="unclosed PostgresStore"):
        gc.collect()
    assert pool._closed


async def test_a_pool_of_one_connection_is_refused(postgres_store_url: str) -> None:
    """An owner's advisory lock would hold the only connection, and commits wait forever."""
    target = parse_postgres_url(postgres_store_url)
    pool = await asyncpg.create_pool(target.dsn, min_size=1, max_size=1)
    try:
        with pytest.raises(ConfigError, match="at least 2 connections, got 1"):
            PostgresStore(pool=pool, schema=target.schema)
    finally:
        await pool.close()


async def test_migrate_between_sqlite_and_postgres_both_ways(
    tmp_path: Path, postgres_store_url: str
) -> None:
    sqlite_url = f"sqlite:///{tmp_path}/runs.db"
    source = open_store(sqlite_url)
    chains = {}
    for run_id in ("alpha", "ünïcode-🌧️", "nul\x00id"):
        run = sample_run(run_id, turns=1)
        chain = [run]
        await source.commit(Checkpoint.between(None, run, events_for(run, 1, 0)))
        for i in range(5):
            nxt = next_revision(chain[-1])
            await source.commit(Checkpoint.between(chain[-1], nxt, events_for(nxt, 2, 1 + 2 * i)))
            chain.append(nxt)
        chains[run_id] = chain
    await source.aclose()
    assert await migrate(sqlite_url, postgres_store_url) == Migration(copied=3)
    back = f"sqlite:///{tmp_path}/back.db"
    assert await migrate(postgres_store_url, back) == Migration(copied=3)
    stores = [open_store(u) for u in (sqlite_url, postgres_store_url, back)]
    try:
        for run_id, chain in chains.items():
            for run in chain:
                for store in stores:
                    assert await store.load(run_id, revision=run.revision) == run
            events = [await store.events(run_id) for store in stores]
            assert events[0] == events[1] == events[2]
            assert len(events[0]) == 11
    finally:
        for store in stores:
            await store.aclose()
    assert await migrate(sqlite_url, postgres_store_url) == Migration(kept=3)


def test_the_migrate_command_copies_into_postgres(tmp_path: Path, postgres_store_url: str) -> None:
    sqlite_url = f"sqlite:///{tmp_path}/runs.db"

    async def fill() -> None:
        store = open_store(sqlite_url)
        await store.commit(Checkpoint.between(None, sample_run("by-cli")))
        await store.aclose()

    asyncio.run(fill())
    env = {**os.environ, "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-P", "-m", "statekernel", "migrate", sqlite_url, postgres_store_url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr

    async def check() -> None:
        store = open_store(postgres_store_url)
        assert (await store.load("by-cli")).run_id == "by-cli"
        await store.aclose()

    asyncio.run(check())


def test_notices_off_behind_pgbouncer_is_refused() -> None:
    with pytest.raises(ConfigError, match="notify=0 is a session setting"):
        parse_postgres_url("postgresql://db/runs?pgbouncer=1&notify=0")


async def test_a_client_with_notices_off_commits_without_a_notice(postgres_store_url: str) -> None:
    watched = open_store(postgres_store_url)
    quiet = open_store(f"{postgres_store_url}&notify=0")
    try:
        await watched.list_runs()  # the schema is created
        async with watch(watched) as feed:
            await quiet.commit(Checkpoint.between(None, sample_run("quiet")))
            await watched.commit(Checkpoint.between(None, sample_run("loud")))
            notice = await asyncio.wait_for(anext(feed), 120)
            assert notice.run_id == "loud"  # the quiet commit, made first, sent none
        assert (await quiet.load("quiet")).revision == 0
    finally:
        await quiet.aclose()
        await watched.aclose()


async def test_watches_of_one_store_share_one_connection(postgres_store_url: str) -> None:
    """Each watch holding a connection of its own would empty the pool (a parent waiting
    for each queued child holds a watch): commits then wait forever."""
    target = parse_postgres_url(postgres_store_url)
    pool = await asyncpg.create_pool(target.dsn, min_size=1, max_size=4)
    store = PostgresStore(pool=pool, schema=target.schema)
    try:
        await store.list_runs()
        async with contextlib.AsyncExitStack() as watches:
            feeds = [await watches.enter_async_context(store.watch(f"w{i}")) for i in range(3)]
            everything = await watches.enter_async_context(store.watch())
            assert pool.get_size() - pool.get_idle_size() == 1  # one connection listens
            await store.commit(Checkpoint.between(None, sample_run("w1")))
            assert (await asyncio.wait_for(anext(feeds[1]), 120)).run_id == "w1"
            assert (await asyncio.wait_for(anext(everything), 120)).run_id == "w1"
            assert feeds[0]._notices.empty()
            assert feeds[2]._notices.empty()
        assert pool.get_size() - pool.get_idle_size() == 0  # given back after the last
        async with store.watch("w2") as again:  # and taken again by the next
            await store.commit(Checkpoint.between(None, sample_run("w2")))
            assert (await asyncio.wait_for(anext(again), 120)).run_id == "w2"
    finally:
        await store.aclose()
        await pool.close()


async def test_a_watch_listens_again_after_its_session_ends_and_a_dead_connection(
    postgres_store_url: str,
) -> None:
    """The server ends the listening session, and the first connection the pool hands
    over is dead too (as after a restart): the watch keeps trying, typed, and its
    notices come again."""
    store = PostgresStore(postgres_store_url)
    target = parse_postgres_url(postgres_store_url)
    dead = await asyncpg.connect(target.dsn)
    await dead.close()
    try:
        async with store.watch("again") as feed:
            listening = store._listening
            assert listening is not None
            pid = listening._conn.get_server_pid()
            given = store._owner_conn
            handed: list[Any] = []

            async def owner_conn() -> Any:
                handed.append(dead if not handed else await given())
                return handed[-1]

            store._owner_conn = owner_conn  # type: ignore[method-assign]
            admin = await asyncpg.connect(target.dsn)
            try:
                await admin.execute("SELECT pg_terminate_backend($1)", pid)
            finally:
                await admin.close()
            run = sample_run("again")
            await store.commit(Checkpoint.between(None, run))
            got = None
            while got is None:  # commits until the session listening again sees one
                again = listening._again
                assert again is None or not again.done() or again.exception() is None
                later = next_revision(run)
                await store.commit(Checkpoint.between(run, later))
                run = later
                with contextlib.suppress(TimeoutError):
                    got = await asyncio.wait_for(anext(feed), 0.5)
            assert got.run_id == "again"
            assert len(handed) >= 2
    finally:
        await store.aclose()


async def test_a_listener_that_would_leave_no_connection_for_commits_is_refused(
    postgres_store_url: str,
) -> None:
    """A pool of 2 holds the owners' advisory locks and one connection for the rest: a
    queue listening on the second one would leave commits waiting forever."""
    target = parse_postgres_url(postgres_store_url)
    pool = await asyncpg.create_pool(target.dsn, min_size=1, max_size=3)
    store = PostgresStore(pool=pool, schema=target.schema)
    try:
        queue = store.run_queue("default")
        await queue.prepare()  # 3: the locks, this listener, the rest
        with pytest.raises(ConfigError, match="cannot hold one more that listens"):
            async with store.watch():
                pass
        await queue.aclose()
        async with store.watch():  # its connection is free again
            with pytest.raises(ConfigError, match="give the store a larger pool"):
                await store.run_queue("other").read("reader", 1, 0)
        await store.commit(Checkpoint.between(None, sample_run("roomy")))
    finally:
        await store.aclose()
        await pool.close()


async def test_a_watch_cancelled_again_while_it_ends_gives_its_connection_back(
    postgres_store_url: str, held_unlisten: HeldUnlisten
) -> None:
    """A task cancelled while it leaves a watch, and cancelled again meanwhile (a timeout
    around a cancelled delegate call): the listening connection still goes back to the
    pool, or it is lost to the store for good."""
    target = parse_postgres_url(postgres_store_url)
    pool = await asyncpg.create_pool(target.dsn, min_size=1, max_size=4)
    store = PostgresStore(pool=pool, schema=target.schema)
    entered = asyncio.Event()

    async def watching() -> None:
        async with store.watch("x"):
            entered.set()
            await asyncio.Event().wait()

    try:
        await store.list_runs()
        task = asyncio.create_task(watching())
        await entered.wait()
        task.cancel()
        await held_unlisten.removing.wait()
        task.cancel()  # again, while the watch ends
        held_unlisten.go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.get_size() - pool.get_idle_size() == 0
        assert store._listeners == 0
    finally:
        await store.aclose()
        pool.terminate()  # close() would wait for a connection never given back


@pytest.mark.filterwarnings("ignore:.*active notification listener")
async def test_a_watch_ends_even_when_its_connection_does_not_answer(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import statekernel.stores.postgres._listening as pg

    monkeypatch.setattr(pg, "STOP_WITHIN", 0.2, raising=False)
    store = PostgresStore(postgres_store_url)
    try:
        await store.commit(Checkpoint.between(None, sample_run("w")))
        async with store.watch():
            listening = store._listening
            assert listening is not None
            conn = listening._conn

            asked: list[str] = []

            async def never(self: Any, *args: Any) -> None:
                asked.append("unlisten")
                await asyncio.Event().wait()  # a connection that never answers

            monkeypatch.setattr(type(conn), "remove_listener", never)
        # the exit ended, though the connection never answered
        assert asked == ["unlisten"]
        assert store._listening is None
        monkeypatch.undo()
        assert (await store.load("w")).run_id == "w"  # the store goes on
    finally:
        await store.aclose()


async def test_closing_ends_though_a_connection_is_never_given_back(
    postgres_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graceful close of the pool waits for every connection to come back: one held
    by a task stuck on a dead server held ``aclose`` forever. It is cut after
    ``STOP_WITHIN``."""
    import statekernel.stores.postgres._listening as pg

    monkeypatch.setattr(pg, "STOP_WITHIN", 0.2, raising=False)
    store = PostgresStore(postgres_store_url)
    await store.commit(Checkpoint.between(None, sample_run("c")))
    pool = store._pool
    assert pool is not None
    held = await pool.acquire()  # never released
    await asyncio.wait_for(store.aclose(), 120)  # a hang fails here instead of forever
    assert pool.is_closing()
    with pytest.raises(asyncpg.InterfaceError):  # the held connection was cut
        await held.fetchval("SELECT 1")


async def test_a_reader_sees_who_holds_a_run_without_writing(postgres_store_url: str) -> None:
    """``holder`` reads the row's proof as a taker does, and writes nothing: a store
    opened read-only answers; a dead owner is named until a taker has found its lock
    free for the grace, as a taker would take the run only then."""
    store = PostgresStore(postgres_store_url)
    await store.commit(Checkpoint.between(None, sample_run("held")))
    reader = PostgresStore(postgres_store_url, read_only=True)
    dsn, schema = parse_postgres_url(postgres_store_url).dsn, _schema(postgres_store_url)
    holder, pid = await _holder(postgres_store_url, 600)
    try:
        assert await reader.holder("held") == "owner-elsewhere"
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
        await _gone(dsn, pid)
        assert await reader.holder("held") == "owner-elsewhere"  # nobody marked it yet
        assert pg_value(dsn, f'SELECT suspect FROM "{schema}".leases') is None
        with pytest.raises(RunBusy):  # a taker marks it
            await store.acquire("held", "owner-here", ttl=600)
        deadline = time.monotonic() + 60
        while await reader.holder("held") is not None:  # until the grace has passed
            assert time.monotonic() < deadline, "the dead owner was named for ever"
            await asyncio.sleep(0.05)
        lease = await store.acquire("held", "owner-here", ttl=600)  # as a taker finds
        await store.release(lease)
        with pytest.raises(RunNotFound):
            await reader.holder("missing")
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await reader.aclose()
        await store.aclose()
