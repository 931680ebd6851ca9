"""Conformance checks of what a store may declare beyond ``CheckpointStore``:
``RevisionHistory`` (every revision in one pass), ``SettlesOnCancel``,
``ReleasesWithCommit`` and ``CreatesLeased``."""

from __future__ import annotations

import asyncio
import contextlib

import attrs

from statekernel._records.events import Event
from statekernel._records.run import Run
from statekernel._storage.protocol import (
    Checkpoint,
    CheckpointStore,
    CreatesLeased,
    ReleasesWithCommit,
    RevisionHistory,
    settles_on_cancel,
)
from statekernel.errors import ConflictError, InvalidArgument, LeaseLost, RunBusy, RunNotFound
from statekernel.testing._store_cases import events_for, next_revision, sample_run

__all__ = [
    "check_creates_leased",
    "check_history",
    "check_releases_with_commit",
    "check_settles_on_cancel",
]


async def check_history(store: CheckpointStore) -> None:
    """``history`` yields every revision oldest first, equal to ``load(revision=)``, each
    with exactly the events of its commit; a missing run raises ``RunNotFound``."""
    if not isinstance(store, RevisionHistory):
        return
    run = sample_run("hist")
    chain: list[tuple[Run, tuple[Event, ...]]] = [(run, events_for(run, 1, 0))]
    await store.commit(Checkpoint.between(None, run, chain[0][1]))
    seq = 1
    for i in range(12):
        previous = chain[-1][0]
        nxt = next_revision(previous)
        batch = events_for(nxt, i % 3, seq)
        seq += len(batch)
        await store.commit(Checkpoint.between(previous, nxt, batch))
        chain.append((nxt, batch))
    got = [(r, list(e)) async for r, e in store.history("hist")]
    assert [r.revision for r, _ in got] == [r.revision for r, _ in chain], "revisions differ"
    for (run_at, events), (want, want_events) in zip(got, chain, strict=True):
        assert run_at == want, f"revision {want.revision} differs from what was committed"
        assert events == list(want_events), f"events of revision {want.revision} differ"
    try:
        async for _ in store.history("no-such-run"):
            raise AssertionError("history of a missing run yielded a revision")
    except RunNotFound:
        pass
    else:
        raise AssertionError("history of a missing run did not raise RunNotFound")


async def check_settles_on_cancel(store: CheckpointStore) -> None:
    """A store declaring ``settles_on_cancel``: when a cancelled commit's cancellation
    reaches the caller, the commit has landed whole or not at all, and nothing of it
    lands later."""
    if not settles_on_cancel(store):
        return
    run = sample_run("settle")
    await store.commit(Checkpoint.between(None, run))
    for delay in (0, 0.001, 0.003, 0.01):
        big = attrs.evolve(next_revision(run), context={"blob": "x" * 2_000_000 + str(delay)})
        task = asyncio.ensure_future(store.commit(Checkpoint.between(run, big)))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        at_cancel = await store.load("settle")
        await asyncio.sleep(0.05)  # an orphaned write would land now
        assert await store.load("settle") == at_cancel, "a cancelled commit landed later"
        assert at_cancel in (run, big), "a cancelled commit landed in part"
        run = at_cancel


async def check_releases_with_commit(store: CheckpointStore) -> None:
    """A store declaring ``ReleasesWithCommit``: a commit that lands gives its lease up
    with it (another owner takes the run at once; the old lease commits nothing more);
    one that is refused (a stale head, a lease that moved on) writes nothing and gives
    nothing up."""
    if not isinstance(store, ReleasesWithCommit):
        return
    run = sample_run("letgo")
    await store.commit(Checkpoint.between(None, run))
    lease = await store.acquire("letgo", "first", ttl=60)
    stale = next_revision(next_revision(run))
    try:
        await store.commit_and_release(Checkpoint.between(run, stale), lease=lease)
    except ConflictError:
        pass
    else:
        raise AssertionError("a commit on a stale head landed")
    try:
        await store.acquire("letgo", "second", ttl=60)
    except RunBusy:
        pass
    else:
        raise AssertionError("a refused commit gave its lease up")
    nxt = next_revision(run)
    await store.commit_and_release(Checkpoint.between(run, nxt), lease=lease)
    assert await store.load("letgo") == nxt, "the commit did not land whole"
    taken = await store.acquire("letgo", "second", ttl=60)  # at once: RunBusy if still held
    after = next_revision(nxt)
    try:
        await store.commit_and_release(Checkpoint.between(nxt, after), lease=lease)
    except LeaseLost:
        pass
    else:
        raise AssertionError("a lease given up with a commit committed again")
    assert await store.load("letgo") == nxt, "a refused commit wrote something"
    await store.commit(Checkpoint.between(nxt, after), lease=taken)
    await store.release(taken)


async def check_creates_leased(store: CheckpointStore) -> None:
    """A store declaring ``CreatesLeased``: the commit that creates a run holds its lease
    when it returns (another owner is refused, the lease's commits land); one refused
    (the id is taken, a revision that is not 0) creates nothing and takes no lease; the
    lease goes back as any other, and the next one's token is larger."""
    if not isinstance(store, CreatesLeased):
        return
    run = sample_run("born-held")
    lease = await store.create_leased(Checkpoint.between(None, run), "first", ttl=60)
    assert lease is not None, "a new run was created without its lease"
    assert lease.run_id == "born-held", "the lease is not the new run's"
    assert await store.load("born-held") == run, "the run was not created whole"
    try:
        await store.acquire("born-held", "second", ttl=60)
    except RunBusy:
        pass
    else:
        raise AssertionError("a run created with its lease was free for another owner")
    nxt = next_revision(run)
    await store.commit(Checkpoint.between(run, nxt), lease=lease)
    try:
        await store.create_leased(Checkpoint.between(None, run), "second", ttl=60)
    except ConflictError:
        pass
    else:
        raise AssertionError("a run was created twice")
    assert await store.load("born-held") == nxt, "a refused creation wrote something"
    new = sample_run("not-new")
    try:
        await store.create_leased(Checkpoint.between(new, next_revision(new)), "first", ttl=60)
    except InvalidArgument:
        pass
    else:
        raise AssertionError("create_leased took a checkpoint past revision 0")
    try:
        await store.load("not-new")
    except RunNotFound:
        pass
    else:
        raise AssertionError("a refused create_leased created a run")
    batch = [sample_run(f"born-held-{i}") for i in range(6)]  # created together: a group
    leases = await asyncio.gather(
        *(store.create_leased(Checkpoint.between(None, r), "first", ttl=60) for r in batch)
    )
    assert all(lease is not None for lease in leases), "a run created in a group lost its lease"
    for one in leases:
        assert one is not None
        await store.release(one)
    await store.release(lease)
    taken = await store.acquire("born-held", "second", ttl=60)  # at once: RunBusy if held
    assert taken.generation > lease.generation, "a later lease's token did not grow"
    await store.commit(Checkpoint.between(nxt, next_revision(nxt)), lease=taken)
    await store.release(taken)
