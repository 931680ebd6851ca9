"""``migrate(src, dst)``: copy every run, with every revision and its events, between stores."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from statekernel._events import Event
from statekernel._run import Run
from statekernel._storage import Checkpoint, CheckpointStore
from statekernel.stores._open import open_store

__all__ = ["migrate"]

Progress = Callable[[int, int], Any]


async def migrate(
    src: str | CheckpointStore,
    dst: str | CheckpointStore,
    *,
    progress: Progress | None = None,
) -> int:
    """Copy every run of ``src`` into ``dst`` revision by revision; the number of runs.

    Each revision is committed to ``dst`` with the events of its commit, so ``dst``
    holds the same history (``load(run_id, revision=r)`` and ``events`` give what
    ``src`` gives). A run that already exists in ``dst`` raises ``ConflictError``.
    Stores given as URLs are opened and closed here. ``progress(done, total)`` is
    called after each run.
    """
    source = open_store(src) if isinstance(src, str) else src
    target = open_store(dst) if isinstance(dst, str) else dst
    try:
        run_ids = await _all_run_ids(source)
        for done, run_id in enumerate(run_ids, 1):
            previous: Run | None = None
            async for run, events in _history(source, run_id):
                await target.commit(Checkpoint.between(previous, run, events))
                previous = run
            if progress is not None:
                progress(done, len(run_ids))
        return len(run_ids)
    finally:
        if isinstance(dst, str):
            await target.aclose()
        if isinstance(src, str):
            await source.aclose()


async def _all_run_ids(store: CheckpointStore) -> list[str]:
    ids: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list_runs(limit=500, cursor=cursor)
        ids += [s.run_id for s in page.runs]
        cursor = page.next_cursor
        if cursor is None:
            return ids


async def _history(store: CheckpointStore, run_id: str) -> AsyncIterator[tuple[Run, list[Event]]]:
    """Revisions oldest first with their events; stores may offer a faster ``history``."""
    fast = getattr(store, "history", None)
    if fast is not None:
        async for item in fast(run_id):
            yield item
        return
    head = await store.load(run_id)
    by_revision: dict[int, list[Event]] = {}
    for event in await store.events(run_id):
        by_revision.setdefault(event.revision, []).append(event)
    for revision in range(head.revision + 1):
        run = head if revision == head.revision else await store.load(run_id, revision=revision)
        yield run, by_revision.get(revision, [])
