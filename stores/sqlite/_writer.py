"""The SQLite store's group commit: the commits of many runs in one transaction.

``write_commits`` runs whole on the connection's thread. It opens one ``BEGIN
IMMEDIATE`` transaction, applies each commit of the batch inside a savepoint of
its own (compare-and-set on the head and the lease check, exactly as a lone
commit), and ends with one ``COMMIT``: one fsync for the whole batch. A commit
that is refused (stale head, ``LeaseLost``, a value SQLite cannot store) rolls
back to its savepoint, so only its own writes are undone, and its outcome is
that exception; the other commits of the batch are not touched.

When the transaction itself fails (``COMMIT`` cannot write, an error that ends
the transaction), no commit of the batch landed: the exception propagates, after
a ``ROLLBACK`` if the transaction is still open, and every caller of the batch
gets a ``StoreError``.

A batch of one skips the savepoint: its transaction is rolled back instead, which
is what a lone commit always did.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence

from statekernel.stores._sql.tables import Outcome, Pending
from statekernel.stores.sqlite._file import begin_immediate
from statekernel.stores.sqlite._ops import apply_commit

__all__ = ["Outcome", "Pending", "write_commits"]


def write_commits(conn: sqlite3.Connection, batch: Sequence[Pending]) -> list[Outcome | Exception]:
    """Apply ``batch`` in one transaction; each commit's outcome or its own exception."""
    grouped = len(batch) > 1
    begin_immediate(conn)
    try:
        outcomes = [_apply(conn, pending, grouped) for pending in batch]
        if conn.in_transaction:
            conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return outcomes


def _apply(conn: sqlite3.Connection, pending: Pending, grouped: bool) -> Outcome | Exception:
    if grouped:
        conn.execute("SAVEPOINT one_commit")
    try:
        p = pending
        outcome = apply_commit(
            conn, p.run_id, p.expect, p.rows, p.fence, p.release, p.take, p.taken
        )
    except Exception as exc:
        if not conn.in_transaction:
            raise  # the error ended the transaction: nothing of the batch landed
        conn.execute("ROLLBACK TO one_commit" if grouped else "ROLLBACK")
        if grouped:
            conn.execute("RELEASE one_commit")
        return exc
    if grouped:
        conn.execute("RELEASE one_commit")
    return outcome
