"""Committing one change of a run: the one way a change reaches the store (the drive's
effect -> transition -> commit, see ``statekernel._kernel.drive``; the commands; a new
run from ``start`` or ``fork``).

``Committer.commit`` never raises: it returns what became of the commit, as a value the
caller decides from. ``Landed``: the commit is in the store (with the cancellation
that came meanwhile, if one did: the caller records the commit, then raises it).
``NotLanded``: it is not, and ``error`` says why. ``Overtaken``: another commit took
the revision first (``ConflictError``). ``unwrap`` raises what the caller must raise.

A store failure is ambiguous (the write may have reached the store), so it is settled
first by reading the head: the commit landed if the head is this very commit (same
revision, same instant of the transition, same events). One that did not land is
tried again with backoff (``COMMIT_RETRIES``); when every attempt failed, the outcome
is ``NotLanded`` with the last ``StoreError``. A conflict after an ambiguous attempt is
settled the same way (the earlier attempt may be what holds the revision). A
cancellation while the store works waits for the store to finish (no orphaned write
can land under a process that resumes the run right after, see
``statekernel._storage.shielding``), then says whether the commit landed the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import NoReturn, cast

import attrs

from statekernel._kernel import metrics, telemetry
from statekernel._kernel.failures import shortened
from statekernel._records.run import Cancellation, Run
from statekernel._secrets import logger
from statekernel._storage.protocol import (
    CancelsRuns,
    Checkpoint,
    CheckpointStore,
    Lease,
    ReleasesWithCommit,
    settles_on_cancel,
)
from statekernel._storage.shielding import shielded
from statekernel.errors import (
    CancelRequested,
    ConflictError,
    LeaseLost,
    RunNotFound,
    StatekernelError,
    StoreError,
)

__all__ = [
    "COMMIT_RETRIES",
    "Committer",
    "Landed",
    "Landing",
    "NotLanded",
    "Overtaken",
    "landed",
    "log_lease_lost",
]

log = logger("statekernel")

COMMIT_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""Pauses between attempts of a commit that failed in the store (then ``StoreError``)."""

_AT_REST = {"run_paused", "run_failed", "run_completed"}


@attrs.frozen
class Landed:
    """The commit is in the store. ``cancelled``: the cancellation that came while the
    store worked (the commit stays; the caller raises it once it has recorded it).
    ``released``: the lease was given up with it (``ReleasesWithCommit``); not when the
    head had to say whether it landed (the lease may be held still: released as usual)."""

    cancelled: asyncio.CancelledError | None = None
    released: bool = False
    landed = True

    def unwrap(self) -> None:
        """Raise the cancellation that came meanwhile, if one did."""
        if self.cancelled is not None:
            raise self.cancelled


@attrs.frozen
class NotLanded:
    """The commit is not in the store; ``error`` says why: ``StoreError`` after every
    attempt, ``LeaseLost``, ``RunNotFound``, a cancellation (of the pause between
    attempts, or of a write that did not land or whose outcome the head could not
    tell), or an exception that ends the process (raised through the store: nothing
    is settled then)."""

    error: BaseException
    landed = False

    def unwrap(self) -> NoReturn:
        """Raise ``error``."""
        raise self.error


@attrs.frozen
class Overtaken:
    """Another commit took the revision this one was built on (the store refused it, or
    the head read to settle an ambiguous attempt is someone else's)."""

    error: ConflictError
    landed = False

    def unwrap(self) -> NoReturn:
        """Raise the ``ConflictError``."""
        raise self.error


Landing = Landed | NotLanded | Overtaken
"""What became of a commit (``Committer.commit``)."""


class Committer:
    """Commits the changes of one run under ``lease`` (None: unfenced, for a new run)."""

    def __init__(
        self, store: CheckpointStore, lease: Lease | None, *, reported: bool = True
    ) -> None:
        self.store = store
        self.reported = reported
        """Whether each commit has a span (``_kernel.telemetry``) and a log line: those of
        runs that exist do; the commit that creates a run has neither."""
        self.settles = settles_on_cancel(store)
        """Whether the store declares ``SettlesOnCancel`` (its commit is awaited directly)."""
        self.lease = lease
        self.lost = False
        """True once the lease was found to have moved on: nothing more is committed."""
        self.cancelling: Cancellation | None = None
        """A cancel request it knows of (``Kernel.cancel``): it commits nothing but the
        cancellation (``Checkpoint.cancels``), as a store keeping the request does."""
        self.carried_out: Cancellation | None = None
        """The last request it carried out: one read from the store before is not news."""
        self.releases = lease is not None and isinstance(store, ReleasesWithCommit)
        """Whether a commit can give the lease up with it (``commit(release=True)``):
        asked once (a protocol check costs about 7 us, and a drive asks at every commit)."""

    def check_cancel(self, run_id: str) -> None:
        """``CancelRequested`` once it knows of a cancel request (``cancelling``)."""
        asked = self.cancelling
        if asked is not None:
            raise CancelRequested(run_id, asked.reason, asked.by)

    async def kept_cancel(self, run_id: str) -> Cancellation | None:
        """The cancel request the store keeps for the run (``CancelsRuns``) that this
        committer has not met yet (none known, not the one it carried out last), read
        once; None otherwise."""
        store = self.store
        if self.cancelling is not None or self.lost or not isinstance(store, CancelsRuns):
            return None
        request = await store.cancel_request(run_id)
        if request is None or request == self.carried_out or self.lost:
            return None  # carried out meanwhile, maybe: not news then
        return request

    async def commit(
        self,
        checkpoint: Checkpoint,
        trace_parent: telemetry.TraceContext | None = None,
        *,
        release: bool = False,
    ) -> Landing:
        """Commit ``checkpoint``, trying again after store failures; what became of it
        (never raised: the caller decides from the value, ``unwrap`` raises).
        ``release`` (where ``releases``): give the lease up with it (``Landed.released``).

        Each attempt is run to its end by the store even if the caller is cancelled: a
        store that declares ``SettlesOnCancel`` has ended its commit when the
        cancellation comes out of it; any other store's commit runs in a task of its
        own, waited for (through further cancellations) before the outcome is returned.
        """
        reported, started = self.reported, time.perf_counter()
        with telemetry.commit_span(trace_parent, checkpoint, traced=reported) as span:
            try:
                landing = await self._attempts(checkpoint, span, release and self.releases)
            except BaseException as exc:  # while the head was read to settle a store error
                landing = NotLanded(exc)
            if not isinstance(landing, Landed):
                span.failed(landing.error)
        if landing.landed and reported:
            _log_commit(checkpoint)
        outcome = "overtaken" if isinstance(landing, Overtaken) else "not_landed"
        outcome = "landed" if landing.landed else outcome
        duration = time.perf_counter() - started
        metrics.record_commit(checkpoint, metrics.store_kind(self.store), outcome, duration)
        return landing

    async def _attempts(
        self, checkpoint: Checkpoint, span: telemetry.CommitSpan, release: bool
    ) -> Landing:
        ambiguous = False  # an earlier attempt may have landed (its head was not settled)
        for attempt, pause in enumerate((*COMMIT_RETRIES, None), 1):
            span.attempts = attempt
            task: asyncio.Future[None] | None = None
            try:
                if self.lost:
                    raise LeaseLost(checkpoint.run.run_id, checkpoint.expected_revision)
                if not (checkpoint.cancels or ambiguous):  # an earlier attempt may have landed
                    self.check_cancel(checkpoint.run.run_id)
                write = self._write(checkpoint, release)
                task = None if self.settles else asyncio.ensure_future(write)
                await (write if task is None else shielded(task))
                return Landed(released=release)
            except asyncio.CancelledError as cancelled:
                wrote = task is not None and not task.cancelled() and not task.exception()
                if wrote:  # the write returned in its own task: it landed
                    return Landed(cancelled, released=release)
                return await self._after_cancel(checkpoint, cancelled)
            except StoreError as exc:
                settled = await self._settled(checkpoint)
                if settled is not None:
                    return settled
                ambiguous = True
                if pause is None:
                    return NotLanded(exc)
                _log_retry(checkpoint, attempt, pause, exc)
            except LeaseLost as exc:  # before ConflictError, of which it is a kind
                run = checkpoint.run
                log_lease_lost(run.run_id, run.revision, "its commit was refused")
                return NotLanded(exc)
            except ConflictError as exc:
                if ambiguous:  # the earlier attempt may be what holds the revision
                    return await self._settled(checkpoint) or Overtaken(exc)
                return Overtaken(exc)
            except BaseException as exc:
                return NotLanded(exc)
            try:
                await asyncio.sleep(pause)
            except asyncio.CancelledError as cancelled:
                return NotLanded(cancelled)
        raise AssertionError("unreachable: the last attempt returns")

    def _write(self, checkpoint: Checkpoint, release: bool) -> Awaitable[None]:
        """One attempt in the store: ``commit``, or ``commit_and_release``."""
        store, lease = self.store, self.lease
        if release and self.releases and lease is not None:
            return cast(ReleasesWithCommit, store).commit_and_release(checkpoint, lease=lease)
        return store.commit(checkpoint, lease=lease)

    async def _after_cancel(
        self, checkpoint: Checkpoint, cancelled: asyncio.CancelledError
    ) -> Landing:
        """The outcome of an attempt the caller's cancellation came through, whose write
        did not return: the head says."""
        try:
            settled = await self._settled(checkpoint)
        except asyncio.CancelledError:
            settled = None  # cancelled again while reading the head: it cannot tell
        if isinstance(settled, Landed):
            return Landed(cancelled)
        return NotLanded(cancelled)

    async def _settled(self, checkpoint: Checkpoint) -> Landed | Overtaken | None:
        """``Landed`` when the head is ``checkpoint``, ``Overtaken`` when it is another
        commit at or past its revision, None when it did not land (or the store cannot
        tell now)."""
        try:
            if await self._settle(checkpoint):
                return Landed()
        except ConflictError as exc:
            return Overtaken(exc)
        return None

    async def _settle(self, checkpoint: Checkpoint) -> bool | None:
        """``landed`` in this committer's store."""
        return await landed(self.store, checkpoint)


async def landed(store: CheckpointStore, checkpoint: Checkpoint) -> bool | None:
    """Whether ``checkpoint`` landed in ``store``, read from the head; None when the store
    cannot tell right now; ``ConflictError`` when the head is another commit at or past its
    revision. Only the lease holder commits, but a command of the same kernel may share the
    lease, so the head must be this very commit: same revision, same instant of the
    transition, same events."""
    try:
        head = await store.load(checkpoint.run.run_id)
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
    if "run_failed" in rested and run.failure is not None:
        _log_failed(run, fields)
    elif rested:
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


def _log_failed(run: Run, fields: dict[str, object]) -> None:
    """WARNING: the commit failed the run; names the error's type and its message."""
    failure = run.failure
    assert failure is not None
    log.warning(
        "run %s failed in %s at revision %d: %s: %s (kernel.retry resumes it)",
        run.run_id,
        failure.failed_in,
        run.revision,
        failure.error,
        shortened(failure.message),
        extra={**fields, "error": failure.error, "failed_in": failure.failed_in},
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
