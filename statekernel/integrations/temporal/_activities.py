"""The activities of a run's workflow, which do its I/O through a ``Kernel``: a drive
segment (the run driven to its next rest), a command, and the start of a run the
workflow was started to start.

Temporal retries an activity whose worker died (no heartbeat within the workflow's
``heartbeat_timeout``) or that raised, possibly on another worker and while the first
one's drive may still be alive somewhere. That is safe because statekernel decides what
runs again, not the retry: the retried drive takes the run's lease (waiting out a live
owner for the kernel's ``busy_timeout``, then ``RunBusy``, which Temporal retries again),
resumes from the last commit, re-runs idempotent calls left in flight with their
idempotency key and pauses the run with ``uncertain_tool_calls`` on any other. Tools get
the lease's fencing token as always.

A drive heartbeats the revision of each commit it sees land, and every third of the
heartbeat timeout besides (a long tool call commits nothing while it runs).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from typing import Any, cast

from temporalio import activity
from temporalio.exceptions import ApplicationError

from statekernel._kernel.due import next_due
from statekernel._kernel.kernel import Kernel
from statekernel._records.events import Event
from statekernel._records.run import Run
from statekernel._secrets import logger
from statekernel.errors import (
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    InvalidArgument,
    InvalidTransition,
    RunNotFound,
)
from statekernel.integrations.temporal._payloads import COMMAND, DRIVE, START, Command, Segment
from statekernel.integrations.temporal._starting import limits_of, start_arguments

__all__ = ["KernelActivities", "segment_of"]

log = logger("statekernel.temporal")

_FINAL = (ConfigError, CorruptCheckpoint, InvalidArgument, InvalidTransition, RunNotFound)
"""Errors a retry cannot cure: the activity fails at once (an update gets the error)."""


def segment_of(run: Run) -> Segment:
    """The payload that says where ``run`` is: revision, state, and a pause's reason and
    due time or a failure's error."""
    if run.state == "paused" and run.pause is not None:
        due = next_due(run)
        at = None if due is None else due.timestamp()
        return Segment(run.run_id, run.revision, run.state, run.pause.reason, at)
    if run.state == "failed" and run.failure is not None:
        failure = run.failure
        return Segment(run.run_id, run.revision, run.state, failure.error, None, failure.message)
    return Segment(run.run_id, run.revision, run.state)


class KernelActivities:
    """The activities of ``RunWorkflow`` bound to ``kernel`` (one per worker process; the
    caller opens and closes it). ``all()`` lists them for a ``temporalio.worker.Worker``."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel

    def all(self) -> Sequence[Callable[..., Any]]:
        """The activity functions, to register with a worker."""
        return [self.drive, self.command, self.start]

    @activity.defn(name=START)
    async def start(self, run_id: str, spec: dict[str, Any]) -> Segment:
        """Create the run from ``spec`` (``RunOptions.start``) unless it exists: a start
        retried, or the run's workflow started again, finds it. Returns where it is."""
        kernel = self.kernel
        with _final_errors():
            try:
                run = await kernel.get(run_id)
            except RunNotFound:
                try:
                    run = await kernel.start(run_id=run_id, **start_arguments(spec))
                except ConflictError:  # another attempt created it meanwhile
                    run = await kernel.get(run_id)
        return segment_of(run)

    @activity.defn(name=DRIVE)
    async def drive(self, run_id: str) -> Segment:
        """Drive the run until it is at rest (paused, failed or completed); firing a due
        pause timer first. Returns where it rests."""
        revision = -1
        info = activity.info()
        if info.attempt > 1:
            seen = info.heartbeat_details[0] if info.heartbeat_details else "none"
            log.info(
                "run %s: drive retried (attempt %d, last revision seen %s)",
                run_id,
                info.attempt,
                seen,
            )

        async def beat() -> None:
            every = _beat_every()
            while True:
                await asyncio.sleep(every)
                activity.heartbeat(revision)

        beating = asyncio.create_task(beat())
        try:
            with _final_errors():
                run = cast("AsyncGenerator[Event, None]", self.kernel.run(run_id))
                async with contextlib.aclosing(run) as events:
                    async for event in events:
                        if event.persisted and event.revision != revision:
                            revision = event.revision
                            activity.heartbeat(revision)
                return segment_of(await self.kernel.get(run_id))
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    @activity.defn(name=COMMAND)
    async def command(self, command: Command) -> Segment:
        """Apply ``command`` to its run; returns where the run is after it. A retried
        command whose first attempt's commit landed is not applied again."""
        kernel, run_id = self.kernel, command.run_id
        with _final_errors():
            if activity.info().attempt > 1 and await _landed(kernel, command):
                log.info("run %s: %s retried after its commit landed", run_id, command.kind)
                return segment_of(await kernel.get(run_id))
            if command.kind == "resume":
                limits = limits_of(command.limits)
                run = await kernel.resume(run_id, value=command.value, limits=limits)
            elif command.kind == "send":
                run = await kernel.send(run_id, *command.messages)
            elif command.kind == "resolve":
                run = await _resolve(kernel, command)
            elif command.kind == "cancel":
                await kernel.cancel(run_id, command.reason)
                run = await kernel.get(run_id)
            else:
                raise InvalidArgument(f"unknown command {command.kind!r}")
        return segment_of(run)


_LANDED = {"resume": "run_resumed", "send": "input_received", "resolve": "tool_call_resolved"}
"""The event a command's commit writes (a cancel is applied again: it is idempotent)."""


async def _landed(kernel: Kernel, command: Command) -> bool:
    """Whether the commit of ``command`` is in its run's log: an event of its kind (for a
    resolve, of its call) after the revision the workflow had seen when it sent it. The
    workflow sends one command at a time, so such an event is this command's; a process
    that changed the run outside the workflow meanwhile may make it another's."""
    kind = _LANDED.get(command.kind)
    if kind is None or command.revision < 0:
        return False
    for event in await kernel.events(command.run_id, after_revision=command.revision):
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == kind and (
            command.kind != "resolve" or data.get("call_id") == command.call_id
        ):
            return True
    return False


async def _resolve(kernel: Kernel, command: Command) -> Run:
    if command.rerun:
        return await kernel.resolve_tool_call(command.run_id, command.call_id, rerun=True)
    if command.error is not None:
        return await kernel.resolve_tool_call(command.run_id, command.call_id, error=command.error)
    return await kernel.resolve_tool_call(command.run_id, command.call_id, output=command.value)


def _beat_every() -> float:
    timeout = activity.info().heartbeat_timeout
    return timeout.total_seconds() / 3 if timeout else 10.0


@contextlib.contextmanager
def _final_errors() -> Iterator[None]:
    """Errors no retry cures become non-retryable application errors (their type named)."""
    try:
        yield
    except _FINAL as exc:
        raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from exc
