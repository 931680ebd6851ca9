"""Redis group commit: commits ready together share one round trip, an outcome each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from statekernel.errors import ConflictError, StoreError
from statekernel.stores import Checkpoint, RedisStore
from statekernel.stores.redis._wire import Command, Wire
from statekernel.testing._store_cases import next_revision, sample_run

pytestmark = pytest.mark.redis


class CountedWire(Wire):
    """A wire that counts its round trips and can break one command's reply."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.trips: list[int] = []
        self.broken: str | None = None  # the run whose commit script gets an error reply

    async def round_trip(self, commands: Any) -> list[Any]:
        self.trips.append(len(commands))
        sent: list[Command] = [
            ("EVAL", "return redis.error_reply('broken')", 0)
            if self.broken is not None and c[0] == "EVALSHA" and self.broken in str(c[4])
            else c
            for c in commands
        ]
        return await super().round_trip(sent)


async def test_commits_ready_together_share_one_round_trip(redis_store_url: str) -> None:
    store = RedisStore(f"{redis_store_url}?prefix=group-trip")
    wire = CountedWire(store.client)
    store._wire = store._runs.wire = store._replication.wire = wire
    runs = [sample_run(f"g{i}") for i in range(12)]
    await asyncio.gather(*(store.commit(Checkpoint.between(None, r)) for r in runs))
    assert wire.trips[0] == 24, wire.trips  # 12 announcements and scripts in one trip
    assert len(wire.trips) <= 2, wire.trips  # sent again once if the script was not loaded
    await store.client.script_flush()  # the server forgets the commit script
    wire.trips.clear()
    wire.broken = "g3"
    stale = next_revision(runs[5], context={"stale": True})
    nexts = [next_revision(r) for r in runs]
    results = await asyncio.gather(
        *(store.commit(Checkpoint.between(r, n)) for r, n in zip(runs, nexts, strict=True)),
        store.commit(Checkpoint.between(runs[5], stale)),
        return_exceptions=True,
    )
    assert isinstance(results[3], StoreError), results[3]
    assert isinstance(results[-1], ConflictError), results[-1]
    assert [i for i, r in enumerate(results) if r is not None] == [3, 12], results
    assert len(wire.trips) == 2, wire.trips  # the batch, then the scripts the server lost
    for i, run in enumerate(nexts):
        assert await store.load(run.run_id) == (runs[3] if i == 3 else run)
    await store.aclose()
