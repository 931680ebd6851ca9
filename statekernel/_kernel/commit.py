"""Landing one commit of a run under its lease: the last step of the drive's
effect -> transition -> commit (see ``statekernel._kernel.drive``).

``Committer.land`` returns once the commit landed. A store failure is ambiguous (the
write may have reached the store), so it is settled first by reading the head: the
commit landed if the head is this very commit (same revision, same instant of the
transition, same events). One that did not land is tried again with backoff
(``COMMIT_RETRIES``); when every attempt failed, ``StoreError`` is raised. A
cancellation while the store works waits for the store to finish (no orphaned write
can land under a process that resumes the run right after), then says whether the
commit landed the same way. On every way out without a landed commit (a cancellation
during the pause between attempts, a head that cannot be read, a conflict), ``undo``
puts the driver's copy back at the last commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from statekernel._kernel import telemetry
from statekernel._records.run import Run
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, settles_on_cancel
from statekernel._storage.shielding import shielded
from statekernel.errors import (
    ConflictError,
    LeaseLost,
    RunNotFound,
    StatekernelError,
    StoreError,
)

__all__ = ["COMMIT_RETRIES", "Committer", "log_lease_lost"]

log = logging.getLogger("statekernel")

COMMIT_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""Pauses between attempts of a commit that failed in the store (then ``StoreError``)."""

_AT_REST = {"run_paused", "run_failed", "run_completed"}


class Committer:
    """Lands the commits of one run under ``lease`` (None: unfenced, for a new run)."""

    def __init__(self, store: CheckpointStore, lease: Lease | None) -> None:
        self.store = store
        self.settles = settles_on_cancel(store)
        """Whether the store declares ``SettlesOnCancel`` (its commit is awaited directly)."""
        self.lease = lease
        self.lost = False
        """True once the lease was found to have moved on: nothing more is committed."""

    async def land(
        self,
        checkpoint: Checkpoint,
        undo: Callable[[], None],
        trace_parent: telemetry.TraceContext | None = None,
    ) -> None:
        """Commit ``checkpoint``: on return it landed; on any way out without a landed
        commit ``undo`` was called first (a cancellation after it landed keeps it).

        Each attempt is run to its end by the store even if the caller is cancelled: a
        store that declares ``SettlesOnCancel`` has ended its commit when the
        cancellation comes out of it; any other store's commit runs in a task of its
        own, waited for (through further cancellations) before the cancellation goes on.
        """
        settles = self.settles
        landed = False
        try:
            with telemetry.commit_span(trace_parent, checkpoint) as span:
                for attempt, pause in enumerate((*COMMIT_RETRIES, None), 1):
                    span.attempts = attempt
                    task: asyncio.Future[None] | None = None
                    try:
                        if self.lost:
                            raise LeaseLost(checkpoint.run.run_id, checkpoint.expected_revision)
                        write = self.store.commit(checkpoint, lease=self.lease)
                        task = None if settles else asyncio.ensure_future(write)
                        await (write if task is None else shielded(task))
                        landed = True
                        break
                    except asyncio.CancelledError:
                        wrote = task is not None and not task.cancelled() and not task.exception()
                        landed = wrote or bool(await self._settle(checkpoint))
                        raise
                    except StoreError as exc:
                        landed = bool(await self._settle(checkpoint))
                        if landed:
                            break
                        if pause is None:
                            raise
                        _log_retry(checkpoint, attempt, pause, exc)
                    except LeaseLost:
                        run = checkpoint.run
                        log_lease_lost(run.run_id, run.revision, "its commit was refused")
                        raise
                    if pause is not None:
                        await asyncio.sleep(pause)
        except BaseException:
            if not landed:
                undo()
            raise
        _log_commit(checkpoint)

    async def _settle(self, checkpoint: Checkpoint) -> bool | None:
        """Whether ``checkpoint`` landed, read from the head; None when the store cannot
        tell right now. Only the lease holder commits, but a command of the same kernel
        may share the lease, so the head must be this very commit: same revision, same
        instant of the transition, same events."""
        try:
            head = await self.store.load(checkpoint.run.run_id)
        except RunNotFound:
            return False
        except StatekernelError:
            return None
        mine = checkpoint.run
        if head.revision == mine.revision and _same_commit(head, mine):
            return True
        if head.revision == checkpoint.expected_revision:
            return False
        raise ConflictError(mine.run_id, checkpoint.expected_revision, head.revision)


def _same_commit(head: Run, mine: Run) -> bool:
    return (
        head.updated_at == mine.updated_at
        and head.event_count == mine.event_count
        and head.state == mine.state
    )


def _log_commit(checkpoint: Checkpoint) -> None:
    """DEBUG: a commit landed; INFO: it brought the run to rest."""
    run = checkpoint.run
    rested = [e.type for e in checkpoint.events if e.type in _AT_REST]
    if not (rested or log.isEnabledFor(logging.DEBUG)):
        return
    types = [event.type for event in checkpoint.events]
    fields = {"run_id": run.run_id, "revision": run.revision, "state": run.state}
    log.debug(
        "run %s: committed revision %d (%s)",
        run.run_id,
        run.revision,
        ", ".join(types),
        extra={**fields, "events": types},
    )
    if rested:
        reason = run.pause.reason if run.state == "paused" and run.pause else None
        why = f" ({reason})" if reason else ""
        log.info(
            "run %s %s at revision %d%s",
            run.run_id,
            run.state,
            run.revision,
            why,
            extra={**fields, "reason": reason},
        )


def _log_retry(checkpoint: Checkpoint, attempt: int, pause: float, exc: BaseException) -> None:
    run = checkpoint.run
    log.warning(
        "run %s: commit of revision %d failed in the store (%s); trying again in %.2f s",
        run.run_id,
        run.revision,
        exc,
        pause,
        extra={"run_id": run.run_id, "revision": run.revision, "attempt": attempt},
    )


def log_lease_lost(run_id: str, revision: int, why: str) -> None:
    """WARNING: this kernel lost the run's lease (another owner may drive it now);
    ``revision``: of the refused commit, else the last one this kernel knows."""
    log.warning(
        "run %s: lease lost (revision %d): %s",
        run_id,
        revision,
        why,
        extra={"run_id": run_id, "revision": revision},
    )
