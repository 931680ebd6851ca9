"""``migrate`` between real stores keeps every revision and every event of every run."""

from __future__ import annotations

import uuid
from pathlib import Path

import attrs
import pytest

from statekernel._records.events import Event
from statekernel._records.messages import Message
from statekernel._records.run import Run
from statekernel.errors import ConflictError, CorruptCheckpoint
from statekernel.stores import Checkpoint, CheckpointStore, Migration, migrate, open_store
from statekernel.testing import SQLiteRecords
from statekernel.testing._store_cases import T0, events_for, next_revision, sample_run

pytestmark = pytest.mark.redis


async def _history(store: CheckpointStore, run_id: str, revisions: int) -> list[Run]:
    """A run grown over ``revisions`` commits: messages, a completed turn, a rewritten
    transcript, a pause, events in most commits (some with odd data)."""
    run = sample_run(run_id, turns=1)
    chain = [run]
    await store.commit(Checkpoint.between(None, run, events_for(run, 2, 0)))
    seq = 2
    for i in range(revisions):
        prev = chain[-1]
        if i == 5:
            nxt = next_revision(prev, messages=prev.messages[::-1])
        elif i == 9:
            nxt = next_revision(prev, state="paused", context={"$b": "not a marker", "i": i})
        else:
            nxt = next_revision(prev, messages=(*prev.messages, Message.user(f"{run_id} {i}")))
        batch = events_for(nxt, i % 3, seq)
        if i == 7:
            odd = Event("custom", run_id, nxt.revision, seq + len(batch), ["not", "a dict"], T0)
            batch = (*batch, odd)
        nxt = attrs.evolve(nxt, event_count=seq + len(batch))
        await store.commit(Checkpoint.between(prev, nxt, batch))
        chain.append(nxt)
        seq += len(batch)
    return chain


async def _same_runs(a: CheckpointStore, b: CheckpointStore, chains: dict[str, list[Run]]) -> None:
    for run_id, chain in chains.items():
        for run in chain:
            got = await b.load(run_id, revision=run.revision)
            assert got == run, f"{run_id} at revision {run.revision}"
            assert got == await a.load(run_id, revision=run.revision)
        assert await b.load(run_id) == chain[-1]
        assert await b.events(run_id) == await a.events(run_id)
        assert len(await b.events(run_id)) == chain[-1].event_count
    listed_a = [(s.run_id, s.revision) for s in (await a.list_runs()).runs]
    listed_b = [(s.run_id, s.revision) for s in (await b.list_runs()).runs]
    assert listed_a == listed_b


async def test_migrate_memory_sqlite_file_redis(tmp_path: Path, redis_store_url: str) -> None:
    source = open_store(f"memory://migrate-{uuid.uuid4().hex}")
    chains = {
        "alpha": await _history(source, "alpha", 40),
        "beta": await _history(source, "beta", 3),
        "ünïcode-🌧️": await _history(source, "ünïcode-🌧️", 12),
    }
    sqlite_url = f"sqlite:///{tmp_path}/runs.db"
    file_url = f"file://{tmp_path}/files"
    seen: list[tuple[int, int]] = []
    done = await migrate(source, sqlite_url, progress=lambda d, t: seen.append((d, t)))
    assert done == Migration(copied=3)
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert await migrate(sqlite_url, file_url) == Migration(copied=3)
    assert await migrate(file_url, redis_store_url) == Migration(copied=3)
    opened = [open_store(url) for url in (sqlite_url, file_url, redis_store_url)]
    for previous, store in zip([source, *opened], opened, strict=False):
        await _same_runs(previous, store, chains)
    for store in opened:
        await store.aclose()
    assert await migrate(sqlite_url, file_url) == Migration(kept=3)  # run again: nothing to do


async def test_a_migration_run_again_goes_on_where_it_stopped(tmp_path: Path) -> None:
    source = open_store(f"memory://migrate-{uuid.uuid4().hex}")
    chain = await _history(source, "long", 12)
    await _history(source, "short", 2)
    target = open_store(f"sqlite:///{tmp_path}/part.db")
    history = [(await source.load("long", revision=r)) for r in range(5)]
    events = await source.events("long")
    previous = None
    for run in history:  # a migration that stopped after revision 4 of "long"
        batch = tuple(e for e in events if e.revision == run.revision)
        await target.commit(Checkpoint.between(previous, run, batch))
        previous = run
    assert await migrate(source, target) == Migration(copied=2)
    assert await target.load("long") == chain[-1]
    assert await target.events("long") == events
    other = open_store(f"memory://migrate-{uuid.uuid4().hex}")
    await _history(other, "long", 3)  # another run with the same id
    with pytest.raises(ConflictError):
        await migrate(other, target)
    await target.aclose()


async def test_damaged_runs_stop_a_migration_or_are_skipped_and_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/src.db"
    source = open_store(url)
    await _history(source, "fine", 3)
    await _history(source, "broken", 3)
    raw = SQLiteRecords()
    entry = (await raw.read(source, "broken"))[("entry", 2)]
    await raw.write(source, "broken", ("entry", 2), entry[:-4] + b"oops")
    await source.aclose()
    target_url = f"sqlite:///{tmp_path}/dst.db"
    with pytest.raises(CorruptCheckpoint):
        await migrate(url, target_url)
    target = open_store(target_url)
    held = [s.run_id for s in (await target.list_runs()).runs]
    assert "broken" not in held  # nothing of a damaged run is written
    done = await migrate(url, target, skip_corrupt=True)
    assert done.copied + done.kept == 1
    assert [d.run_id for d in done.skipped] == ["broken"]
    assert "revision 2" in done.skipped[0].problem
    assert [s.run_id for s in (await target.list_runs()).runs] == ["fine"]
    await target.aclose()
