"""Tags on every store: the conformance check of tags (``check_store`` runs it too), the
index the SQL stores read a listing by tags from, and upgrades of older layouts."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import attrs
import pytest
import redis

import statekernel as sk
from statekernel.stores import Checkpoint, PostgresStore, RedisStore, SQLiteStore, open_store
from statekernel.stores.postgres._schema import STORE_VERSION as POSTGRES_VERSION
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.stores.sqlite._schema import STORE_VERSION as SQLITE_VERSION
from statekernel.testing import ScriptedProvider
from statekernel.testing._store_cases import sample_run
from statekernel.testing._store_tags import check_tags


async def test_listing_by_tags_on_every_store(every_store_url: str) -> None:
    store = open_store(every_store_url)
    try:
        await check_tags(store)
    finally:
        await store.aclose()


async def _kernel_tags(url: str, run_id: str) -> list[str]:
    """Tag the run through a kernel on ``url``; the runs then listed by that tag."""
    providers: Any = {"scripted": ScriptedProvider([])}
    async with sk.Kernel(url, providers=providers) as kernel:
        await kernel.update_tags(run_id, {"after": "upgrade"}, expected_revision=0)
        page = await kernel.store.list_runs(tags={"after": "upgrade"})
        return [s.run_id for s in page.runs]


async def test_a_sqlite_store_of_layout_6_is_read_as_it_is_and_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    old, other = sample_run("old"), sample_run("other")
    for run in (old, other):
        await store.commit(Checkpoint.between(None, run))
    await store.aclose()
    with sqlite3.connect(path) as conn:  # as the release before tags left it
        conn.execute("DROP TABLE run_tags")
        conn.execute("UPDATE statekernel_schema SET version = 6")
    conn.close()
    reader = SQLiteStore(f"sqlite:///{path}", read_only=True)
    try:  # read as it is: its runs, and no run with tags
        assert await reader.load("old") == old
        assert {s.run_id for s in (await reader.list_runs()).runs} == {"old", "other"}
        assert (await reader.list_runs(tags={"team": "a"})).runs == ()
    finally:
        await reader.aclose()
    assert await _kernel_tags(f"sqlite:///{path}", "old") == ["old"]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM statekernel_schema").fetchall() == [
            (SQLITE_VERSION,)
        ]
        assert conn.execute("SELECT key, value FROM run_tags").fetchall() == [("after", "upgrade")]
    conn.close()
    upgraded = SQLiteStore(f"sqlite:///{path}", read_only=True)
    try:
        assert (await upgraded.load("other")) == other
        assert (await upgraded.load("old")).tags == {"after": "upgrade"}
    finally:
        await upgraded.aclose()


async def test_a_sqlite_listing_by_tags_reads_the_index(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        await store.commit(Checkpoint.between(None, attrs.evolve(sample_run("r"), tags={"k": "v"})))
    finally:
        await store.aclose()
    with sqlite3.connect(path) as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT rid FROM run_tags WHERE key = 'k' AND value = 'v'"
        ).fetchall()
    conn.close()
    assert "run_tags_by_pair" in str(plan), plan


async def test_a_damaged_sqlite_tag_row_is_named_not_listed(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        await store.commit(Checkpoint.between(None, sample_run("plain")))
        with sqlite3.connect(path) as conn:  # an index row the head does not back
            conn.execute("INSERT INTO run_tags (rid, key, value) SELECT id, 'k', 'v' FROM runs")
        conn.close()
        page = await store.list_runs(tags={"k": "v"})
        assert page.runs == ()
        assert [d.run_id for d in page.damaged] == ["plain"]
        assert "run_tags" in page.damaged[0].problem
    finally:
        await store.aclose()


@pytest.mark.postgres
async def test_a_postgres_store_of_layout_7_is_read_as_it_is_and_upgraded(
    postgres_store_url: str,
) -> None:
    first = PostgresStore(postgres_store_url)
    old, other = sample_run("old"), sample_run("other")
    try:
        for run in (old, other):
            await first.commit(Checkpoint.between(None, run))
    finally:
        await first.aclose()
    schema = f'"{parse_postgres_url(postgres_store_url).schema}"'
    conn = await asyncpg.connect(parse_postgres_url(postgres_store_url).dsn)
    try:  # as the release before tags left it
        await conn.execute(f"DROP TABLE {schema}.run_tags")
        await conn.execute(f"UPDATE {schema}.statekernel_schema SET version = 7")
    finally:
        await conn.close()
    reader = PostgresStore(postgres_store_url, read_only=True)
    try:
        assert await reader.load("old") == old
        assert {s.run_id for s in (await reader.list_runs()).runs} == {"old", "other"}
        assert (await reader.list_runs(tags={"team": "a"})).runs == ()
    finally:
        await reader.aclose()
    assert await _kernel_tags(postgres_store_url, "old") == ["old"]
    conn = await asyncpg.connect(parse_postgres_url(postgres_store_url).dsn)
    try:
        version = await conn.fetchval(f"SELECT version FROM {schema}.statekernel_schema")
        await conn.execute("SET enable_seqscan = off")  # a few rows: show the index it has
        plan = await conn.fetch(
            f"EXPLAIN SELECT rid FROM {schema}.run_tags WHERE key = 'k' AND value = 'v'"
        )
    finally:
        await conn.close()
    assert version == POSTGRES_VERSION >= 8
    again = PostgresStore(postgres_store_url)
    try:
        assert await again.load("other") == other
        assert (await again.load("old")).tags == {"after": "upgrade"}
    finally:
        await again.aclose()
    assert "run_tags_by_pair" in str(plan), plan


@pytest.mark.redis
async def test_redis_tag_sets_are_repaired_after_a_writer_died_and_left_on_delete(
    redis_store_url: str, redis_prefix: str, redis_url: str
) -> None:
    """A writer killed between its commit and its index move left only the commit's
    announcement: a listing by tags repairs the run into its tags' sets from its head. A
    deletion takes the run out of them."""
    writer = open_store(redis_store_url)
    assert isinstance(writer, RedisStore)
    tagged = attrs.evolve(sample_run("r"), tags={"team": "a"})
    await writer.commit(Checkpoint.between(None, tagged))
    writer._runs._landed.clear()  # its index move never sent: as if killed here
    await writer.aclose()
    client = redis.Redis.from_url(f"{redis_url}/0")
    try:
        assert client.smembers(f"{redis_prefix}:tag:team=a") == set()
        reader = open_store(redis_store_url)
        try:
            page = await reader.list_runs(tags={"team": "a"})
            assert [s.run_id for s in page.runs] == ["r"]
            assert client.smembers(f"{redis_prefix}:tag:team=a") == {b"r"}
            assert await reader.delete("r")
            assert client.smembers(f"{redis_prefix}:tag:team=a") == set()
        finally:
            await reader.aclose()
    finally:
        client.close()
