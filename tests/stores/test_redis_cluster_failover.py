"""A Redis Cluster failover rolls back no acknowledged commit and hands out no fencing
token smaller than one given before: writes wait for a replica (``WAIT``).

Each test cuts the replica of a run's shard off (its primary goes on taking writes that
the replica never gets), writes, then promotes that replica (``CLUSTER FAILOVER
TAKEOVER``): what the old primary alone had is gone. Whatever the store acknowledged
must still be there.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from statekernel._records.run import Run
from statekernel.errors import StoreError
from statekernel.stores import Checkpoint, RedisStore
from statekernel.testing._store_cases import next_revision, sample_run

from .replication import (
    Cluster,
    cut_off,
    reconnect,
    replicated_cluster,
    skip_without_cluster_support,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]
skip_without_cluster_support()


@pytest.fixture
def cluster(server_dir: Path, tmp_path: Path) -> Iterator[Cluster]:
    """A Redis Cluster of this test's own, three primaries with a replica each."""
    yield from replicated_cluster(tmp_path / "cluster")


@pytest.fixture
async def store(cluster: Cluster) -> AsyncIterator[RedisStore]:
    """A store on the cluster with the default replica options (it finds the replicas)."""
    s = RedisStore(f"{cluster.url}&prefix=fo")
    yield s
    await s.aclose()


async def acknowledged(store: RedisStore, before: Run | None, run: Run) -> bool:
    """Whether the store acknowledged the commit of ``run`` (a ``StoreError``: its
    outcome is unknown, not acknowledged)."""
    try:
        await store.commit(Checkpoint.between(before, run))
    except StoreError:
        return False
    return True


async def test_a_failover_rolls_back_no_acknowledged_commit(
    cluster: Cluster, store: RedisStore
) -> None:
    chain = [sample_run("r")]
    assert await acknowledged(store, None, chain[0])
    for _ in range(2):
        chain.append(next_revision(chain[-1]))
        assert await acknowledged(store, chain[-2], chain[-1])
    primary, replica = cluster.shard_of(store.run_key("r", "head"))
    cut_off(cluster.client(primary))
    late = next_revision(chain[-1])
    done = [c.revision for c in chain]
    if await acknowledged(store, chain[-1], late):
        done.append(late.revision)
    cluster.take_over(replica, primary)
    fresh = RedisStore(f"{cluster.url}&prefix=fo")
    try:
        found = (await fresh.load("r")).revision
    finally:
        await fresh.aclose()
    assert found >= max(done), f"acknowledged revisions {done}, revision {found} survived"
    head = await store.load("r")  # the store that doubted revision 3 finds it gone
    assert head.revision == 2
    assert await acknowledged(store, head, next_revision(head))
    assert (await store.load("r")).revision == 3


async def test_a_failover_hands_out_no_smaller_fencing_token(
    cluster: Cluster, store: RedisStore
) -> None:
    await store.commit(Checkpoint.between(None, sample_run("t")))
    lease = await store.acquire("t", "a", ttl=60)
    given = [lease.generation]
    await store.release(lease)
    primary, replica = cluster.shard_of(store.run_key("t", "lease"))
    reconnect(cluster.client(primary))  # the release is on the replica too
    cut_off(cluster.client(primary))
    with contextlib.suppress(StoreError):  # not handed out: no replica has it
        given.append((await store.acquire("t", "b", ttl=60)).generation)
    cluster.take_over(replica, primary)
    after = await store.acquire("t", "c", ttl=60)
    assert after.generation > max(given), f"tokens given {given}, then {after.generation}"
