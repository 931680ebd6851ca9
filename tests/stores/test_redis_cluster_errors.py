"""A Redis Cluster that cannot be reached raises ``StoreError`` naming the store (its URL
redacted) from every call, never ``redis-py``'s untyped ``RedisClusterException``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from redis.exceptions import RedisClusterException

import statekernel as sk
from statekernel.errors import StoreError
from statekernel.stores import Checkpoint, RedisStore, redact_url
from statekernel.testing import ScriptedProvider
from statekernel.testing._servers import free_port
from statekernel.testing._store_cases import sample_run

from .replication import skip_without_cluster_support

skip_without_cluster_support()

PASSWORD = "seed-PASS-5c1e"

Call = Callable[[RedisStore], Awaitable[object]]


async def watched(store: RedisStore) -> None:
    """Enter the store's watch feed."""
    async with store.watch():
        pass


CALLS: dict[str, Call] = {
    "load": lambda s: s.load("r"),
    "list_runs": lambda s: s.list_runs(),
    "events": lambda s: s.events("r"),
    "commit": lambda s: s.commit(Checkpoint.between(None, sample_run("r"))),
    "acquire": lambda s: s.acquire("r", "a", ttl=5),
    "delete": lambda s: s.delete("r"),
    "submit": lambda s: s.run_queue("default").submit("r"),
    "watch": watched,
}


def down_url() -> str:
    """A cluster store URL with a password whose seed node is not listening."""
    return f"redis://:{PASSWORD}@127.0.0.1:{free_port()}?cluster=1&prefix=down"


def assert_names_the_store(error: StoreError, url: str) -> None:
    text = str(error)
    assert redact_url(url) in text, text
    assert PASSWORD not in text, text
    assert isinstance(error.__cause__, RedisClusterException), repr(error.__cause__)


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_a_cluster_whose_seed_node_is_down_is_a_store_error(name: str) -> None:
    url = down_url()
    store = RedisStore(url)
    try:
        with pytest.raises(StoreError) as caught:
            await CALLS[name](store)
    finally:
        await store.aclose()
    if name != "submit":  # a run queue names its queue, not the store
        assert_names_the_store(caught.value, url)
    assert PASSWORD not in str(caught.value)


async def test_a_kernel_on_a_cluster_whose_seed_node_is_down_raises_store_errors() -> None:
    url = down_url()
    async with sk.Kernel(url, providers={"scripted": ScriptedProvider([])}) as kernel:
        with pytest.raises(StoreError) as got:
            await kernel.get("r")
        assert_names_the_store(got.value, url)
        with pytest.raises(StoreError) as started:  # after the committer's retries
            await kernel.start(model="scripted/x", messages=["hi"], run_id="r")
        assert_names_the_store(started.value, url)
