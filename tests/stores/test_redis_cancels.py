"""Redis cancel requests (``CancelsRuns``): the key beside the run's lease, read by every
commit script in the step that checks its lease and head; kept only while the head
whose state allowed it is still the run's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import attrs
import pytest

from statekernel._records.run import Cancellation, Run
from statekernel.errors import (
    CancelRequested,
    ConflictError,
    CorruptCheckpoint,
    InvalidTransition,
    LeaseLost,
    StoreError,
)
from statekernel.stores import Checkpoint, RedisStore
from statekernel.stores._format.cancels import encode_cancel
from statekernel.testing._store_cancels import check_cancels_runs
from statekernel.testing._store_cases import next_revision, sample_run

from .replication import Pair, cut_off, primary_with_replica, reconnect

pytestmark = pytest.mark.redis

ASKED = Cancellation("stop", "operator", datetime(2026, 5, 1, 12, 0, tzinfo=UTC))


@pytest.fixture
async def store(redis_store_url: str) -> AsyncIterator[RedisStore]:
    s = RedisStore(redis_store_url)
    yield s
    await s.aclose()


async def created(store: RedisStore, run_id: str) -> Run:
    run = sample_run(run_id)
    await store.commit(Checkpoint.between(None, run))
    return run


@pytest.mark.parametrize("where", ["redis_store_url", "redis_cluster_store_url"])
async def test_the_conformance_check_of_cancel_requests(
    where: str, request: pytest.FixtureRequest
) -> None:
    store = RedisStore(str(request.getfixturevalue(where)))
    try:
        await check_cancels_runs(store)
    finally:
        await store.aclose()


async def test_the_request_is_a_key_beside_the_lease(store: RedisStore) -> None:
    await created(store, "r")
    assert await store.request_cancel("r", ASKED) is None
    assert await store.client.get(store.run_key("r", "cancel")) == encode_cancel(ASKED)


async def test_a_refused_commit_is_no_doubt_and_checked_after_lease_and_head(
    store: RedisStore,
) -> None:
    run = await created(store, "r")
    lease = await store.acquire("r", "owner", ttl=60)
    assert await store.request_cancel("r", ASKED) is None
    nxt = next_revision(run)
    with pytest.raises(ConflictError):  # the head is checked first
        await store.commit(Checkpoint.between(nxt, next_revision(nxt)), lease=lease)
    await store.release(lease)
    with pytest.raises(LeaseLost):  # the lease too
        await store.commit(Checkpoint.between(run, nxt), lease=lease)
    with pytest.raises(CancelRequested) as refused:
        await store.commit(Checkpoint.between(run, nxt))
    assert (refused.value.reason, refused.value.by) == (ASKED.reason, ASKED.by)
    assert not store._replication._doubts  # a definite refusal: nothing written
    assert await store.load("r") == run
    assert await store.cancel_request("r") == ASKED


async def test_a_commit_that_landed_before_the_request_is_known_when_sent_again(
    store: RedisStore,
) -> None:
    """A script sent again after a cut connection knows its commit landed, though a
    request came meanwhile."""
    run = await created(store, "r")
    nxt = next_revision(run)
    script, _ = store._commit_script(
        Checkpoint.between(run, nxt), await store._prior("r", store._keys("r")[0]), store._script
    )
    assert (await store._group.submit(script))[:2] == (0, 0)
    assert await store.request_cancel("r", ASKED) is None
    assert (await store._group.submit(script))[:2] == (0, 1)
    assert await store.cancel_request("r") == ASKED


async def test_a_creation_drops_a_request_its_id_kept(store: RedisStore) -> None:
    """A key left under an id with no run (no request of any run of it) is deleted by
    the id's next creation, leased or not."""
    for run_id, leased in (("plain", False), ("leased", True)):
        await store.client.set(store.run_key(run_id, "cancel"), encode_cancel(ASKED))
        run = sample_run(run_id)
        if leased:
            assert await store.create_leased(Checkpoint.between(None, run), "o", ttl=60)
        else:
            await store.commit(Checkpoint.between(None, run))
        assert await store.cancel_request(run_id) is None
        await store.commit(Checkpoint.between(run, next_revision(run)))


async def test_deleting_a_run_deletes_its_request(store: RedisStore) -> None:
    await created(store, "r")
    assert await store.request_cancel("r", ASKED) is None
    assert await store.delete("r")
    assert await store.client.exists(store.run_key("r", "cancel")) == 0


async def test_a_head_changed_since_this_store_saw_it_is_checked_again(
    redis_store_url: str,
) -> None:
    """The store checks the state of the head it knows; another store's commit since
    then is found by the script, whose head is checked in turn."""
    mine, other = RedisStore(redis_store_url), RedisStore(redis_store_url)
    try:
        run = await created(mine, "r")  # known to ``mine`` as not at rest
        done = next_revision(run, state="completed")
        await other.commit(Checkpoint.between(run, done))
        with pytest.raises(InvalidTransition):
            await mine.request_cancel("r", ASKED)
        assert await mine.cancel_request("r") is None
        await mine.load("r")  # known as completed now
        back = next_revision(done, state="paused")
        await other.commit(Checkpoint.between(done, back))
        assert await mine.request_cancel("r", ASKED) is None
        assert await other.cancel_request("r") == ASKED
    finally:
        await mine.aclose()
        await other.aclose()


async def test_the_same_request_sent_again_is_kept_now(store: RedisStore) -> None:
    """A request found kept with the very bytes sent (the call's own, sent again after a
    cut connection) is not reported as one kept before; another is."""
    await created(store, "r")
    assert await store.request_cancel("r", ASKED) is None
    assert await store.request_cancel("r", ASKED) is None
    other = attrs.evolve(ASKED, reason="another")
    assert await store.request_cancel("r", other) == ASKED


async def test_a_damaged_request_refuses_commits_as_damage(store: RedisStore) -> None:
    run = await created(store, "r")
    await store.client.set(store.run_key("r", "cancel"), b"not a request")
    with pytest.raises(CorruptCheckpoint, match="cancel request"):
        await store.cancel_request("r")
    with pytest.raises(CorruptCheckpoint, match="cancel request"):
        await store.commit(Checkpoint.between(run, next_revision(run)))
    assert await store.load("r") == run
    carried = attrs.evolve(Checkpoint.between(run, next_revision(run)), cancels=True)
    await store.commit(carried)  # the cancellation lands, and takes it away
    assert await store.client.exists(store.run_key("r", "cancel")) == 0


@pytest.fixture
def pair(server_dir: Path, tmp_path: Path) -> Iterator[Pair]:
    """A redis-server of this test's own with a replica."""
    yield from primary_with_replica(tmp_path / "pair")


async def test_a_request_no_replica_has_is_not_acknowledged(pair: Pair) -> None:
    store = RedisStore(f"{pair.url}?prefix=rc&replicas=1")
    try:
        await created(store, "r")
        cut_off(pair.client)
        with pytest.raises(StoreError, match="cancel request of run 'r'"):
            await store.request_cancel("r", ASKED)
        reconnect(pair.client)
        assert await store.cancel_request("r") == ASKED  # kept on the primary
    finally:
        await store.aclose()
