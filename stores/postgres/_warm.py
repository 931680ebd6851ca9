"""Statements a new connection prepares before it is used, so that a run's first steps
do not: asyncpg prepares a statement on its first use on a connection (a round trip,
and the server's first look at the tables on a new session), which made the first step
of a run on a fresh pool about 30 ms against 4 for the steps after it.

Each statement runs once on arguments that match no run (a run id no run has: ids are
never empty), so it writes nothing; the one that creates a run runs in a transaction
that is rolled back. asyncpg keeps the prepared statement for the text, and the drive's
statements are these very texts. Warming is best effort: a statement that fails here
fails again, with its error, where it is used.
"""

from __future__ import annotations

from typing import Any

from statekernel._storage.protocol import Lease
from statekernel.stores._sql.rows import CommitRows
from statekernel.stores._sql.tables import Pending
from statekernel.stores.postgres import _leases as leases
from statekernel.stores.postgres._cancels import read_cancel
from statekernel.stores.postgres._ops import Tables, commit_at_once, read_head_parts

__all__ = ["prepare_statements"]

_NO_RUN = ""
"""A run id no run has (``checked_run_id`` refuses the empty id)."""


class _Undo(Exception):
    """Rolls back the transaction of the statement that would create a run."""


async def prepare_statements(conn: Any, t: Tables, *, writable: bool) -> None:
    """Prepare on ``conn`` the statements of a drive: loading a run's head and, on a
    ``writable`` store, creating a run, taking a free lease, the fenced commits
    (keeping the lease, and giving it back with the commit), and reading the run's
    cancel request (after each renewal of a drive's lease)."""
    await read_head_parts(conn, t, _NO_RUN)
    if not writable:
        return
    rows = CommitRows((1, "init", 0, b""), 1, b"", 0, [b""], 0, [], [("k", b"")])
    nobody = Lease(_NO_RUN, _NO_RUN, "1")
    for release in (False, True):
        await commit_at_once(conn, t, Pending(_NO_RUN, (0, 0), rows, nobody, release))
    await read_cancel(conn, t, _NO_RUN)
    claim = leases.Claim(_NO_RUN, 1.0, leases.RENEWAL, None)
    await leases.take_free(conn, t, _NO_RUN.encode(), claim)
    try:
        async with conn.transaction():
            await commit_at_once(conn, t, Pending(_NO_RUN, None, rows))
            raise _Undo
    except _Undo:
        pass
