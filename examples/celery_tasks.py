"""Driving runs from Celery (sync tasks, a prefork pool of worker processes).

A Celery task is a plain function, and each worker process runs many of them. The
kernel is kept per process in a ``statekernel.blocking.KernelThread`` (an event loop in
a thread of its own, with the kernel and its store connections on it), made when the
process starts (``worker_process_init``: after the fork, so no child shares its
parent's loop or connections) and closed when it ends. A task delivered twice
(``acks_late`` redelivers the task of a worker that died) is safe: the run's lease
lets one kernel drive it at a time (another answers ``RunBusy``, and the task is retried
later), and a run already at rest has nothing left to do, so a side effect never runs
twice because of the queue.

Run a worker with ``celery -A celery_tasks worker`` from this folder (``REDIS_URL``
for the broker and results, ``STATEKERNEL_STORE`` for the runs, ``TRANSFERS`` for the
file each transfer is written to).
"""

from __future__ import annotations

import os
from typing import Any

from bank_agent import make_kernel
from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown

from statekernel.blocking import KernelThread
from statekernel.errors import RunBusy

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
app = Celery("statekernel_example", broker=REDIS_URL, backend=REDIS_URL)
app.conf.task_acks_late = True

_kernel: KernelThread | None = None


def kernel() -> KernelThread:
    """This process's kernel (made on first use where no worker signal made it)."""
    global _kernel
    if _kernel is None:
        _kernel = KernelThread(make_kernel)
    return _kernel


@worker_process_init.connect
def _open(**_: Any) -> None:
    kernel()


@worker_process_shutdown.connect
def _close(**_: Any) -> None:
    global _kernel
    if _kernel is not None:
        _kernel.close()
        _kernel = None


@app.task(name="celery_tasks.drive_run", bind=True, max_retries=None)
def drive_run(self: Any, run_id: str) -> str:
    """Drive ``run_id`` to rest; its state then. While another worker holds the run (or a
    dead worker's lease has not expired yet) the task is retried later, not dropped."""
    try:
        return kernel().drive(run_id).state
    except RunBusy as exc:
        raise self.retry(exc=exc, countdown=1) from exc
