"""Watching commits on every store: a notice for each commit made once the watch is
entered, by this client or another (the server's feed on PostgreSQL and Redis, the
listing polled elsewhere), of one run or of all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from statekernel._storage.protocol import CheckpointStore
from statekernel.stores import Checkpoint, CommitNotice, Watches, open_store, watch
from statekernel.stores.memory._store import MemoryStore
from statekernel.testing._store_cases import next_revision, sample_run


@pytest.fixture
async def stores(every_store_url: str) -> AsyncIterator[tuple[CheckpointStore, CheckpointStore]]:
    """The store the test watches, and another client of the same store that commits."""
    watched = open_store(every_store_url)
    other = watched if isinstance(watched, MemoryStore) else open_store(every_store_url)
    yield watched, other
    if other is not watched:
        await other.aclose()
    await watched.aclose()


async def _until(
    notices: AsyncIterator[CommitNotice], wanted: set[tuple[str, int]]
) -> list[CommitNotice]:
    """Notices read until each (run id, revision) of ``wanted`` came (or a later one)."""
    got: list[CommitNotice] = []
    best: dict[str, int] = {}
    while any(best.get(run_id, -1) < revision for run_id, revision in wanted):
        notice = await asyncio.wait_for(anext(notices), 120)
        got.append(notice)
        best[notice.run_id] = max(best.get(notice.run_id, -1), notice.revision)
    return got


async def test_a_watch_reports_the_commits_made_once_it_is_entered(
    stores: tuple[CheckpointStore, CheckpointStore], every_store_url: str
) -> None:
    watched, other = stores
    now = datetime.now(UTC)
    before = sample_run("before", at=now)
    await other.commit(Checkpoint.between(None, before))
    async with watch(watched, poll=0.02) as everything, watch(watched, "mine", poll=0.02) as mine:
        first = sample_run("mine", at=now)
        await other.commit(Checkpoint.between(None, first))
        theirs = sample_run("theirs", at=now)
        await other.commit(Checkpoint.between(None, theirs))
        second = next_revision(first, state="completed")
        await other.commit(Checkpoint.between(first, second))
        seen = await _until(everything, {("mine", 1), ("theirs", 0)})
        assert "before" not in {n.run_id for n in seen}
        assert CommitNotice("theirs", 0, theirs.state) in seen
        own = await _until(mine, {("mine", 1)})
        assert {n.run_id for n in own} == {"mine"}
        assert own[-1] == CommitNotice("mine", 1, "completed")
        assert [n.revision for n in own] == sorted(n.revision for n in own)
    server_feed = every_store_url.startswith(("redis", "postgres"))
    assert isinstance(watched, Watches) == server_feed


async def test_a_watch_ends_cleanly_and_the_store_closes_after_it(every_store_url: str) -> None:
    store = open_store(every_store_url)
    try:
        async with watch(store, "x", poll=0.02) as notices:
            await store.commit(Checkpoint.between(None, sample_run("x", at=datetime.now(UTC))))
            assert (await asyncio.wait_for(anext(notices), 120)).run_id == "x"
    finally:
        await asyncio.wait_for(store.aclose(), 60)
