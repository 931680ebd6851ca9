"""What an operator does with the Postgres run queues (``_queue``): list the queues,
look at their depth and entries, put dead letters back, drop entries.

Each is one statement or one transaction: putting dead letters back deletes them and
inserts one entry per run (with the trace context of the run's first dead letter's
entry; notifying the queue's readers when it commits), so two operators doing it at
once put a run back once; dropping deletes only entries no worker has taken (a taken
one is left to its worker) and the run's dead letters.
"""

from __future__ import annotations

import time
from typing import Any

from statekernel._storage.queues import QueueDepth, QueuedRun
from statekernel.stores.postgres._ops import Tables, run_key

__all__ = ["depth", "drop", "entries", "queue_names", "revive"]


def _run_id(value: Any) -> str:
    return bytes(value).decode("utf-8", "replace")


async def queue_names(conn: Any, t: Tables) -> list[str]:
    """The queues that hold entries or dead letters, sorted."""
    rows = await conn.fetch(
        f"SELECT DISTINCT queue FROM {t.queue} UNION SELECT DISTINCT queue FROM {t.dead}"
    )
    return sorted(str(r["queue"]) for r in rows)


async def depth(conn: Any, t: Tables, queue: str) -> QueueDepth:
    """The counts, and the submit time of the oldest entry that could be taken now."""
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE consumer IS NULL) AS waiting,"
        " count(*) FILTER (WHERE consumer IS NOT NULL) AS taken,"
        " min(submitted_ms) FILTER (WHERE consumer IS NULL"
        "  AND (ready_at IS NULL OR ready_at <= now())) AS oldest,"
        f" (SELECT count(*) FROM {t.dead} WHERE queue = $1) AS dead"
        f" FROM {t.queue} WHERE queue = $1",
        queue,
    )
    oldest = row["oldest"]
    return QueueDepth(
        queue,
        int(row["waiting"]),
        int(row["taken"]),
        int(row["dead"]),
        None if oldest is None else int(oldest),
    )


async def entries(conn: Any, t: Tables, queue: str, limit: int) -> list[QueuedRun]:
    """Up to ``limit`` entries not settled, oldest first."""
    rows = await conn.fetch(
        "SELECT id, run_id, submitted_ms, deliveries, consumer, key,"
        " (consumer IS NULL AND ready_at IS NOT NULL AND ready_at > now()) AS delayed"
        f" FROM {t.queue} WHERE queue = $1 ORDER BY submitted_ms, id LIMIT $2",
        queue,
        limit,
    )
    found = []
    for r in rows:
        consumer = r["consumer"]
        state = "taken" if consumer is not None else "delayed" if r["delayed"] else "waiting"
        found.append(
            QueuedRun(
                str(r["id"]),
                _run_id(r["run_id"]),
                int(r["submitted_ms"]),
                int(r["deliveries"]),
                state,
                consumer,
                r["key"],
            )
        )
    return found


async def revive(conn: Any, t: Tables, queue: str, run_id: str | None, channel: str) -> int:
    """Delete the dead letters (of ``run_id``, or all) and insert one entry per run."""
    which = "" if run_id is None else " AND run_id = $2"
    args: list[Any] = [queue] if run_id is None else [queue, run_key(run_id)]
    async with conn.transaction():
        rows = await conn.fetch(
            f"WITH d AS (DELETE FROM {t.dead} WHERE queue = $1{which}"
            " RETURNING id, run_id, traceparent, tracestate)"
            " SELECT * FROM (SELECT DISTINCT ON (run_id) run_id, id AS first, traceparent,"
            " tracestate FROM d ORDER BY run_id, id) f ORDER BY first",
            *args,
        )
        now = int(time.time() * 1000)
        for r in rows:
            await conn.execute(
                f"INSERT INTO {t.queue} (queue, run_id, submitted_ms, traceparent, tracestate)"
                " VALUES ($1, $2, $3, $4, $5)",
                queue,
                r["run_id"],
                now,
                r["traceparent"],
                r["tracestate"],
            )
        if rows:
            await conn.execute("SELECT pg_notify($1, '')", channel)
    return len(rows)


async def drop(conn: Any, t: Tables, queue: str, run_id: str) -> int:
    """Delete ``run_id``'s entries no worker has taken and its dead letters."""
    key = run_key(run_id)
    async with conn.transaction():
        entries_gone = await conn.execute(
            f"DELETE FROM {t.queue} WHERE queue = $1 AND run_id = $2 AND consumer IS NULL",
            queue,
            key,
        )
        dead_gone = await conn.execute(
            f"DELETE FROM {t.dead} WHERE queue = $1 AND run_id = $2", queue, key
        )
    return _deleted(entries_gone) + _deleted(dead_gone)


def _deleted(status: str) -> int:
    """The row count of a ``DELETE n`` status."""
    return int(status.rsplit(" ", 1)[-1])
