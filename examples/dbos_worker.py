"""Driving runs with DBOS (``pip install 'statekernel[dbos]'``).

DBOS queues, schedules, retries and recovers; statekernel decides what may run again. Each
drive of a run to its next rest (a *segment*) is a DBOS workflow with the id
``<run_id>@<revision>``, whose one step drives the run with the process's kernel
(``bank_agent.make_kernel``). The ``StatekernelDBOS`` object is made before
``DBOS.launch()`` (it registers its workflows), in every process of the application; the
queue and its flow control are DBOS's own (``DBOS.register_queue``).

Run ``python dbos_worker.py`` from any folder: the system database is
``DBOS_SYSTEM_DATABASE_URL`` (a SQLite file ``dbos.sqlite`` by default; a
``postgresql://`` URL works the same), the runs' store ``STATEKERNEL_STORE``, and each
transfer is written to ``TRANSFERS``.
"""

from __future__ import annotations

import os
from pathlib import Path

from bank_agent import make_kernel
from dbos import DBOS

from statekernel.integrations.dbos import StatekernelDBOS, segment_id

app = StatekernelDBOS(make_kernel, queue="payments")


def main() -> None:
    """Launch DBOS, start a run on the ``payments`` queue and wait for its segment."""
    system = os.environ.get("DBOS_SYSTEM_DATABASE_URL", "sqlite:///dbos.sqlite")
    DBOS(config={"name": "bank", "system_database_url": system, "log_level": "WARNING"})
    DBOS.launch()
    # one segment at a time per customer, at most 4 in this process, 20 starts a second
    DBOS.register_queue(
        "payments",
        worker_concurrency=4,
        partition_concurrency=1,
        limiter={"limit": 20, "period": 1.0},
        polling_interval_sec=0.1,
    )
    try:
        first = app.start(
            model="scripted/bank",
            messages=["Pay Bob 50."],
            queue_partition_key="customer-17",
        )
        run_id = first.workflow_id.rpartition("@")[0]
        print("segment", "run@0" if first.workflow_id == segment_id(run_id, 0) else "?")
        again = app.submit(run_id, queue_partition_key="customer-17")
        print(
            "enqueued again:",
            "the same workflow" if again.workflow_id == first.workflow_id else "?",
        )
        rest = first.get_result()
        print("run", rest["state"], "at revision", rest["revision"])
        transfers = Path(os.environ.get("TRANSFERS", "transfers.log"))
        print("transfers:", transfers.read_text().strip())
    finally:
        app.close()
        DBOS.destroy()


if __name__ == "__main__":
    main()
