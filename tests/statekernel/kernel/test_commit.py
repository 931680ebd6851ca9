"""``Committer.land``: ``undo`` exactly when the commit did not land, on every way out."""

from __future__ import annotations

import asyncio

import pytest

from statekernel._kernel.commit import Committer
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, StoreWrapper
from statekernel.errors import StoreError
from statekernel.stores import MemoryStore
from statekernel.testing._store_cases import next_revision, sample_run


class FailingStore(StoreWrapper):
    """Every commit fails in the store without landing."""

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        raise StoreError("the store is down")


class SlowStore(StoreWrapper):
    """Commits land after ``delay`` seconds (a store that does not settle on cancel)."""

    def __init__(self, inner: CheckpointStore, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        await asyncio.sleep(self.delay)
        await self.inner.commit(checkpoint, lease=lease)


async def _first(store: CheckpointStore) -> Checkpoint:
    run = sample_run("c")
    await store.commit(Checkpoint.between(None, run))
    return Checkpoint.between(run, next_revision(run))


async def test_a_cancellation_during_the_pause_between_attempts_undoes() -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    undone: list[bool] = []
    committer = Committer(FailingStore(inner), None)
    task = asyncio.ensure_future(committer.land(checkpoint, lambda: undone.append(True)))
    await asyncio.sleep(0.02)  # the first attempt failed; the pause before the second runs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert undone == [True]
    assert (await inner.load("c")).revision == 0


async def test_every_attempt_failing_undoes_once_and_raises() -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    undone: list[bool] = []
    committer = Committer(FailingStore(inner), None)
    pauses: list[float] = []

    async def no_wait(seconds: float) -> None:
        pauses.append(seconds)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("statekernel._kernel.commit.asyncio.sleep", no_wait)
        with pytest.raises(StoreError):
            await committer.land(checkpoint, lambda: undone.append(True))
    assert undone == [True]
    assert len(pauses) == 6


async def test_repeated_cancellations_wait_for_the_write_and_keep_a_landed_commit() -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    undone: list[bool] = []
    committer = Committer(SlowStore(inner, 0.1), None)
    task = asyncio.ensure_future(committer.land(checkpoint, lambda: undone.append(True)))
    for _ in range(3):
        await asyncio.sleep(0.01)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert undone == []  # the write went on and landed: the driver keeps it
    assert (await inner.load("c")).revision == 1
