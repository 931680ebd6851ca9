"""A run's cancel request in the Postgres store (``CancelsRuns``): the ``cancel`` column of
its row in ``runs`` (layout version 6), NULL while none is kept.

A request is kept by one statement that locks the run's row (``FOR UPDATE``) and sets
the column only while it is NULL and the run is not at rest. A commit of the run updates
that row too, its ``UPDATE`` checking the column (``_ops``): whichever of the two takes
the row's lock first, the other waits for it and then reads the row it left (``READ
COMMITTED``), so a commit never lands over a request kept before it, and a request is
never kept for a run a commit has just completed or failed. Only the run row is locked:
a commit locks the lease row, then the run row, so the two cannot deadlock.
"""

from __future__ import annotations

from typing import Any

from statekernel.stores._format.cancels import AT_REST
from statekernel.stores.postgres._ops import Tables, run_key

__all__ = ["keep_cancel", "read_cancel"]


async def keep_cancel(
    conn: Any, t: Tables, run_id: str, data: bytes
) -> tuple[str, bytes | None, bool] | None:
    """Keep the cancel request ``data`` for the run unless one is kept or the run is at
    rest, in one statement: (the run's state, the request kept before, whether ``data``
    is kept now) as the run's locked row says; None when no run has the id."""
    row = await conn.fetchrow(
        f"WITH r AS (SELECT id, state, cancel FROM {t.runs} WHERE run_id = $1 FOR UPDATE),"
        f" kept AS (UPDATE {t.runs} u SET cancel = $2 FROM r WHERE u.id = r.id"
        "  AND r.cancel IS NULL AND r.state <> ALL($3::text[]) RETURNING u.id)"
        " SELECT r.state, r.cancel, EXISTS (SELECT 1 FROM kept) FROM r",
        run_key(run_id),
        data,
        list(AT_REST),
    )
    return None if row is None else (row[0], row[1], bool(row[2]))


async def read_cancel(conn: Any, t: Tables, run_id: str) -> bytes | None:
    """The run's kept cancel request as stored (None: none, or no such run)."""
    data = await conn.fetchval(f"SELECT cancel FROM {t.runs} WHERE run_id = $1", run_key(run_id))
    return None if data is None else bytes(data)
