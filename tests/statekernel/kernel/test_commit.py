"""``Committer.commit``: what became of a commit, as a value, on every way out."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta

import attrs
import pytest

from statekernel._kernel.commit import Committer, Landed, NotLanded, Overtaken
from statekernel._records.run import Run
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, StoreWrapper
from statekernel.errors import ConflictError, LeaseLost, StoreError
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


class AmbiguousStore(StoreWrapper):
    """The first commit lands, then fails as if the answer got lost; ``blind`` loads
    fail first (the head cannot be read to settle it)."""

    def __init__(self, inner: CheckpointStore, blind: int = 0) -> None:
        super().__init__(inner)
        self.commits = 0
        self.blind = blind

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        self.commits += 1
        await self.inner.commit(checkpoint, lease=lease)
        if self.commits == 1:
            raise StoreError("the connection dropped before the answer")

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        if self.blind:
            self.blind -= 1
            raise StoreError("cannot read now")
        return await self.inner.load(run_id, revision=revision)


class HeldStore(StoreWrapper):
    """A commit that waits for ``go``, then fails without landing."""

    def __init__(self, inner: CheckpointStore) -> None:
        super().__init__(inner)
        self.began = asyncio.Event()
        self.go = asyncio.Event()

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        self.began.set()
        await self.go.wait()
        raise StoreError("refused")


async def _first(store: CheckpointStore) -> Checkpoint:
    run = sample_run("c")
    await store.commit(Checkpoint.between(None, run))
    return Checkpoint.between(run, next_revision(run))


def _no_pauses(patch: pytest.MonkeyPatch) -> list[float]:
    """The committer's pauses between attempts, skipped and recorded. ``asyncio.sleep``
    is one function for the whole process: an event loop another test left running in a
    thread (a web view's, a blocking kernel's) sleeps as ever and is not recorded."""
    pauses: list[float] = []
    real = asyncio.sleep
    here = threading.get_ident()

    async def no_wait(seconds: float) -> None:
        if threading.get_ident() != here:
            await real(seconds)
            return
        pauses.append(seconds)

    patch.setattr("statekernel._kernel.commit.asyncio.sleep", no_wait)
    return pauses


async def test_a_cancellation_during_the_pause_between_attempts_is_not_landed() -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    committer = Committer(FailingStore(inner), None)
    task = asyncio.ensure_future(committer.commit(checkpoint))
    await asyncio.sleep(0.02)  # the first attempt failed; the pause before the second runs
    task.cancel()
    landing = await task
    assert isinstance(landing, NotLanded)
    assert isinstance(landing.error, asyncio.CancelledError)
    assert (await inner.load("c")).revision == 0


async def test_every_attempt_failing_is_not_landed_with_the_store_error() -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    committer = Committer(FailingStore(inner), None)
    with pytest.MonkeyPatch.context() as patch:
        pauses = _no_pauses(patch)
        landing = await committer.commit(checkpoint)
    assert isinstance(landing, NotLanded)
    assert isinstance(landing.error, StoreError)
    with pytest.raises(StoreError):
        landing.unwrap()
    assert len(pauses) == 6


async def test_repeated_cancellations_wait_for_the_write_and_keep_a_landed_commit() -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    committer = Committer(SlowStore(inner, 0.1), None)
    task = asyncio.ensure_future(committer.commit(checkpoint))
    for _ in range(3):
        await asyncio.sleep(0.01)
        task.cancel()
    landing = await task
    assert isinstance(landing, Landed)  # the write went on and landed: the driver keeps it
    assert landing.cancelled is not None
    with pytest.raises(asyncio.CancelledError):
        landing.unwrap()
    assert (await inner.load("c")).revision == 1


async def test_an_ambiguous_failure_that_landed_is_settled_from_the_head() -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    store = AmbiguousStore(inner)
    landing = await Committer(store, None).commit(checkpoint)
    assert landing == Landed()
    assert store.commits == 1  # not written twice
    assert (await inner.load("c")).revision == 1


async def test_a_conflict_after_an_ambiguous_attempt_that_landed_is_landed() -> None:
    """The head could not be read after the failure; the next attempt finds the revision
    taken, by this very commit."""
    inner = MemoryStore()
    checkpoint = await _first(inner)
    store = AmbiguousStore(inner, blind=1)
    with pytest.MonkeyPatch.context() as patch:
        _no_pauses(patch)
        landing = await Committer(store, None).commit(checkpoint)
    assert landing == Landed()
    assert store.commits == 2


async def test_a_commit_another_one_overtook_is_overtaken() -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    await inner.commit(_other(checkpoint))  # the revision, taken by another commit
    landing = await Committer(inner, None).commit(checkpoint)
    assert isinstance(landing, Overtaken)
    with pytest.raises(ConflictError):
        landing.unwrap()


def _other(checkpoint: Checkpoint) -> Checkpoint:
    """Another commit of the same revision as ``checkpoint``."""
    mine = checkpoint.run
    other = attrs.evolve(mine, updated_at=mine.updated_at + timedelta(seconds=1))
    return attrs.evolve(checkpoint, run=other)


async def test_a_cancelled_write_that_did_not_land_under_a_moved_head_stays_a_cancellation() -> (
    None
):
    """The head moved on while the cancelled write was held: the outcome is the
    cancellation (not a ConflictError in its place)."""
    inner = MemoryStore()
    checkpoint = await _first(inner)
    store = HeldStore(inner)
    task = asyncio.ensure_future(Committer(store, None).commit(checkpoint))
    await store.began.wait()
    await inner.commit(_other(checkpoint))  # the head moves on meanwhile
    task.cancel()
    await asyncio.sleep(0)
    store.go.set()
    landing = await task
    assert isinstance(landing, NotLanded)
    assert isinstance(landing.error, asyncio.CancelledError)


async def test_a_commit_refused_for_a_lost_lease_is_not_landed_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = MemoryStore()
    checkpoint = await _first(inner)
    lease = await inner.acquire(checkpoint.run.run_id, "me", ttl=60.0)
    await inner.release(lease)
    await inner.acquire(checkpoint.run.run_id, "another", ttl=60.0)  # the run moved on
    with caplog.at_level(logging.WARNING, logger="statekernel"):
        landing = await Committer(inner, lease).commit(checkpoint)
    assert isinstance(landing, NotLanded)
    with pytest.raises(LeaseLost):
        landing.unwrap()
    assert "lease lost" in caplog.text
    assert "its commit was refused" in caplog.text
