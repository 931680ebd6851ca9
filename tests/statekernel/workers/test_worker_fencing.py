"""Leases and fencing tokens: a commit under a lease that expired or moved on never lands."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import attrs
import pytest

import statekernel as sk
from statekernel._storage.protocol import Checkpoint
from statekernel._workers.lease import Lease, LeasedStore, Leases
from statekernel.errors import ConfigError, ConflictError, LeaseLost
from statekernel.stores import RedisStore
from statekernel.testing import ScriptedProvider

pytestmark = pytest.mark.redis


@pytest.fixture
async def store(redis_store_url: str) -> AsyncIterator[RedisStore]:
    s = RedisStore(redis_store_url)
    yield s
    await s.aclose()


async def started(store: RedisStore, run_id: str = "r1") -> sk.Run:
    kernel = sk.Kernel(store, providers={"scripted": ScriptedProvider([])})
    return await kernel.start(model="scripted/x", messages=["hi"], run_id=run_id)


def touched(run: sk.Run, note: str) -> Checkpoint:
    """A data-only commit on top of ``run`` (what update_context does)."""
    nxt = attrs.evolve(run, revision=run.revision + 1, context={"note": note})
    return Checkpoint.between(run, nxt)


async def test_tokens_grow_and_a_held_lease_is_exclusive(store: RedisStore) -> None:
    await started(store)
    a, b = Leases(store, "a", ttl=5), Leases(store, "b", ttl=5)
    first = await a.acquire("r1")
    assert first is not None
    assert first.token.endswith("/a")
    assert await b.acquire("r1") is None
    assert await a.acquire("r1") is None, "a lease is not re-entrant"
    assert await a.release(first)
    second = await b.acquire("r1")
    assert second is not None
    assert int(second.token.split("/")[0]) > int(first.token.split("/")[0])
    assert not await a.release(first), "only the holder releases"
    assert await b.renew([second, first]) == [True, False]


async def test_fenced_commit_lands_while_the_lease_is_held(store: RedisStore) -> None:
    run = await started(store)
    lease = await Leases(store, "a", ttl=5).acquire("r1")
    assert lease is not None
    await store.commit(touched(run, "mine"), fence=lease.fence)
    assert (await store.load("r1")).context == {"note": "mine"}


async def test_stale_holder_cannot_commit_after_its_lease_moved_on(store: RedisStore) -> None:
    run = await started(store)
    a, b = Leases(store, "a", ttl=0.2), Leases(store, "b", ttl=5)
    stale = await a.acquire("r1")
    assert stale is not None
    await asyncio.sleep(0.3)  # a stalls past its lease; b takes the run over
    fresh = await b.acquire("r1")
    assert fresh is not None
    # the revision still matches: only the fencing token stops the stale commit
    with pytest.raises(LeaseLost) as caught:
        await store.commit(touched(run, "stale"), fence=stale.fence)
    assert isinstance(caught.value, ConflictError)
    assert caught.value.token == stale.token
    head = await store.load("r1")
    assert head.revision == run.revision
    assert head.context == {}
    await store.commit(touched(run, "fresh"), fence=fresh.fence)
    assert (await store.load("r1")).context == {"note": "fresh"}


async def test_expired_lease_refuses_commits_even_if_nobody_took_over(store: RedisStore) -> None:
    run = await started(store)
    lease = await Leases(store, "a", ttl=0.1).acquire("r1")
    assert lease is not None
    await asyncio.sleep(0.2)
    with pytest.raises(LeaseLost):
        await store.commit(touched(run, "late"), fence=lease.fence)
    assert (await store.load("r1")).revision == run.revision


async def test_revision_conflicts_still_raise_conflict_error_under_a_lease(
    store: RedisStore,
) -> None:
    run = await started(store)
    lease = await Leases(store, "a", ttl=5).acquire("r1")
    assert lease is not None
    await store.commit(touched(run, "one"), fence=lease.fence)
    with pytest.raises(ConflictError) as caught:
        await store.commit(touched(run, "two"), fence=lease.fence)
    assert not isinstance(caught.value, LeaseLost)


async def test_fence_must_be_a_key_of_the_run(store: RedisStore) -> None:
    run = await started(store)
    await started(store, "other")
    lease = await Leases(store, "a", ttl=5).acquire("other")
    assert lease is not None
    with pytest.raises(ConfigError):
        await store.commit(touched(run, "x"), fence=lease.fence)


async def test_kernel_on_a_leased_store_stops_with_lease_lost(store: RedisStore) -> None:
    await started(store)
    held: dict[str, Lease] = {}
    kernel = sk.Kernel(LeasedStore(store, held), providers={"scripted": ScriptedProvider(["done"])})
    with pytest.raises(LeaseLost):  # no lease at all: refused before reaching Redis
        await kernel.step("r1")
    a, b = Leases(store, "a", ttl=0.2), Leases(store, "b", ttl=5)
    lease = await a.acquire("r1")
    assert lease is not None
    held["r1"] = lease
    await kernel.step("r1")  # start, turn_prepared, model_started
    await asyncio.sleep(0.3)
    assert await b.acquire("r1") is not None
    before = await store.load("r1")
    with pytest.raises(LeaseLost):
        await kernel.step("r1")  # the model's answer never lands
    after = await store.load("r1")
    assert (after.revision, after.state) == (before.revision, before.state)
    await kernel.aclose()
