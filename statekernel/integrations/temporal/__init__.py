"""Temporal drives statekernel runs: the engine schedules, retries and recovers;
statekernel decides what may run again (extra ``temporal``).

One workflow per run (``RunWorkflow``, id ``workflow_id(run_id)``) whose history holds
ids, revisions and states, never a transcript. Each drive segment, the run driven to its
next rest, is an activity that heartbeats the revision of each commit; commands are
updates (``resume``, ``send``, ``resolve``, ``cancel``); a pause with a timer waits on a
durable timer; long runs continue as new. ``statekernel_worker(client, kernel,
task_queue=...)`` builds the worker (or ``statekernel_plugin(kernel)`` adds all that to
a worker you build); ``start_run_workflow(client, run_id, ...)`` starts a
run's workflow (and, given ``model=``, the run itself). Guide: "Temporal".
"""

from statekernel.integrations.temporal._activities import KernelActivities, segment_of
from statekernel.integrations.temporal._payloads import (
    COMMAND,
    DRIVE,
    START,
    WORKFLOW,
    Command,
    RunOptions,
    Segment,
    workflow_id,
)
from statekernel.integrations.temporal._worker import (
    sandbox_runner,
    start_run_workflow,
    statekernel_plugin,
    statekernel_worker,
)
from statekernel.integrations.temporal._workflow import RunWorkflow

__all__ = [
    "COMMAND",
    "DRIVE",
    "START",
    "WORKFLOW",
    "Command",
    "KernelActivities",
    "RunOptions",
    "RunWorkflow",
    "Segment",
    "sandbox_runner",
    "segment_of",
    "start_run_workflow",
    "statekernel_plugin",
    "statekernel_worker",
    "workflow_id",
]
