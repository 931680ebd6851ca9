"""PostgreSQL commit notices only while a store watches (layout 5): a commit no store
watches sends none (a notifying commit waits, fsync included, for every other notifying
commit of the server), and a watch, once entered, misses no commit, also one whose
trigger ran before the watch began."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest

from statekernel.stores import Checkpoint, PostgresStore
from statekernel.stores.postgres._keys import lock_key, lock_parts
from statekernel.stores.postgres._schema import COMMITTING, commits_channel
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.testing._store_cases import next_revision, sample_run

pytestmark = pytest.mark.postgres


def _dsn(store: PostgresStore) -> str:
    """What asyncpg connects to for the store's URL (its own options taken out)."""
    assert store.url is not None
    return parse_postgres_url(store.url).dsn


async def _until(check: Any, what: str) -> None:
    """Return once the coroutine ``check()`` is true; fail naming ``what`` after 60 s."""
    deadline = time.monotonic() + 60
    while not await check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.02)


async def test_a_commit_no_store_watches_sends_no_notice(postgres_store_url: str) -> None:
    store = PostgresStore(postgres_store_url)
    raw = await asyncpg.connect(_dsn(store))
    heard: asyncio.Queue[str] = asyncio.Queue()
    try:
        # a bare listener: it hears what is sent, and is no watching store
        await raw.add_listener(commits_channel(store.schema), lambda *a: heard.put_nowait(a[3]))
        first = sample_run("quiet")
        await store.commit(Checkpoint.between(None, first))  # nobody watches: no notice
        second = next_revision(first)
        async with store.watch("quiet") as feed:
            await store.commit(Checkpoint.between(first, second))  # watched: a notice
            notice = await asyncio.wait_for(anext(feed), 60)
            assert notice.revision == 1
        # notices arrive in commit order: the first one the bare listener hears is the
        # watched commit's, so the commit before it sent none
        assert (await asyncio.wait_for(heard.get(), 60)).startswith("1 ")
        third = next_revision(second)
        await store.commit(Checkpoint.between(second, third))  # the watch ended: none
        async with store.watch("quiet") as feed:
            await store.commit(Checkpoint.between(third, next_revision(third)))
            assert (await asyncio.wait_for(anext(feed), 60)).revision == 3
        assert (await asyncio.wait_for(heard.get(), 60)).startswith("3 ")
    finally:
        await raw.close()
        await store.aclose()


async def test_a_watch_begins_after_the_commits_that_found_no_watcher(
    postgres_store_url: str,
) -> None:
    store = PostgresStore(postgres_store_url)
    run = sample_run("racing")
    await store.commit(Checkpoint.between(None, run))
    writer = await asyncpg.connect(_dsn(store))
    probe = await asyncpg.connect(_dsn(store))
    classid, objid = lock_parts(lock_key(COMMITTING, store.schema))

    async def watch_waits() -> bool:
        waiting = await probe.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = $1 AND objid = $2",
            classid,
            objid,
        )
        return bool(waiting)

    entered = asyncio.Event()
    leave = asyncio.Event()

    async def watching() -> None:
        async with store.watch("racing"):
            entered.set()
            await leave.wait()

    try:
        tx = writer.transaction()
        await tx.start()
        # a commit in flight whose notice trigger ran while nobody watched
        await writer.execute(
            f'UPDATE "{store.schema}".runs SET revision = revision WHERE run_id = $1', b"racing"
        )
        task = asyncio.create_task(watching())
        await _until(watch_waits, "the watch waits for the commit in flight")
        assert not entered.is_set(), "the watch began before a commit that found no watcher"
        await tx.commit()
        await asyncio.wait_for(entered.wait(), 60)
        leave.set()
        await task
    finally:
        await writer.close()
        await probe.close()
        await store.aclose()
