"""Handing a run to workers: ``Kernel.submit`` on a store with run queues."""

from __future__ import annotations

from collections.abc import Callable

from statekernel._kernel import propagation
from statekernel._records.arguments import run_id_arg, seconds, text
from statekernel._storage.protocol import CheckpointStore
from statekernel._storage.queues import RunQueues, queue_key
from statekernel.errors import ConfigError

__all__ = ["submit_run"]


async def submit_run(
    store: CheckpointStore,
    run_id: str,
    queue: str,
    delay: float,
    keyed: tuple[str | None, int],
    schemes: Callable[[], str],
) -> str:
    """Enqueue ``run_id`` on ``queue`` of ``store`` (see ``Kernel.submit``; ``keyed``:
    its key and key limit), its arguments checked first; the entry id. The entry carries
    the trace context of the current span (the submitting request's), for the worker's
    drive. ``schemes`` names the stores with run queues for the ``ConfigError`` of a
    store without."""
    key, key_limit = keyed
    run_id_arg(run_id)
    text("queue", queue)
    wait = round(seconds("delay", delay, zero=True) * 1000)
    limit = queue_key(key, key_limit)
    if not isinstance(store, RunQueues):
        raise ConfigError(
            f"submit needs a store with run queues ({schemes()}), not {type(store).__name__}"
        )
    trace = propagation.current()
    return await store.submit(run_id, queue, delay_ms=wait, key=key, key_limit=limit, trace=trace)
