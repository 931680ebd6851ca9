"""Conformance check of ``CancelsRuns``: a cancel request kept beside a run's lease that
refuses every commit but the one carrying it out."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import attrs

from statekernel._records.run import Cancellation
from statekernel._storage.protocol import CancelsRuns, Checkpoint, CheckpointStore, Lease
from statekernel.errors import CancelRequested, InvalidTransition, RunNotFound
from statekernel.testing._store_cases import next_revision, sample_run

__all__ = ["check_cancels_runs"]

ASKED = Cancellation("stop it", "operator", datetime(2026, 5, 1, 12, 0, tzinfo=UTC))
LATER = Cancellation("stop it again", "someone else", datetime(2026, 5, 1, 13, 0, tzinfo=UTC))


async def _refused(store: CheckpointStore, checkpoint: Checkpoint, lease: Lease | None) -> None:
    refused: CancelRequested | None = None
    try:
        await store.commit(checkpoint, lease=lease)
    except CancelRequested as exc:
        refused = exc
    assert refused is not None, "a commit landed while a cancel request was kept"
    assert refused.run_id == checkpoint.run.run_id, "CancelRequested names another run"
    assert refused.reason == ASKED.reason, "CancelRequested does not give the reason"


async def check_cancels_runs(store: CheckpointStore) -> None:
    """A store declaring ``CancelsRuns``: the first request is kept (a second one gets the
    first back, unchanged); while it is kept every commit is refused with
    ``CancelRequested``, fenced or not, in a group of commits too, and writes nothing;
    the commit that carries it out (``Checkpoint.cancels``) lands and removes it; a run
    completed or failed keeps none; deleting a run removes its request."""
    if not isinstance(store, CancelsRuns):
        return
    run = sample_run("cancel-me")
    await store.commit(Checkpoint.between(None, run))
    lease = await store.acquire("cancel-me", "owner", ttl=60)
    assert await store.cancel_request("cancel-me") is None, "a new run has a cancel request"
    assert await store.cancel_request("no-such-run") is None, "a missing run has a request"
    try:
        await store.request_cancel("no-such-run", ASKED)
    except RunNotFound:
        pass
    else:
        raise AssertionError("a cancel request was kept for a run that does not exist")
    assert await store.request_cancel("cancel-me", ASKED) is None, "the first request was refused"
    assert await store.cancel_request("cancel-me") == ASKED, "the request kept is not the one given"
    assert await store.request_cancel("cancel-me", LATER) == ASKED, "a second request was kept"
    assert await store.cancel_request("cancel-me") == ASKED, "a second request replaced the first"
    nxt = next_revision(run)
    await _refused(store, Checkpoint.between(run, nxt), lease=lease)
    await _refused(store, Checkpoint.between(run, nxt), None)
    assert await store.load("cancel-me") == run, "a refused commit wrote something"
    failed = next_revision(run, state="failed")
    carried = attrs.evolve(Checkpoint.between(run, failed), cancels=True)
    await store.commit(carried, lease=lease)
    assert await store.load("cancel-me") == failed, "the cancellation did not land"
    assert await store.cancel_request("cancel-me") is None, "the cancellation kept its request"
    try:
        await store.request_cancel("cancel-me", LATER)
    except InvalidTransition:
        pass
    else:
        raise AssertionError("a failed run kept a cancel request")
    back = next_revision(failed, state="paused")
    await store.commit(Checkpoint.between(failed, back), lease=lease)  # no request: lands
    await store.commit(
        attrs.evolve(Checkpoint.between(back, next_revision(back)), cancels=True), lease=lease
    )  # a cancellation with no request kept lands as any commit
    await store.release(lease)
    await _group(store)
    await _deleted(store)


async def _group(store: CheckpointStore) -> None:
    """Commits ready together (a store's group commit): those of runs with a request are
    refused, the others land."""
    runs = [sample_run(f"cancel-group-{i}") for i in range(6)]
    for run in runs:
        await store.commit(Checkpoint.between(None, run))
    for run in runs[::2]:
        assert isinstance(store, CancelsRuns)
        assert await store.request_cancel(run.run_id, ASKED) is None
    outcomes = await asyncio.gather(
        *(store.commit(Checkpoint.between(r, next_revision(r))) for r in runs),
        return_exceptions=True,
    )
    for i, (run, outcome) in enumerate(zip(runs, outcomes, strict=True)):
        if i % 2 == 0:
            assert isinstance(outcome, CancelRequested), f"{run.run_id}: {outcome!r} landed"
            assert await store.load(run.run_id) == run, "a refused commit of a group wrote"
        else:
            assert outcome is None, f"{run.run_id}: {outcome!r}"
            assert (await store.load(run.run_id)).revision == 1


async def _deleted(store: CheckpointStore) -> None:
    """A deleted run's request goes with it: a new run of that id commits freely."""
    assert isinstance(store, CancelsRuns)
    run = sample_run("cancel-gone")
    await store.commit(Checkpoint.between(None, run))
    assert await store.request_cancel("cancel-gone", ASKED) is None
    assert await store.delete("cancel-gone")
    assert await store.cancel_request("cancel-gone") is None, "a deleted run kept its request"
    await store.commit(Checkpoint.between(None, run))
    await store.commit(Checkpoint.between(run, next_revision(run)))
