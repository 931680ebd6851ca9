"""Redis leases and fencing tokens: a commit under a lease that expired or moved on never
lands; a lease ends on the server's clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import attrs
import pytest

import statekernel as sk
from statekernel._storage.protocol import Checkpoint
from statekernel.errors import ConflictError, LeaseLost, RunBusy
from statekernel.stores import RedisStore
from statekernel.testing import ScriptedProvider
from statekernel.testing._store_cases import sample_run

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
    first = await store.acquire("r1", "a", ttl=5)
    assert first.token.endswith("/a")
    with pytest.raises(RunBusy) as busy:
        await store.acquire("r1", "b", ttl=5)
    assert busy.value.owner == "a"
    with pytest.raises(RunBusy):
        await store.acquire("r1", "a", ttl=5)  # a lease is not re-entrant
    await store.release(first)
    second = await store.acquire("r1", "b", ttl=5)
    assert second.generation > first.generation
    await store.release(first)  # only the holder releases: nothing happens
    await store.renew(second, ttl=5)
    with pytest.raises(LeaseLost):
        await store.renew(first, ttl=5)


async def test_fenced_commit_lands_while_the_lease_is_held(store: RedisStore) -> None:
    run = await started(store)
    lease = await store.acquire("r1", "a", ttl=5)
    await store.commit(touched(run, "mine"), lease=lease)
    assert (await store.load("r1")).context == {"note": "mine"}


async def test_stale_holder_cannot_commit_after_its_lease_moved_on(store: RedisStore) -> None:
    run = await started(store)
    stale = await store.acquire("r1", "a", ttl=0.2)
    await asyncio.sleep(0.3)  # a stalls past its lease (on the server's clock); b takes over
    fresh = await store.acquire("r1", "b", ttl=5)
    # the revision still matches: only the fencing token stops the stale commit
    with pytest.raises(LeaseLost) as caught:
        await store.commit(touched(run, "stale"), lease=stale)
    assert isinstance(caught.value, ConflictError)
    assert caught.value.token == stale.token
    head = await store.load("r1")
    assert head.revision == run.revision
    assert head.context == {}
    await store.commit(touched(run, "fresh"), lease=fresh)
    assert (await store.load("r1")).context == {"note": "fresh"}


async def test_expired_lease_refuses_commits_even_if_nobody_took_over(store: RedisStore) -> None:
    run = await started(store)
    lease = await store.acquire("r1", "a", ttl=0.1)
    await asyncio.sleep(0.2)
    with pytest.raises(LeaseLost):
        await store.commit(touched(run, "late"), lease=lease)
    assert (await store.load("r1")).revision == run.revision


async def test_revision_conflicts_still_raise_conflict_error_under_a_lease(
    store: RedisStore,
) -> None:
    run = await started(store)
    lease = await store.acquire("r1", "a", ttl=5)
    await store.commit(touched(run, "one"), lease=lease)
    with pytest.raises(ConflictError) as caught:
        await store.commit(touched(run, "two"), lease=lease)
    assert not isinstance(caught.value, LeaseLost)


async def test_a_lease_of_another_run_does_not_fence_this_one(store: RedisStore) -> None:
    run = await started(store)
    await started(store, "other")
    lease = await store.acquire("other", "a", ttl=5)
    with pytest.raises(LeaseLost):
        await store.commit(touched(run, "x"), lease=lease)
    assert (await store.load("r1")).revision == run.revision


async def test_an_acquire_sent_again_after_a_cut_gets_the_lease_it_took(
    redis_store_url: str,
) -> None:
    """A script sent again after a cut connection may find the lease its first send took:
    with the same nonce it is given that lease, never ``RunBusy`` for its own owner; a
    call with another nonce is busy."""
    store = RedisStore(redis_store_url)
    try:
        await store.commit(Checkpoint.between(None, sample_run("cut")))
        keys = [store.run_key("cut", n) for n in ("lease", "fence")]
        keys += [store._keys("cut")[0], store.run_key("cut", "taker")]
        first = await store._acquire(keys=keys, args=["owner", 60_000, "nonce-1"])
        again = await store._acquire(keys=keys, args=["owner", 60_000, "nonce-1"])
        other = await store._acquire(keys=keys, args=["owner-2", 60_000, "nonce-2"])
        assert [first[0], again[0], other[0]] == [1, 1, 0]
        assert first[1] == again[1] == other[1]
        await store.delete("cut")
        assert await store.client.exists(keys[3]) == 0
    finally:
        await store.aclose()
