"""A run's fencing tokens only grow, whatever happens to its lease record: ``migrate``
carries them between every pair of stores, a PostgreSQL lease row lost or deleted never
hands out a token a commit has carried, and a Redis fence counter never expires."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest

from statekernel.stores import Checkpoint, KeepsFences, RedisStore, migrate, open_store
from statekernel.stores.postgres._url import parse_postgres_url
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
