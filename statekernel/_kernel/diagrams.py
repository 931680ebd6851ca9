"""A run's lifecycle diagram: the chart with the states and transitions the run went
through highlighted (``Kernel.diagram``)."""

from __future__ import annotations

from statekernel._lifecycle.diagram import FORMATS, render
from statekernel._lifecycle.trace import trace_events
from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import InvalidArgument, RunNotFound

__all__ = ["run_diagram"]


async def run_diagram(store: CheckpointStore, run_id: str, format: str) -> bytes:
    """The diagram of ``run_id`` in ``format`` (``svg``, ``dot`` or ``mmd``); see
    ``Kernel.diagram``."""
    if format not in FORMATS:
        raise InvalidArgument(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    run = await store.load(run_id)
    try:
        initial = (await store.load(run_id, revision=0)).state
    except RunNotFound:  # a store without its first revision: the chart's start
        initial = "init"
    title = f"run {run_id}: {run.state} at revision {run.revision}"
    events = await store.events(run_id)
    return render(format, trace_events(events, initial=initial, current=run.state, title=title))
