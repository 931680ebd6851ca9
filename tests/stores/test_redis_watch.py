"""The Redis store's commit feed outlives a server that stays unreachable for a while:
it subscribes again until it can, and its notices come again afterwards."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from statekernel._storage.watching import Feed
from statekernel.stores import Checkpoint, CommitNotice, RedisStore, open_store
from statekernel.testing._store_cases import next_revision, sample_run

from .conftest import free_port

pytestmark = pytest.mark.redis


class _Lost:
    """A subscription whose connection is lost at its first read."""

    async def get_message(self, **_: Any) -> Any:
        raise RedisConnectionError("connection lost")

    async def aclose(self) -> None:
        """Nothing to close."""


async def test_the_feed_subscribes_again_until_the_server_answers(redis_store_url: str) -> None:
    store = open_store(redis_store_url)
    assert isinstance(store, RedisStore)
    down = aioredis.from_url(f"redis://127.0.0.1:{free_port()}")  # nobody listens there
    real = store._client.pubsub
    made: list[Any] = []

    def pubsub(**options: Any) -> Any:  # the first new subscription finds no server
        made.append(down.pubsub(**options) if not made else real(**options))
        return made[-1]

    store._client.pubsub = pubsub  # type: ignore[method-assign]
    feed = Feed("fed")
    task = asyncio.create_task(store._receive(_Lost(), feed))
    try:
        run = sample_run("fed")
        await store.commit(Checkpoint.between(None, run))
        got: CommitNotice | None = None
        while got is None:  # commits until the subscription is back and one is seen
            assert not task.done(), task.exception()
            run_next = next_revision(run)
            await store.commit(Checkpoint.between(run, run_next))
            run = run_next
            try:
                got = await asyncio.wait_for(anext(feed), 0.5)
            except TimeoutError:
                continue
        assert got.run_id == "fed"
        assert len(made) >= 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await down.aclose()
        await store.aclose()
