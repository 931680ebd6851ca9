"""Cancel a run by id, from any process (``Kernel.cancel``).

A cancel is committed first, then obeyed by whoever drives the run:

1. The request (``Cancellation``: reason, who, when) is kept by the store beside the
   run's lease (``CancelsRuns.request_cancel``), without the lease. From then on the
   store refuses every commit to the run but the one that carries the request out, in
   the same atomic step that checks revision and fencing token: no intent lands after
   it, so no model or tool call committed after it starts, whoever drives the run.
2. The run's owner carries it out at its next safe point (``drive.carry_out_cancel``):
   when a commit is refused, when its lease renewal finds the request (every third of
   the lease's ttl), or at once when the owner is this kernel. Running calls are
   cancelled cooperatively and the run fails with the ``Cancelled`` failure. A command
   refused for it carries it out before it lets the run go.
3. A run nobody holds (at rest, or its owner dead and its lease expired) is cancelled
   by the caller itself: it takes the lease (waiting for a resting run's, which only a
   command or a drive letting go holds) and commits the cancellation.

Child runs are cancelled with their parent (``children=False`` leaves them be).
"""

from __future__ import annotations

from typing import Literal

import attrs

from statekernel._kernel import telemetry
from statekernel._kernel.delegate import child_runs
from statekernel._kernel.drive import RunDriver, cancel_soon, carry_out_cancel
from statekernel._kernel.tenancy import Tenancy
from statekernel._records.run import Cancellation, Run, utcnow
from statekernel._storage.protocol import CancelsRuns
from statekernel.errors import ConfigError, InvalidTransition, RunBusy, RunNotFound

__all__ = ["CancelResult", "cancel_tree"]

Outcome = Literal["cancelled", "requested", "unchanged"]


@attrs.frozen
class CancelResult:
    """What ``Kernel.cancel`` did to one run (and, in ``children``, to its child runs).

    ``outcome``: ``"cancelled"`` (the run is failed with the ``Cancelled`` failure now),
    ``"requested"`` (its live owner stops it at its next safe point) or ``"unchanged"``
    (nothing to do: already cancelled, or completed or failed before; ``detail`` says
    which). ``revision``: the run's head after the cancel, as this call saw it."""

    run_id: str
    outcome: Outcome
    detail: str
    revision: int
    children: tuple[CancelResult, ...] = ()


async def cancel_tree(
    tenancy: Tenancy, run_id: str, reason: str, by: str, *, children: bool
) -> CancelResult:
    """Cancel the run, then (``children``) each of its child runs, depth first."""
    store = tenancy.store
    run = await store.load(run_id)
    result = await _cancel_one(tenancy, run, Cancellation(reason, by, utcnow()))
    if not children:
        return result
    done: list[CancelResult] = []
    for child in await child_runs(store, run):
        try:
            done.append(await cancel_tree(tenancy, child.run_id, reason, by, children=True))
        except RunNotFound:  # deleted meanwhile
            continue
    return attrs.evolve(result, children=tuple(done))


async def _cancel_one(tenancy: Tenancy, run: Run, request: Cancellation) -> CancelResult:
    run_id, store = run.run_id, tenancy.store
    ended = _ended(run)
    if ended is not None:
        return CancelResult(run_id, "unchanged", ended, run.revision)
    before: Cancellation | None = None
    if isinstance(store, CancelsRuns):
        try:
            before = await store.request_cancel(run_id, request)
        except InvalidTransition:  # it came to rest meanwhile
            head = await store.load(run_id)
            return CancelResult(run_id, "unchanged", _ended(head) or "at rest", head.revision)
        request = before or request
    said = "" if before is None else f"; a cancel was asked for already ({_asked(before)})"
    driver = tenancy.drivers.get(run_id)
    if driver is not None and not driver.lost:  # this kernel holds it
        cancel_soon(driver, request)
        if driver.seats.driving and not driver.run.is_terminal:  # its drive stops at once
            detail = f"this kernel's drive stops it{said}"
            return CancelResult(run_id, "requested", detail, run.revision)
        await carry_out_cancel(driver)  # no drive goes on to obey it: carried out here
        detail = f"cancelled by {request.by}{said}"
        return CancelResult(run_id, "cancelled", detail, driver.run.revision)
    # A run at rest is held only briefly (a command, a drive letting it go): its lease is
    # waited for, as it is where no request can be kept; a live drive obeys the request.
    resting = run.is_terminal or run.state == "init"
    wait = 0.0 if isinstance(store, CancelsRuns) and not resting else None
    try:
        tenure = await tenancy.acquire(run_id, share=False, wait=wait)
    except RunBusy as busy:
        if not isinstance(store, CancelsRuns):
            raise ConfigError(
                f"run {run_id!r} is driven by {busy.owner} and {type(store).__name__} cannot"
                " keep a cancel request for it (CancelsRuns): cancel it once it is at rest"
            ) from busy
        detail = f"its owner {busy.owner} stops it at its next safe point{said}"
        return CancelResult(run_id, "requested", detail, run.revision)
    assert tenure is not None
    try:
        head = await store.load(run_id)
        telemetry.record_takeover(head, tenure.takeover())
        ended = _ended(head)
        if ended is not None:  # came to rest before the request (which was not kept)
            return CancelResult(run_id, "unchanged", ended, head.revision)
        owner = RunDriver(tenancy.kernel, head, tenure)
        cancel_soon(owner, request)
        await carry_out_cancel(owner)
        detail = f"cancelled by {request.by}{said}"
        return CancelResult(run_id, "cancelled", detail, owner.run.revision)
    finally:
        await tenancy.release_lease(tenure.lease)


def _ended(run: Run) -> str | None:
    """Why there is nothing to cancel in ``run`` (None: it can be cancelled)."""
    failure = run.failure
    if run.state == "failed" and failure is not None and failure.cancellation is not None:
        return f"already cancelled ({_asked(failure.cancellation)})"
    if run.state == "failed":
        error = failure.error if failure is not None else "unknown"
        return f"the run failed already ({error}): nothing runs; retry resumes it"
    if run.state == "completed":
        return "the run is completed: nothing runs"
    return None


def _asked(request: Cancellation) -> str:
    why = f": {request.reason}" if request.reason else ""
    return f"by {request.by} at {request.at.isoformat(timespec='seconds')}{why}"
