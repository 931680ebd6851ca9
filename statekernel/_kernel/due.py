"""The runs with something due, and firing it from outside a drive: what a worker's
timer loop does (``Worker(timers=True)``). See ``statekernel._kernel.timers``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING

from statekernel._records.events import Event
from statekernel._records.run import Run, utcnow
from statekernel._storage.protocol import CheckpointStore, RunSummary

if TYPE_CHECKING:
    from statekernel._kernel.kernel import Kernel

__all__ = ["due_runs", "fire_due", "next_due", "summary_due"]


def next_due(run: Run) -> datetime | None:
    """When something is next due on a paused run: its pause timer or its deadline,
    whichever comes first; None when it has neither, or is not paused (what an engine
    waits for before it drives the run again)."""
    if run.state != "paused" or run.pause is None:
        return None
    timer = run.pause.timer
    times = [t for t in (timer.at if timer else None, run.deadline) if t is not None]
    return min(times) if times else None


def summary_due(summary: RunSummary, now: datetime) -> bool:
    """Whether a listed run has something due: a paused run past its deadline or whose
    pause timer is due."""
    if summary.state != "paused" or summary.pause is None:
        return False
    if summary.deadline is not None and summary.deadline <= now:
        return True
    timer = summary.pause.timer
    return timer is not None and timer.at <= now


async def due_runs(store: CheckpointStore, *, page: int = 200) -> AsyncIterator[str]:
    """The ids of the store's paused runs that have something due now (a pause timer, a
    passed deadline), read from its listing of paused runs page by page."""
    now, cursor = utcnow(), None
    while True:
        listed = await store.list_runs(state="paused", limit=page, cursor=cursor)
        for summary in listed.runs:
            if summary_due(summary, now):
                yield summary.run_id
        cursor = listed.next_cursor
        if cursor is None:
            return


async def fire_due(kernel: Kernel, run_id: str) -> Run | None:
    """Fire what is due on ``run_id`` (see ``settle_due``) under its lease, as a command
    of ``kernel``: the run after that commit, or None when nothing was due (another
    worker fired it first, someone answered it, or it was not due yet)."""
    fired: list[Event] = []
    async with kernel._tenancy.fresh(run_id, settled=fired) as driver:
        return driver.run if fired else None
