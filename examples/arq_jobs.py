"""Driving runs from arq (async jobs on Redis, one event loop per worker process).

An arq worker is already an asyncio program, so the kernel needs no thread of its own:
it is made in the worker's ``on_startup`` (on the worker's loop, where its store
connections then live), kept in the job context, and closed in ``on_shutdown``. A job
that comes twice (enqueued twice, or re-run after its worker died, which arq does for a
job it had not finished) is safe: the run's lease lets one kernel drive it at a time
(another answers ``RunBusy``, and the job is retried a second later with ``Retry``), and
a run already at rest has nothing left to do, so a side effect never runs twice because
of the queue.

Run a worker with ``arq arq_jobs.WorkerSettings`` from this folder (``REDIS_URL`` for
the queue, ``STATEKERNEL_STORE`` for the runs, ``TRANSFERS`` for the file each transfer
is written to), and enqueue with ``await pool.enqueue_job("drive_run", run_id)``.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from arq import Retry
from arq.connections import RedisSettings
from bank_agent import make_kernel

from statekernel.errors import RunBusy

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")


async def startup(ctx: dict[str, Any]) -> None:
    """Make this worker's kernel, on the worker's event loop."""
    ctx["kernel"] = make_kernel()


async def shutdown(ctx: dict[str, Any]) -> None:
    """Close the kernel: its store connections, and the leases of runs it still holds."""
    await ctx["kernel"].aclose()


async def drive_run(ctx: dict[str, Any], run_id: str) -> str:
    """Drive ``run_id`` to rest; its state then. While another worker holds the run (or a
    dead worker's lease has not expired yet) the job is retried later, not dropped."""
    kernel = ctx["kernel"]
    try:
        async for _ in kernel.run(run_id):
            pass
    except RunBusy as exc:
        raise Retry(defer=1) from exc
    return str((await kernel.get(run_id)).state)


class WorkerSettings:
    """What ``arq arq_jobs.WorkerSettings`` runs."""

    functions: ClassVar[list[Any]] = [drive_run]
    on_startup = startup
    on_shutdown = shutdown
    redis_settings = RedisSettings.from_dsn(REDIS_URL)
    max_jobs = 2
    max_tries = 120  # a retry a second: two minutes for a dead holder's lease to expire
