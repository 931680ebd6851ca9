"""Runs driven by DBOS: the engine queues, schedules, retries and recovers; statekernel
decides what may run again.

A *segment* is a run driven to its next rest (completed, paused or failed). Each one is a
DBOS workflow whose id is ``<run_id>@<revision>`` (the revision the segment starts from)
and whose one step drives the run with a kernel: enqueueing the same segment twice gives
one workflow, and the step's result is a small ``Segment`` (run id, state, revision,
failure), never the transcript. Flow control is DBOS's own: the queue named here is a
queue registered with ``DBOS.register_queue`` (concurrency, worker concurrency, partitions,
rate limits), and each enqueue takes ``SetEnqueueOptions``'s options (priority, partition
key, delay, deduplication id).

After a crash DBOS recovers the pending workflow and runs its step again; the kernel's
resume decides what that step does: an idempotent tool call in flight runs again, any
other pauses the run with ``uncertain_tool_calls`` (never a second execution). A dead
process's lease on a run expires within the kernel's ``lease_ttl``; the recovered step
waits for it (the kernel's ``busy_timeout``, then DBOS retries the step on ``RunBusy``).

The kernel lives on an event loop of its own thread (a ``KernelThread``, made on first
use by the factory given), shared by the steps (DBOS runs them in its worker threads)
and the commands (``start``, ``resume``...), which are synchronous like DBOS's own API:
call them from async code with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Required, TypedDict, TypeVar, cast

from dbos import DBOS, SetEnqueueOptions, SetWorkflowID, WorkflowHandle

from statekernel._kernel.cancelling import CancelResult
from statekernel._kernel.due import next_due
from statekernel._kernel.kernel import NOT_GIVEN, Kernel
from statekernel._records.arguments import new_run_id_arg
from statekernel._records.fallback import Fallback
from statekernel._records.limits import Limits
from statekernel._records.messages import JSON, Message
from statekernel._records.run import Run
from statekernel.blocking import KernelThread
from statekernel.errors import (
    ConflictError,
    InvalidArgument,
    LeaseLost,
    RunBusy,
    StatekernelError,
    StoreError,
)

__all__ = ["EnqueueOptions", "RunSpec", "Segment", "StatekernelDBOS", "segment_id"]

T = TypeVar("T")

_ACTIVE = ["ENQUEUED", "PENDING", "DELAYED"]
"""DBOS statuses of a workflow that has not ended."""


class Segment(TypedDict):
    """What a segment's workflow returns: where the run rests (the engine keeps this, never
    the transcript)."""

    run_id: str
    state: str
    """``completed``, ``paused`` or ``failed``."""
    revision: int
    """The run's revision at rest."""
    failure: str | None
    """``"<error>: <message>"`` of a failed run."""
    due_in: float | None
    """Seconds until a paused run's timer (or deadline) is due; None without one."""


class EnqueueOptions(TypedDict, total=False):
    """DBOS's enqueue options (``SetEnqueueOptions``) for a segment."""

    priority: int
    queue_partition_key: str
    delay_seconds: float
    deduplication_id: str
    app_version: str


class RunSpec(TypedDict, total=False):
    """The run a schedule starts at each tick (``Kernel.start``'s arguments)."""

    model: Required[str | Fallback]
    messages: list[Message | str]
    context: JSON
    max_turns: int | None
    timeout: float | None
    limits: Limits | None
    tags: Mapping[str, str] | None


class StatekernelDBOS:
    """Drives statekernel runs as DBOS workflows, one workflow per segment.

    Make it before ``DBOS.launch()`` (it registers its workflows and steps with DBOS, under
    names that start with ``name``), and make the same one in every process of the
    application, so that any of them runs or recovers the segments. ``make_kernel`` builds
    the process's kernel (its store, tools, hooks and providers), on first use.

    ``queue`` names the DBOS queue segments go to by default: register it after launch
    with ``DBOS.register_queue(queue, ...)`` and its flow control applies to every run.
    ``drive_attempts``: how many times DBOS runs a segment's step while another owner
    holds the run (``RunBusy``), or the store is unreachable, before the workflow errs.

    Commands (``start``, ``submit``, ``resume``, ``send``, ``resolve_tool_call``,
    ``retry``, ``cancel``, ``schedule``) need DBOS launched; they block the calling
    thread (from async code: ``await asyncio.to_thread(app.resume, ...)``).
    """

    def __init__(
        self,
        make_kernel: Callable[[], Kernel],
        *,
        queue: str = "statekernel",
        name: str = "statekernel",
        drive_attempts: int = 30,
    ) -> None:
        if not callable(make_kernel):
            raise InvalidArgument(f"make_kernel must be callable, got {make_kernel!r}")
        for what, value in (("queue", queue), ("name", name)):
            if type(value) is not str or not value:
                raise InvalidArgument(f"{what} must be a non-empty str, got {value!r}")
        if type(drive_attempts) is not int or drive_attempts < 1:
            raise InvalidArgument(
                f"drive_attempts must be an int of at least 1, got {drive_attempts!r}"
            )
        self.queue = queue
        self.name = name
        self._make = make_kernel
        self._kernel: KernelThread | None = None
        self._kernel_pid = 0
        """The process that made ``_kernel`` (a forked child makes its own)."""
        self._lock = threading.Lock()
        self._schedules: dict[str, Callable[[datetime], RunSpec]] = {}
        self._register(drive_attempts)

    # -- the workflows -------------------------------------------------------------

    def _register(self, attempts: int) -> None:
        @DBOS.step(
            name=f"{self.name}.drive",
            retries_allowed=True,
            interval_seconds=1.0,
            backoff_rate=1.2,
            max_attempts=attempts,
            should_retry=_retried,
        )
        def drive(run_id: str) -> Segment:
            return self._call(lambda kernel: _drive(kernel, run_id))

        @DBOS.workflow(name=f"{self.name}.segment")
        def segment(run_id: str, revision: int, queue: str, options: EnqueueOptions) -> Segment:
            rest = drive(run_id)
            while rest["due_in"] is not None and rest["revision"] == revision:
                DBOS.sleep(max(rest["due_in"], 0.05))  # due already, by another clock
                rest = drive(run_id)
            if rest["due_in"] is not None:  # the next segment starts when the timer is due
                later: EnqueueOptions = {**_carried(options), "delay_seconds": rest["due_in"]}
                self._enqueue(run_id, rest["revision"], queue, later)
            return rest

        @DBOS.step(name=f"{self.name}.start_scheduled")
        def start_scheduled(schedule: str, when: datetime) -> tuple[str, int]:
            spec = self._schedules.get(schedule)
            if spec is None:
                raise StatekernelError(
                    f"schedule {schedule!r} is not known to this process: call "
                    "StatekernelDBOS.schedule in every process of the application"
                )
            run_id = f"{schedule}.{when.astimezone(UTC):%Y%m%dT%H%M%SZ}"
            return run_id, self._call(lambda kernel: _start_once(kernel, run_id, spec(when)))

        @DBOS.workflow(name=f"{self.name}.scheduled")
        def scheduled(when: datetime, context: Any) -> None:
            run_id, revision = start_scheduled(context["schedule"], when)
            options = cast("EnqueueOptions", context["options"])
            self._enqueue(run_id, revision, context["queue"], options)

        self._segment = segment
        self._scheduled = scheduled

    # -- the kernel ----------------------------------------------------------------

    def _call(self, fn: Callable[[Kernel], Awaitable[T]]) -> T:
        with self._lock:
            if self._kernel is None or self._kernel_pid != os.getpid():
                self._kernel = KernelThread(self._make, name="statekernel-dbos")
                self._kernel_pid = os.getpid()
            thread = self._kernel
        return thread.call(fn)

    def close(self) -> None:
        """Close the kernel (its store connections and leases); it is made again on next use."""
        with self._lock:
            thread, self._kernel = self._kernel, None
        if thread is not None:
            thread.close()

    # -- enqueueing segments -------------------------------------------------------

    def _enqueue(
        self, run_id: str, revision: int, queue: str | None, options: EnqueueOptions
    ) -> WorkflowHandle[Segment]:
        queue = queue or self.queue
        with contextlib.ExitStack() as stack:
            if options:
                stack.enter_context(SetEnqueueOptions(**options))
            stack.enter_context(SetWorkflowID(segment_id(run_id, revision)))
            return DBOS.enqueue_workflow(queue, self._segment, run_id, revision, queue, options)

    def _then(
        self, run: Run, queue: str | None, options: EnqueueOptions
    ) -> WorkflowHandle[Segment]:
        """Enqueue the segment that drives ``run`` on from where it is (a paused run with a
        timer: when it is due)."""
        due = _due_in(run)
        if due is not None and "delay_seconds" not in options:
            options = {**options, "delay_seconds": due}
        return self._enqueue(run.run_id, run.revision, queue, options)

    def submit(
        self, run_id: str, *, queue: str | None = None, **options: Any
    ) -> WorkflowHandle[Segment]:
        """Enqueue the segment that drives the run from its current revision (on ``queue``,
        default the one given at construction) with ``SetEnqueueOptions``'s ``options``
        (``priority``, ``queue_partition_key``, ``delay_seconds``, ``deduplication_id``,
        ``app_version``). The same segment enqueued again is the same workflow.

        Returns:
            DBOS's handle of the segment's workflow (``get_result()`` is its ``Segment``).

        Raises:
            RunNotFound: no run has this id.
        """
        checked = _options(options)
        run = self._call(lambda kernel: kernel.get(run_id))
        return self._then(run, queue, checked)

    def start(
        self,
        *,
        model: str | Fallback,
        messages: list[Message | str] | tuple[Message | str, ...] = (),
        context: JSON = None,
        run_id: str | None = None,
        limits: Limits | None = None,
        tags: Mapping[str, str] | None = None,
        queue: str | None = None,
        **options: Any,
    ) -> WorkflowHandle[Segment]:
        """Start a run (``Kernel.start``'s ``model``, a model string or a ``Fallback``
        chain, ``messages``, ``context``, ``run_id``, ``limits`` and ``tags``, all stored
        with the run by the kernel, so the engine carries only its id) and enqueue its
        first segment (``submit``'s ``queue`` and ``options``).

        Returns:
            DBOS's handle of the first segment's workflow.

        Raises:
            InvalidArgument: an argument ``Kernel.start`` refuses (``InvalidTag`` for a
                tag), before anything is started or enqueued.

        An enqueue DBOS refuses (``DBOSQueueDeduplicatedError``: the deduplication id is
        in use) leaves the run started, at ``init``: ``submit`` it later.
        """
        checked = _options(options)
        run = self._call(
            lambda kernel: kernel.start(
                model=model,
                messages=messages,
                context=context,
                run_id=run_id,
                limits=limits,
                tags=tags,
            )
        )
        return self._then(run, queue, checked)

    def resume(
        self,
        run_id: str,
        *,
        value: JSON = NOT_GIVEN,
        limits: Limits | None = None,
        queue: str | None = None,
        **options: Any,
    ) -> WorkflowHandle[Segment]:
        """``Kernel.resume`` (``value``: an answer, an approval; ``limits``: the run's new
        ``Limits``, which a run paused with ``limit_reached`` needs raised), then enqueue
        the next segment."""
        checked = _options(options)
        run = self._call(lambda kernel: kernel.resume(run_id, value=value, limits=limits))
        return self._then(run, queue, checked)

    def send(
        self, run_id: str, *messages: Message | str, queue: str | None = None, **options: Any
    ) -> WorkflowHandle[Segment]:
        """``Kernel.send`` (new input), then enqueue the next segment."""
        checked = _options(options)
        run = self._call(lambda kernel: kernel.send(run_id, *messages))
        return self._then(run, queue, checked)

    def resolve_tool_call(
        self,
        run_id: str,
        call_id: str,
        *,
        queue: str | None = None,
        enqueue: EnqueueOptions | None = None,
        **resolution: Any,
    ) -> WorkflowHandle[Segment]:
        """``Kernel.resolve_tool_call`` (``output=``, ``error=`` or ``rerun=True``), then
        enqueue the next segment (``enqueue``: its options). A run still waiting on other
        uncertain calls gets a segment that finds it paused and ends at once."""
        checked = _options(dict(enqueue or {}))
        run = self._call(lambda kernel: kernel.resolve_tool_call(run_id, call_id, **resolution))
        return self._then(run, queue, checked)

    def retry(
        self, run_id: str, *, queue: str | None = None, **options: Any
    ) -> WorkflowHandle[Segment]:
        """``Kernel.retry`` (a failed or cancelled run returns to where it failed), then
        enqueue the next segment."""
        checked = _options(options)
        run = self._call(lambda kernel: kernel.retry(run_id))
        return self._then(run, queue, checked)

    def cancel(self, run_id: str, reason: str = "", *, by: str | None = None) -> CancelResult:
        """Cancel the run (``Kernel.cancel``: committed first, obeyed by whoever drives it)
        and its segments' workflows that have not ended (enqueued, delayed or running).

        Returns:
            What ``Kernel.cancel`` did.
        """
        found = DBOS.list_workflows(
            workflow_id_prefix=f"{run_id}@",
            status=_ACTIVE,
            load_input=False,
            load_output=False,
        )
        ids = [status.workflow_id for status in found]
        if ids:  # first: a segment that ends now (the run cancelled) must not go on
            DBOS.cancel_workflows(ids)
        return self._call(lambda kernel: kernel.cancel(run_id, reason, by=by))

    # -- schedules -----------------------------------------------------------------

    def schedule(
        self,
        name: str,
        cron: str,
        spec: Callable[[datetime], RunSpec],
        *,
        queue: str | None = None,
        cron_timezone: str | None = None,
        **options: Any,
    ) -> None:
        """Start a run at each tick of ``cron`` (DBOS's cron, seconds first when it has six
        fields): ``spec(tick)`` gives its ``model``, ``messages``... and the run's id is
        ``<name>.<tick, UTC>`` (a tick never starts two runs); its first segment goes to
        ``queue`` with ``options``.

        Call it after ``DBOS.launch()``, in every process (each keeps ``spec``; the
        schedule itself is stored once, by DBOS, and fired once per tick).
        """
        new_run_id_arg(f"{name}.20000101T000000Z")  # the run ids it makes must be valid
        if not callable(spec):
            raise InvalidArgument(f"spec must be callable, got {spec!r}")
        checked = _options(options)
        self._schedules[name] = spec
        context = {"schedule": name, "queue": queue or self.queue, "options": dict(checked)}
        DBOS.apply_schedules(
            [
                {
                    "schedule_name": name,
                    "workflow_fn": self._scheduled,
                    "schedule": cron,
                    "context": context,
                    "cron_timezone": cron_timezone,
                }
            ]
        )


def segment_id(run_id: str, revision: int) -> str:
    """The id of the workflow of the segment that drives ``run_id`` from ``revision``."""
    return f"{run_id}@{revision}"


_OPTIONS = frozenset(EnqueueOptions.__annotations__)
_Kept = Literal["priority", "queue_partition_key", "app_version"]


def _options(given: dict[str, Any]) -> EnqueueOptions:
    unknown = sorted(set(given) - _OPTIONS)
    if unknown:
        raise InvalidArgument(f"unknown enqueue options {unknown}: give any of {sorted(_OPTIONS)}")
    return cast("EnqueueOptions", {k: v for k, v in given.items() if v is not None})


def _carried(options: EnqueueOptions) -> EnqueueOptions:
    """The options a segment passes on to the next one it enqueues: not its delay nor its
    deduplication id."""
    kept: tuple[_Kept, ...] = ("priority", "queue_partition_key", "app_version")
    return cast("EnqueueOptions", {k: options[k] for k in kept if k in options})


def _retried(error: BaseException) -> bool:
    """Whether DBOS runs a segment's step again after ``error``: while another owner
    holds the run, or took it over, or the store is unreachable."""
    return isinstance(error, RunBusy | LeaseLost | StoreError)


def _due_in(run: Run) -> float | None:
    """Seconds until a paused run's timer or deadline is due (0 when due); None when it
    has neither, or is not paused."""
    due = next_due(run)
    return None if due is None else max((due - datetime.now(UTC)).total_seconds(), 0.0)


def _summary(run: Run) -> Segment:
    failure = run.failure
    return {
        "run_id": run.run_id,
        "state": run.state,
        "revision": run.revision,
        "failure": f"{failure.error}: {failure.message}" if failure else None,
        "due_in": _due_in(run),
    }


async def _drive(kernel: Kernel, run_id: str) -> Segment:
    """Drive the run to its next rest; where it rests."""
    async for _ in kernel.run(run_id):
        pass
    return _summary(await kernel.get(run_id))


async def _start_once(kernel: Kernel, run_id: str, spec: RunSpec) -> int:
    """Start the run of a schedule's tick, unless it exists (the step ran before a crash);
    its revision."""
    try:
        run = await kernel.start(run_id=run_id, **spec)
    except ConflictError:
        run = await kernel.get(run_id)
    return run.revision
