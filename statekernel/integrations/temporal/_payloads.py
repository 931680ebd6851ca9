"""What the workflow's history holds: ids, revisions, states and the few values a command
carries (an answer, a user message). Plain dataclasses of plain types, which Temporal's
default converter turns into JSON; never a transcript or a record of statekernel.

This module imports nothing of statekernel: the workflow (``_workflow``) runs in
Temporal's sandbox and reads these types only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "COMMAND",
    "DRIVE",
    "START",
    "WORKFLOW",
    "Command",
    "RunOptions",
    "Segment",
    "workflow_id",
]

WORKFLOW = "statekernel.run"
"""The workflow type's name."""
DRIVE = "statekernel.drive"
"""The activity that drives a run to its next rest."""
COMMAND = "statekernel.command"
"""The activity that applies a command (resume, send, resolve, cancel) to a run."""
START = "statekernel.start"
"""The activity that creates the run a workflow was started to start (``RunOptions.start``)."""


def workflow_id(run_id: str) -> str:
    """The id of the workflow of a run: one workflow per run, so a second start of the
    same run finds the first (``WorkflowAlreadyStartedError``, or its handle)."""
    return f"statekernel-run-{run_id}"


@dataclass
class RunOptions:
    """The workflow's argument: the run it drives and how.

    ``keep_open``: a completed run's workflow waits for new input (the ``send`` update)
    instead of ending. ``max_segments``: drive segments before the workflow continues as
    new (it also does when Temporal suggests it). ``heartbeat_timeout``: seconds without a
    heartbeat after which Temporal takes a drive's worker for dead and retries the drive
    elsewhere. ``segment_timeout``: seconds one drive may last. ``segments``: the
    segments done by the workflow's earlier runs (continue-as-new carries it).
    ``start``: the run to create before the first drive, unless it exists
    (``Kernel.start``'s arguments as JSON, ``start_run_workflow``'s ``model``...); None:
    the run exists already."""

    run_id: str
    keep_open: bool = False
    max_segments: int = 200
    heartbeat_timeout: float = 30.0
    segment_timeout: float = 3600.0
    segments: int = 0
    start: dict[str, Any] | None = None


@dataclass
class Segment:
    """Where a drive segment (or a command) left the run: its revision and state; for a
    paused run the pause's ``reason`` and ``due`` (epoch seconds its timer or deadline
    falls due, None for neither); for a failed one the error's type in ``reason`` and
    ``detail``."""

    run_id: str
    revision: int
    state: str
    reason: str = ""
    due: float | None = None
    detail: str = ""


@dataclass
class Command:
    """A command the workflow applies to its run through the command activity.

    ``kind``: ``resume`` (``value``, when ``given``; ``limits``, the run's new ``Limits``
    in their plain form, when not None), ``send`` (``messages``, user text),
    ``resolve`` (``call_id`` with ``value`` as the output when ``given``, or ``error``, or
    ``rerun``), ``cancel`` (``reason``). ``revision``: the run's revision the workflow
    had seen when it sent the command (-1: none yet), by which a retried command finds
    whether its first attempt's commit landed."""

    run_id: str
    kind: str
    value: Any = None
    given: bool = False
    messages: list[str] = field(default_factory=list)
    call_id: str = ""
    error: str | None = None
    rerun: bool = False
    reason: str = ""
    revision: int = -1
    limits: dict[str, Any] | None = None
