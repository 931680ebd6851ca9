"""The live events of a Redis store's runs (``statekernel._storage.live``): published on
a pub/sub channel of the run, ``<prefix>:live:<run id>``. Pub/sub keeps nothing: a
reader gets what is sent while it is subscribed, and nothing is left on the server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from statekernel._secrets import logger
from statekernel._storage.live import carries_live
from statekernel.stores._common import checked_run_id
from statekernel.stores.redis._store import RedisStore
from statekernel.stores.redis._wire import FAILURES, initialized

__all__ = ["RedisLive"]

log = logger("statekernel.stores")


class RedisLive:
    """Carries the live events of ``store``'s runs on pub/sub."""

    limit: int | None = None

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    def channel(self, run_id: str) -> str:
        """The pub/sub channel of ``run_id``'s live events."""
        return f"{self.store.prefix}:live:{run_id}"

    async def send(self, run_id: str, payloads: list[str]) -> None:
        """Publish ``payloads`` on the run's channel."""
        client: Any = self.store.client
        for payload in payloads:
            await self.store._call(client.publish(self.channel(run_id), payload))

    @contextlib.asynccontextmanager
    async def subscribe(self, run_id: str, put: Callable[[str], None]) -> AsyncIterator[None]:
        """Subscribe to the run's channel (again after a lost connection: what was sent
        meanwhile is missed); each payload received goes to ``put``."""
        checked_run_id(run_id)
        channel = self.channel(run_id)
        pubsub = await self.store._call(self._subscribed(channel))
        task = asyncio.create_task(self._receive(pubsub, channel, put))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _subscribed(self, channel: str) -> Any:
        client: Any = self.store.client
        await initialized(client)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
        except BaseException:
            with contextlib.suppress(*FAILURES):
                await pubsub.aclose()
            raise
        return pubsub

    async def _receive(self, pubsub: Any, channel: str, put: Callable[[str], None]) -> None:
        try:
            while True:
                try:
                    message = await pubsub.get_message(timeout=None)
                except FAILURES as exc:
                    log.warning("live events of %r: %s; subscribing again", self.store, exc)
                    with contextlib.suppress(*FAILURES):
                        await pubsub.aclose()
                    pubsub = None
                    pubsub = await self._again(channel)
                    continue
                if isinstance(message, dict) and message.get("type") == "message":
                    data = message.get("data")
                    put(data.decode("ascii", "replace") if isinstance(data, bytes) else str(data))
        finally:
            if pubsub is not None:
                with contextlib.suppress(*FAILURES):
                    await pubsub.aclose()

    async def _again(self, channel: str) -> Any:
        delay = 0.1
        while True:
            await asyncio.sleep(delay)
            try:
                return await self._subscribed(channel)
            except FAILURES as exc:
                log.warning("live events of %r: %s; subscribing again", self.store, exc)
                delay = min(delay * 2, 5.0)


carries_live(RedisStore, RedisLive)
