"""The workflow of one run: drive segments as activities, commands as updates, pause
timers as durable timers, continue-as-new on long runs.

Workflow code is deterministic: it keeps no clock but ``workflow.now()``, does no I/O and
imports nothing of statekernel but the payload types (the worker passes ``statekernel``
through Temporal's sandbox). Its history holds ids, revisions, states and the values of
the commands given to it, never a transcript.

The loop: drive the run to its next rest (the ``statekernel.drive`` activity); completed
or failed ends the workflow (a completed run waits for input with ``keep_open``); paused
waits for a command or for the pause's due time, whichever comes first, and drives again
(a due timer is fired by the drive, under the run's lease, exactly once). A command
applied while a drive runs wakes the loop after it: the ``woken`` flag is cleared before
each drive, never after, so no command is missed. Commands are applied one at a time, each
carrying the revision the workflow has seen, so that a command activity retried after its
commit landed (its worker died before reporting) is not applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError

from statekernel.integrations.temporal._payloads import (
    COMMAND,
    DRIVE,
    START,
    WORKFLOW,
    Command,
    RunOptions,
    Segment,
)

__all__ = ["RunWorkflow"]

_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
_COMMAND_TIMEOUT = timedelta(minutes=5)
_TIMER_GRACE = 0.5
"""Seconds added to a pause's due time before the drive that fires it (the store's clock
and the server's may differ a little; a drive that comes early finds nothing due)."""


@workflow.defn(name=WORKFLOW)
class RunWorkflow:
    """Drives one statekernel run to completion (see the module). Its updates apply
    commands to the run and return where it is after them; ``wake`` tells it something
    changed (input sent by ``Kernel.send`` elsewhere, say)."""

    @workflow.init
    def __init__(self, options: RunOptions) -> None:
        self._options = options
        self._woken = False
        self._cancelled = False
        self._last: Segment | None = None
        self._seen = -1
        """The newest revision a drive or a command reported."""
        self._commands = asyncio.Lock()

    @workflow.run
    async def run(self, options: RunOptions) -> Segment:
        """Drive the run until it is completed, failed or cancelled; returns where it ended.

        Cancelling the workflow (``WorkflowHandle.cancel``) cancels the run as the
        ``cancel`` update does, then ends the workflow cancelled."""
        try:
            return await self._loop(options)
        except (asyncio.CancelledError, ActivityError) as exc:
            cancelled = isinstance(exc, asyncio.CancelledError) or isinstance(
                exc.cause, CancelledError
            )
            if cancelled and not self._cancelled:
                await self._command(Command(options.run_id, "cancel", reason="workflow cancelled"))
                self._cancelled = True
                self._last = await self._drive(options)  # carries the cancel out, or sees it
            raise

    async def _loop(self, options: RunOptions) -> Segment:
        if options.start is not None:  # the run to create first (unless it exists)
            made: Segment = await workflow.execute_activity(
                START,
                args=[options.run_id, options.start],
                result_type=Segment,
                start_to_close_timeout=_COMMAND_TIMEOUT,
                retry_policy=_RETRY,
            )
            self._seen = max(self._seen, made.revision)
        done = 0
        while True:
            self._woken = False
            segment = await self._drive(options)
            self._last = segment
            done += 1
            if self._cancelled or segment.state == "failed":
                return await self._finish(segment)
            if segment.state == "completed" and not options.keep_open:
                return await self._finish(segment)
            if segment.state in ("paused", "completed"):
                await self._wait(segment)
                if self._cancelled:
                    return await self._finish(segment)
            if done >= options.max_segments or workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                carried = {**vars(options), "segments": options.segments + done, "start": None}
                next_options = RunOptions(**carried)
                workflow.continue_as_new(next_options)

    async def _drive(self, options: RunOptions) -> Segment:
        segment: Segment = await workflow.execute_activity(
            DRIVE,
            options.run_id,
            result_type=Segment,
            start_to_close_timeout=timedelta(seconds=options.segment_timeout),
            heartbeat_timeout=timedelta(seconds=options.heartbeat_timeout),
            retry_policy=_RETRY,
        )
        self._seen = max(self._seen, segment.revision)
        return segment

    async def _wait(self, segment: Segment) -> None:
        """Until a command wakes the workflow or the segment's due time (a durable timer)."""
        timeout = None
        if segment.due is not None:
            left = segment.due - workflow.now().timestamp()
            timeout = timedelta(seconds=max(left, 0.0) + _TIMER_GRACE)
        with contextlib.suppress(TimeoutError):  # due: the next drive fires the timer
            await workflow.wait_condition(lambda: self._woken, timeout=timeout)

    async def _finish(self, segment: Segment) -> Segment:
        """The workflow's result, once its updates are done: for a cancelled run, where
        it ended (a drive obeys the cancel, or finds the run failed already)."""
        if self._cancelled and segment.state != "failed":
            segment = await self._drive(self._options)
            self._last = segment
        await workflow.wait_condition(workflow.all_handlers_finished)
        return segment

    async def _command(self, command: Command) -> Segment:
        async with self._commands:  # one at a time: each knows the revision before it
            command.revision = self._seen
            segment: Segment = await workflow.execute_activity(
                COMMAND,
                command,
                result_type=Segment,
                start_to_close_timeout=_COMMAND_TIMEOUT,
                retry_policy=_RETRY,
            )
            self._seen = max(self._seen, segment.revision)
        self._woken = True
        return segment

    def _run_id(self) -> str:
        return self._options.run_id

    @workflow.update
    async def resume(self, value: Any = None, limits: dict[str, Any] | None = None) -> Segment:
        """Resume the paused run (``Kernel.resume``): ``value`` answers its question or
        approval; ``limits`` (``statekernel.to_plain(Limits(...))``) replaces the run's
        limits (a run paused with ``limit_reached`` needs its limit raised). Returns the
        run after the resume's commit."""
        command = Command(self._run_id(), "resume", value=value, given=True, limits=limits)
        return await self._command(command)

    @workflow.update
    async def send(self, text: str) -> Segment:
        """A user message to the paused or completed run (``Kernel.send``)."""
        return await self._command(Command(self._run_id(), "send", messages=[text]))

    @workflow.update
    async def resolve(
        self, call_id: str, output: Any = None, error: str | None = None, rerun: bool = False
    ) -> Segment:
        """Say what happened to an uncertain call (``Kernel.resolve_tool_call``): its
        ``output``, or ``error``, or ``rerun=True``."""
        given = error is None and not rerun
        command = Command(
            self._run_id(), "resolve", value=output, given=given, call_id=call_id, error=error
        )
        command.rerun = rerun
        return await self._command(command)

    @workflow.update
    async def cancel(self, reason: str = "") -> Segment:
        """Cancel the run (``Kernel.cancel``, committed first and obeyed by its drive at
        the next safe point); the workflow then ends with the run failed (``Cancelled``)."""
        segment = await self._command(Command(self._run_id(), "cancel", reason=reason))
        self._cancelled = True
        return segment

    @workflow.signal
    def wake(self) -> None:
        """Something changed on the run outside the workflow: drive it again."""
        self._woken = True

    @workflow.query
    def position(self) -> Segment | None:
        """Where the last drive segment or command left the run (None before the first)."""
        return self._last
