"""The Postgres store's group commit: the commits of many runs in one transaction.

``write_commits`` opens one transaction and applies each commit of the batch in a
savepoint of its own (compare-and-set on the head and the lease check, exactly as a
lone commit); a refused commit (stale head, ``LeaseLost``, a value the server refuses)
rolls back to its savepoint, so only its own writes are undone, and its outcome is
that exception. Any other failure (the connection is lost, the session ends, the
driver's protocol fails: ``_connections.clean``) fails the transaction itself, whose
end is then unknown: every caller of the batch gets a ``StoreError``, and the commit
settles whether it landed. A batch of one needs no savepoint: its transaction is its
savepoint.

The commits of a batch take their rows' locks in the order of their run ids (a run's
lease row, then its run row), as every other operation of the store takes them, so
two processes' batches over the same runs wait for each other instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from statekernel.stores._sql.tables import Outcome, Pending
from statekernel.stores.postgres._connections import clean, lost
from statekernel.stores.postgres._ops import Tables, apply_commit, commit_at_once

__all__ = ["Outcome", "Pending", "write_commits"]


async def write_commits(
    conn: Any, t: Tables, batch: Sequence[Pending]
) -> list[Outcome | BaseException]:
    """Apply ``batch`` in one transaction; each commit's outcome or its own exception."""
    if len(batch) == 1:
        one = batch[0]
        try:
            # most commits land: one statement, one round trip; one that does not wrote
            # nothing, and the transaction below tells why
            stored = await commit_at_once(conn, t, one)
            if stored is not None:
                return [(True, stored)]
            async with conn.transaction():
                return [await apply_commit(conn, t, one)]
        except Exception as exc:
            if lost(conn) or not clean(exc):
                raise  # the transaction's end is unknown: the batch failed
            return [exc]
    outcomes: dict[int, Outcome | BaseException] = {}
    async with conn.transaction():
        for i in sorted(range(len(batch)), key=lambda i: batch[i].run_id):
            p = batch[i]
            try:
                async with conn.transaction():  # a savepoint
                    outcomes[i] = await apply_commit(conn, t, p)
            except Exception as exc:
                if lost(conn) or not clean(exc):
                    raise
                outcomes[i] = exc
    return [outcomes[i] for i in range(len(batch))]
