"""Wiring: a Temporal worker that runs statekernel runs, and starting a run's workflow."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import Priority, WorkflowIDConflictPolicy
from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from statekernel._kernel.kernel import Kernel
from statekernel._records.arguments import new_run_id_arg
from statekernel._records.fallback import Fallback
from statekernel._records.limits import Limits
from statekernel._records.messages import JSON, Message
from statekernel.errors import InvalidArgument
from statekernel.integrations.temporal._activities import KernelActivities
from statekernel.integrations.temporal._payloads import RunOptions, Segment, workflow_id
from statekernel.integrations.temporal._starting import start_spec
from statekernel.integrations.temporal._workflow import RunWorkflow

__all__ = ["sandbox_runner", "start_run_workflow", "statekernel_plugin", "statekernel_worker"]


def sandbox_runner() -> SandboxedWorkflowRunner:
    """Temporal's workflow sandbox with ``statekernel`` passed through (imported once,
    outside the sandbox: the workflow uses its payload types only). Give it to a worker
    you build yourself with ``RunWorkflow``."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules("statekernel")
    return SandboxedWorkflowRunner(restrictions=restrictions)


def statekernel_worker(
    client: Client, kernel: Kernel, *, task_queue: str, **options: Any
) -> Worker:
    """A ``temporalio.worker.Worker`` on ``task_queue`` running ``RunWorkflow`` and its
    activities, which drive runs with ``kernel`` (open it before the worker runs, close
    it after). ``options`` go to ``Worker`` (``max_concurrent_activities``, ``identity``...)."""
    activities = KernelActivities(kernel)
    options.setdefault("workflow_runner", sandbox_runner())
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[RunWorkflow],
        activities=activities.all(),
        **options,
    )


def statekernel_plugin(kernel: Kernel) -> SimplePlugin:
    """A Temporal worker plugin (``Worker(client, task_queue=..., plugins=[...])``) that
    adds ``RunWorkflow`` and its activities driving runs with ``kernel``, and runs
    workflows in ``sandbox_runner()``'s sandbox (a runner other than the sandbox, such as
    ``UnsandboxedWorkflowRunner``, is kept)."""
    activities = KernelActivities(kernel)

    def runner(given: WorkflowRunner | None) -> WorkflowRunner:
        if given is None or isinstance(given, SandboxedWorkflowRunner):
            return sandbox_runner()
        return given

    return SimplePlugin(
        "statekernel",
        workflows=lambda given: [*(given or []), RunWorkflow],
        activities=lambda given: [*(given or []), *activities.all()],
        workflow_runner=runner,
    )


async def start_run_workflow(
    client: Client,
    run_id: str,
    *,
    task_queue: str,
    priority: Priority | None = None,
    keep_open: bool = False,
    max_segments: int = 200,
    heartbeat_timeout: float = 30.0,
    segment_timeout: float = 3600.0,
    model: str | Fallback | None = None,
    messages: Iterable[Message | str] = (),
    context: JSON = None,
    limits: Limits | None = None,
    tags: Mapping[str, str] | None = None,
    **options: Any,
) -> WorkflowHandle[RunWorkflow, Segment]:
    """Start the workflow of ``run_id`` on ``task_queue``, or get the one already
    running: its id is ``workflow_id(run_id)`` and a second start of a running run's
    workflow returns the first's handle (pass
    ``id_conflict_policy=WorkflowIDConflictPolicy.FAIL`` to get
    ``WorkflowAlreadyStartedError`` instead). ``priority``: the workflow's Temporal
    priority, which its drive segments inherit. See ``RunOptions`` for the rest;
    ``options`` go to ``Client.start_workflow``.

    Without ``model``, the run exists already (made with ``Kernel.start``). With it, the
    workflow starts the run first, in a worker, unless a run with this id exists:
    ``model`` (a model string or a ``Fallback`` chain), ``messages``, ``context``,
    ``limits`` and ``tags`` are ``Kernel.start``'s, checked here and carried in the
    workflow's input (its history holds them, the first messages included).

    Raises:
        InvalidArgument: an option out of range, a start argument ``Kernel.start`` would
            refuse (``InvalidTag`` for a tag), or one given without ``model``.
    """
    if max_segments < 1:
        raise InvalidArgument(f"max_segments must be at least 1, got {max_segments!r}")
    if heartbeat_timeout <= 0 or segment_timeout <= 0:
        raise InvalidArgument("heartbeat_timeout and segment_timeout must be positive")
    start = None
    if model is not None:
        new_run_id_arg(run_id)
        start = start_spec(model, messages, context, limits, tags)
    elif messages or context is not None or limits is not None or tags is not None:
        raise InvalidArgument(
            "messages, context, limits and tags start a run: give its model too (without"
            " model, start_run_workflow drives a run made with Kernel.start)"
        )
    run_options = RunOptions(
        run_id,
        keep_open=keep_open,
        max_segments=max_segments,
        heartbeat_timeout=heartbeat_timeout,
        segment_timeout=segment_timeout,
        start=start,
    )
    options.setdefault("id_conflict_policy", WorkflowIDConflictPolicy.USE_EXISTING)
    if priority is not None:
        options["priority"] = priority
    return await client.start_workflow(
        RunWorkflow.run,
        run_options,
        id=workflow_id(run_id),
        task_queue=task_queue,
        **options,
    )
