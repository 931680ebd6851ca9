"""SQLite store: a cancelled commit has settled when the cancellation reaches the caller."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs
import pytest

from statekernel._storage import commit_settled
from statekernel.stores import Checkpoint, SQLiteStore
from statekernel.testing._store_cases import next_revision, sample_run


async def test_cancelled_commit_lands_whole_or_not_before_the_cancellation(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")
    other = SQLiteStore(f"sqlite:///{tmp_path}/runs.db")  # another process, in effect
    assert store.settles_on_cancel
    run = sample_run("big")
    await store.commit(Checkpoint.between(None, run))
    for delay in (0, 0.001, 0.003, 0.01):
        big = attrs.evolve(next_revision(run), context={"blob": "x" * 5_000_000 + str(delay)})
        task = asyncio.ensure_future(commit_settled(store, Checkpoint.between(run, big)))
        await asyncio.sleep(delay)
        task.cancel()
        landed = True
        try:
            await task
        except asyncio.CancelledError:
            landed = False
        at_cancel = await other.load("big")
        await asyncio.sleep(0.05)  # an orphaned write would land now
        assert await other.load("big") == at_cancel
        assert at_cancel in (run, big), "a cancelled commit landed in part"
        if landed:
            assert at_cancel == big
        run = at_cancel
    await store.aclose()
    await other.aclose()


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_synchronous_option(tmp_path: Path, sync: str) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db?synchronous={sync}")
    run = sample_run("r")
    await store.commit(Checkpoint.between(None, run))
    assert await store.load("r") == run
    await store.aclose()
