"""``migrate(src, dst)``: copy every run, with every revision and its events, between stores."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs

from statekernel._records.events import Event
from statekernel._records.run import Run
from statekernel._storage.protocol import (
    Checkpoint,
    CheckpointStore,
    DamagedRun,
    KeepsFences,
    RevisionHistory,
)
from statekernel.errors import ConflictError, CorruptCheckpoint, RunNotFound
from statekernel.stores._open import open_store

__all__ = ["Migration", "migrate"]

Progress = Callable[[int, int], Any]


@attrs.frozen
class Migration:
    """What ``migrate`` did: runs copied, runs the destination already held whole (a
    migration run again after it stopped), and damaged runs skipped (``skip_corrupt``)."""

    copied: int = 0
    kept: int = 0
    skipped: tuple[DamagedRun, ...] = ()


async def migrate(
    src: str | CheckpointStore,
    dst: str | CheckpointStore,
    *,
    progress: Progress | None = None,
    skip_corrupt: bool = False,
) -> Migration:
    """Copy every run of ``src`` into ``dst`` revision by revision.

    Each revision is committed to ``dst`` with the events of its commit, so ``dst``
    holds the same history (``load(run_id, revision=r)`` and ``events`` give what
    ``src`` gives). Run again after it stopped, it goes on: a run ``dst`` holds whole is
    kept, one it holds part of gets the revisions it lacks; a run ``dst`` holds with
    another history raises ``ConflictError``. A run whose history cannot be read raises
    ``CorruptCheckpoint`` before anything of it is written, or, with ``skip_corrupt``,
    is skipped and named in the result. Stores given as URLs are opened and closed
    here. ``progress(done, total)`` is called after each run.

    Returns:
        The counts of runs copied and kept, and the damaged runs skipped.

    Raises:
        ConfigError: a store URL is unknown or malformed.
        ConflictError: ``dst`` holds a run of ``src`` with another history.
        CorruptCheckpoint: a run of ``src`` cannot be read (without ``skip_corrupt``).
        StoreError: a store failed.
    """
    source = open_store(src) if isinstance(src, str) else src
    target = open_store(dst) if isinstance(dst, str) else dst
    copied = kept = 0
    try:
        run_ids, skipped = await _all_run_ids(source)
        if skipped and not skip_corrupt:
            first = skipped[0]
            raise CorruptCheckpoint(f"run {first.run_id}: {first.problem}")
        for done, run_id in enumerate(run_ids, 1):
            try:
                history = [item async for item in _history(source, run_id)]
            except CorruptCheckpoint as exc:
                if not skip_corrupt:
                    raise
                skipped.append(DamagedRun(run_id, str(exc)))
            else:
                if await _copy(target, run_id, history):
                    copied += 1
                else:
                    kept += 1
                await _carry_fence(source, target, run_id)
            if progress is not None:
                progress(done, len(run_ids))
        return Migration(copied, kept, tuple(skipped))
    finally:
        if isinstance(dst, str):
            await target.aclose()
        if isinstance(src, str):
            await source.aclose()


async def _copy(
    target: CheckpointStore, run_id: str, history: list[tuple[Run, list[Event]]]
) -> bool:
    """Commit the revisions of ``history`` that ``target`` lacks; False if it had all."""
    try:
        held: Run | None = await target.load(run_id)
    except RunNotFound:
        held = None
    start = 0
    if held is not None:
        if held.revision >= len(history) or not _same(history[held.revision][0], held):
            raise ConflictError(run_id, held.revision, len(history) - 1)
        start = held.revision + 1
    previous = history[start - 1][0] if start else None
    for run, events in history[start:]:
        await target.commit(Checkpoint.between(previous, run, events))
        previous = run
    return start < len(history)


async def _carry_fence(source: CheckpointStore, target: CheckpointStore, run_id: str) -> None:
    """Every later fencing token of the run in ``target`` is larger than any ``source``
    gave (where both keep fences: ``KeepsFences``)."""
    if isinstance(source, KeepsFences) and isinstance(target, KeepsFences):
        given = await source.fence(run_id)
        if given:
            await target.keep_fence(run_id, given)


def _same(source: Run, held: Run) -> bool:
    """Whether ``held`` is the copy of ``source`` (the same commit of the same run)."""
    return (
        source.revision == held.revision
        and source.updated_at == held.updated_at
        and source.event_count == held.event_count
        and source.state == held.state
    )


async def _all_run_ids(store: CheckpointStore) -> tuple[list[str], list[DamagedRun]]:
    ids: list[str] = []
    damaged: list[DamagedRun] = []
    cursor: str | None = None
    while True:
        page = await store.list_runs(limit=500, cursor=cursor)
        ids += [s.run_id for s in page.runs]
        named = {d.run_id for d in damaged}
        damaged += [d for d in page.damaged if d.run_id not in named]  # a page may repeat one
        cursor = page.next_cursor
        if cursor is None:
            return ids, damaged


async def _history(store: CheckpointStore, run_id: str) -> AsyncIterator[tuple[Run, list[Event]]]:
    """Revisions oldest first with their events, in one pass where the store offers it."""
    if isinstance(store, RevisionHistory):
        async for item in store.history(run_id):
            yield item
        return
    head = await store.load(run_id)
    by_revision: dict[int, list[Event]] = {}
    for event in await store.events(run_id):
        by_revision.setdefault(event.revision, []).append(event)
    for revision in range(head.revision + 1):
        run = head if revision == head.revision else await store.load(run_id, revision=revision)
        yield run, by_revision.get(revision, [])
