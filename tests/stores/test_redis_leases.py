"""Redis leases and fencing tokens: a commit under a lease that expired or moved on never
lands; a lease ends on the server's clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest

import statekernel as sk
from statekernel._storage.protocol import Checkpoint
from statekernel.errors import ConflictError, LeaseLost, RunBusy, StoreError
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
    async with sk.Kernel(store, providers={"scripted": ScriptedProvider([])}) as kernel:
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
        keys += [store._keys("cut")[0], store.run_key("cut", "taker"), store.run_key("cut", "last")]
        first = await store._acquire(keys=keys, args=["owner", 60_000, "nonce-1"])
        again = await store._acquire(keys=keys, args=["owner", 60_000, "nonce-1"])
        other = await store._acquire(keys=keys, args=["owner-2", 60_000, "nonce-2"])
        assert [first[0], again[0], other[0]] == [1, 1, 0]
        assert first[1] == again[1] == other[1]
        assert first[2] == again[2] == b""  # nobody's lease taken over
        await store.delete("cut")
        assert await store.client.exists(keys[3], keys[4]) == 0
    finally:
        await store.aclose()


async def test_a_last_token_no_longer_the_latest_tells_no_takeover(store: RedisStore) -> None:
    """The ``last`` key names the holder of an expired lease only while its token is the
    fence counter's latest: one left behind by a lease given by a client that does not
    keep it tells nothing; one that is the latest names its owner."""
    await started(store, "stale")
    client = store.client
    await client.set(store.run_key("stale", "fence"), 4)
    await client.set(store.run_key("stale", "last"), "3/gone")  # older than the counter
    lease = await store.acquire("stale", "me", ttl=60)
    assert (lease.generation, lease.taken_from) == (5, None)
    assert await client.get(store.run_key("stale", "last")) == b"5/me"
    await client.delete(store.run_key("stale", "lease"))  # as if it expired
    taken = await store.acquire("stale", "next", ttl=60)
    assert (taken.generation, taken.taken_from) == (6, "me")
    await client.set(store.run_key("stale", "last"), b"6/\xff")  # unreadable: no takeover
    await client.delete(store.run_key("stale", "lease"))
    assert (await store.acquire("stale", "third", ttl=60)).taken_from is None


class LostReply(RedisStore):
    """A real Redis store whose first creating script runs, then its reply is lost (the
    connection dropped before the answer)."""

    lost = 0

    async def _scripts(self, batch: list[Any]) -> list[Any]:
        outcomes = await super()._scripts(batch)
        if not self.lost and batch[0].lua is self._create:
            self.lost += 1
            return [StoreError("the connection dropped before the answer") for _ in outcomes]
        return outcomes


async def test_a_creation_whose_reply_was_lost_gets_the_lease_it_took(
    redis_store_url: str,
) -> None:
    store = LostReply(redis_store_url)
    try:
        run = sample_run("lost")
        lease = await store.create_leased(Checkpoint.between(None, run), "me", ttl=60)
        assert store.lost == 1
        assert lease is not None
        assert lease.generation == 1  # the lease the lost script took, not a second one
        assert await store.load("lost") == run
        with pytest.raises(RunBusy):
            await store.acquire("lost", "other", ttl=60)
        await store.release(lease)
    finally:
        await store.aclose()


async def test_a_creation_sent_again_never_hands_out_a_lease_it_did_not_take(
    redis_store_url: str,
) -> None:
    """Its id kept a lease another owner holds: the run is created without a lease, and
    the same script sent again (a resend after a cut) does not answer with that owner's
    token."""
    store = RedisStore(redis_store_url)
    try:
        client = store._client
        await client.set(store.run_key("kept", "lease"), "7/other", px=60_000)
        run = sample_run("kept")
        script, _ = store._commit_script(Checkpoint.between(None, run), None, store._create)
        keys = [store.run_key("kept", k) for k in ("lease", "fence", "taker")]
        script = attrs.evolve(
            script, keys=[*script.keys, *keys], args=[*script.args, "me", 60_000, "nonce"]
        )
        first = await store._group.submit(script)
        again = await store._group.submit(script)
        assert (first[0], first[3]) == (0, "")
        assert (again[0], again[1], again[3]) == (0, 1, "")
        assert await client.get(store.run_key("kept", "lease")) in (b"7/other", "7/other")
    finally:
        await store.aclose()
