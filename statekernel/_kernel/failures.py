"""What a run at rest tells the caller who cannot go on with it: the ``RunFailed`` a
drive raises when asked to (``raise_on_failure=True``), and the way out named in the
``InvalidTransition`` of a command the run refuses (``retry`` a failed run, ``send`` to
a completed one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from statekernel._records.run import DEADLINE_EXCEEDED, OUTPUT_INVALID, PAUSE_TIMED_OUT, Run
from statekernel.errors import (
    DeadlineExceeded,
    InvalidTransition,
    OutputInvalid,
    PauseTimedOut,
    RunCancelled,
    RunFailed,
)

__all__ = ["SHOWN", "explained", "run_failed", "shortened", "way_out"]

SHOWN = 200
"""Characters of a failure's message an error or a log line shows."""


def shortened(message: str, limit: int = SHOWN) -> str:
    """``message`` cut to ``limit`` characters (an ellipsis says it was cut)."""
    return message if len(message) <= limit else message[: limit - 1] + "…"


def run_failed(run: Run) -> RunFailed:
    """The ``RunFailed`` of a failed run (its committed failure)."""
    failure = run.failure
    if failure is None:  # a failed run always holds its failure; never a bare error
        return RunFailed(run.run_id, "unknown", "no failure recorded", run.state, run.revision)
    if failure.cancellation is not None and failure.error == DEADLINE_EXCEEDED:
        return DeadlineExceeded(run.run_id, failure.message, failure.failed_in, run.revision)
    if failure.cancellation is not None and failure.error == PAUSE_TIMED_OUT:
        return PauseTimedOut(run.run_id, failure.message, failure.failed_in, run.revision)
    if failure.cancellation is not None:
        by = failure.cancellation.by
        return RunCancelled(run.run_id, failure.message, failure.failed_in, run.revision, by)
    if failure.error == OUTPUT_INVALID:
        return OutputInvalid(run.run_id, failure.message, failure.failed_in, run.revision)
    return RunFailed(run.run_id, failure.error, failure.message, failure.failed_in, run.revision)


def way_out(run: Run, event: str) -> str | None:
    """What the caller can do with ``run`` instead of ``event``, or None: a failed run
    names its failure and ``retry``; a completed one takes new input with ``send``."""
    if run.state == "failed" and event != "retry":
        failure = run.failure
        what = (
            f"{failure.error}: {shortened(failure.message)} (in {failure.failed_in})"
            if failure is not None
            else "no failure recorded"
        )
        return (
            f"run {run.run_id!r} failed with {what}; kernel.retry(run_id) resumes it from"
            " where it failed"
        )
    if run.state == "completed" and event != "input":
        return (
            f"run {run.run_id!r} is completed; kernel.send(run_id, message) gives it new"
            " input and the next drive goes on from there"
        )
    return None


@contextlib.contextmanager
def explained(run: Run) -> Iterator[None]:
    """Re-raise an ``InvalidTransition`` of a command on ``run`` with its way out (see
    ``way_out``) added to the detail, ``from`` the original."""
    try:
        yield
    except InvalidTransition as exc:
        hint = way_out(run, exc.event)
        if hint is None or exc.state != run.state:
            raise
        detail = f"{exc.detail}; {hint}" if exc.detail else hint
        raise InvalidTransition(exc.event, exc.state, detail) from exc
