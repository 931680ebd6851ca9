"""Redis writes wait for the replicas the URL asks for (``replicas``, ``replica_timeout``):
a commit, a lease taken or renewed that fewer replicas have in time is a ``StoreError``
(outcome unknown), and the store's next load of that run tells the outcome only once the
replicas have the commit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from statekernel._kernel.commit import Committer, Landed
from statekernel._records.run import Run
from statekernel.errors import ConfigError, RunBusy, StoreError
from statekernel.stores import Checkpoint, RedisStore
from statekernel.stores.redis._replicas import REPLICA_TIMEOUT_MS, ReplicaOptions, options_of
from statekernel.testing._store_cases import next_revision, sample_run

from .replication import Pair, cut_off, primary_with_replica, reconnect

pytestmark = pytest.mark.redis


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("replicas=-1", "replicas='-1'"),
        ("replicas=one", "replicas='one'"),
        ("replica_timeout=0", "replica_timeout='0'"),
        ("replica_timeout=1.5", "replica_timeout='1.5'"),
    ],
)
def test_a_bad_replica_option_is_a_config_error(query: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RedisStore(f"redis://127.0.0.1:1/0?{query}")


def test_replica_options_default_to_the_shards_replicas() -> None:
    assert options_of([]) == ReplicaOptions(None, REPLICA_TIMEOUT_MS)
    assert options_of([("replicas", "2"), ("replica_timeout", "250")]) == ReplicaOptions(2, 250)


@pytest.fixture
def pair(server_dir: Path, tmp_path: Path) -> Iterator[Pair]:
    """A redis-server of this test's own with a replica."""
    yield from primary_with_replica(tmp_path / "pair")


@pytest.fixture
async def store(pair: Pair) -> AsyncIterator[RedisStore]:
    """A store that waits for one replica (as long as by default: a loaded machine's
    replica acknowledges in time)."""
    s = RedisStore(f"{pair.url}?prefix=rp&replicas=1")
    yield s
    await s.aclose()


async def committed(store: RedisStore, revisions: int) -> list[Run]:
    chain = [sample_run("r")]
    await store.commit(Checkpoint.between(None, chain[0]))
    for _ in range(revisions):
        chain.append(next_revision(chain[-1]))
        await store.commit(Checkpoint.between(chain[-2], chain[-1]))
    return chain


async def test_a_commit_no_replica_has_is_not_acknowledged(pair: Pair, store: RedisStore) -> None:
    chain = await committed(store, 1)
    cut_off(pair.client)
    late = next_revision(chain[-1])
    with pytest.raises(StoreError, match="0 of 1 replicas") as cut:
        await store.commit(Checkpoint.between(chain[-1], late))
    assert "revision 2" in str(cut.value)
    with pytest.raises(StoreError, match="revision 2"):
        await store.load("r")  # the outcome cannot be told while no replica has it
    reconnect(pair.client)
    assert await store.load("r") == late  # confirmed on the replica: it landed
    after = next_revision(late)
    await store.commit(Checkpoint.between(late, after))
    assert (await store.load("r")).revision == 3


@pytest.mark.slow  # the committer tries again with backoff (seconds)
async def test_a_doubted_commit_is_never_settled_as_landed(pair: Pair, store: RedisStore) -> None:
    chain = await committed(store, 1)
    cut_off(pair.client)
    late = next_revision(chain[-1])
    impatient = RedisStore(f"{pair.url}?prefix=rp&replicas=1&replica_timeout=50")
    try:  # waits that all fall short: 50 ms each is enough
        landing = await Committer(impatient, None).commit(Checkpoint.between(chain[-1], late))
    finally:
        await impatient.aclose()
    assert not isinstance(landing, Landed), "settled as landed while no replica has it"
    assert isinstance(landing.error, StoreError)


async def test_a_lease_no_replica_has_is_not_handed_out(pair: Pair, store: RedisStore) -> None:
    await committed(store, 0)
    held = await store.acquire("r", "a", ttl=60)
    cut_off(pair.client)
    with pytest.raises(StoreError, match="renewal"):
        await store.renew(held, ttl=60)
    await store.release(held)
    with pytest.raises(StoreError, match="given back"):
        await store.acquire("r", "b", ttl=60)
    reconnect(pair.client)
    taken = await store.acquire("r", "c", ttl=60)  # no lease of "b" is left behind
    assert taken.generation > held.generation
    with pytest.raises(RunBusy):
        await store.acquire("r", "d", ttl=60)
