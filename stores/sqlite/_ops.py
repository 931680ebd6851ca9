"""The SQLite store's transactions, each a plain function run whole on the connection's thread.

Every store operation is one of these functions, so it costs one hop to the
database thread: ``BEGIN``, the statements, ``COMMIT`` (or ``ROLLBACK`` on any
error). Commits are the exception: ``apply_commit`` writes one inside the
transaction of a batch (``_writer``). A run's row id (``runs.id``,
AUTOINCREMENT, never reused) and revision name one exact head: a commit checks both
under ``BEGIN IMMEDIATE`` before it writes, so a head remembered from an earlier
call is as good as a fresh read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import attrs

from statekernel._storage.protocol import Lease
from statekernel.errors import RunBusy, RunNotFound
from statekernel.stores._format.cancels import cancel_requested, check_cancellable
from statekernel.stores._host.lease_records import damaged_lease, host_record, kept_record
from statekernel.stores._host.owners import LeaseChange, LeaseRecord, check_fence, fenced
from statekernel.stores._sql.rows import BadRow, CommitRows, Stored
from statekernel.stores.sqlite._file import StoreConnection, begin_immediate, begin_read

__all__ = [
    "Parts",
    "apply_commit",
    "delete_run",
    "fetch_all",
    "keep_cancel",
    "lease_op",
    "read_cancel",
    "read_events",
    "read_head",
    "read_lease",
    "read_parts",
    "transaction",
]

T = TypeVar("T")


def _checked(row: Sequence[Any], types: tuple[type, ...], what: str) -> tuple[Any, ...]:
    """``row`` if each value has its type (an int that is not a bool, bytes...)."""
    if len(row) != len(types) or not all(
        isinstance(v, t) and not isinstance(v, bool) for v, t in zip(row, types, strict=True)
    ):
        found = ", ".join(type(v).__name__ for v in row)
        want = ", ".join(t.__name__ for t in types)
        raise BadRow(f"{what}: a row holds ({found}), not ({want})")
    return tuple(row)


@contextmanager
def transaction(
    conn: sqlite3.Connection, *, write: bool = False, durable: bool = True
) -> Iterator[sqlite3.Connection]:
    """One transaction (``write``: ``BEGIN IMMEDIATE``, which takes the write lock at
    once; ``durable`` False: committed without an fsync): committed when the block
    ends, rolled back when it raises."""
    if write:
        begin_immediate(conn, durable=durable)
    else:
        begin_read(conn)
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _stored(conn: sqlite3.Connection, run_id: str) -> Stored | None:
    row = conn.execute(
        "SELECT id, revision, state, head FROM runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    if row is None:
        return None
    rid, revision, state, head = _checked(row, (int, int, str, bytes), f"run {run_id!r}")
    return Stored(rid, run_id, revision, state, head)


def read_head(conn: sqlite3.Connection, run_id: str) -> Stored | None:
    """The stored head of a run, or None."""
    with transaction(conn):
        return _stored(conn, run_id)


def _where(conn: sqlite3.Connection) -> str:
    return f"SQLite store {conn.path!r}" if isinstance(conn, StoreConnection) else "SQLite store"


def _lease(conn: sqlite3.Connection, run_id: str) -> LeaseRecord | None:
    row = conn.execute(
        "SELECT token, owner, expires FROM leases WHERE run_id = ?", (run_id,)
    ).fetchone()
    return None if row is None else host_record(row, run_id, _where(conn))


def _fenced_lease(conn: sqlite3.Connection, run_id: str, expected: int) -> LeaseRecord | None:
    """The run's lease record for a commit fenced by a lease on it (expecting revision
    ``expected``): missing while the run is at that revision, it is damage."""
    record = _lease(conn, run_id)
    if record is None:
        row = conn.execute("SELECT revision FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        current = row is not None and row[0] == expected
        return kept_record(None, run_id, _where(conn), expected=current)
    return record


def _fenced_head(
    conn: sqlite3.Connection, run_id: str, fence: Lease, expected: int
) -> tuple[int, int] | None:
    """The run's (row id, revision) for a commit fenced by ``fence``, read with its lease
    record in one statement; ``LeaseLost`` unless ``fence`` is the run's current lease."""
    row = conn.execute(
        "SELECT r.id, r.revision, l.token, l.owner, l.expires FROM runs r"
        " LEFT JOIN leases l ON l.run_id = r.run_id WHERE r.run_id = ?",
        (run_id,),
    ).fetchone()
    if row is None:  # no such run: its lease record alone says whether the lease moved on
        check_fence(_fenced_lease(conn, run_id, expected), fence, expected)
        return None
    record = None if row[2] is None else host_record(row[2:], run_id, _where(conn))
    check_fence(
        kept_record(record, run_id, _where(conn), expected=row[1] == expected), fence, expected
    )
    return row[0], row[1]


def read_lease(conn: sqlite3.Connection, run_id: str) -> LeaseRecord | None:
    """The run's lease record, read without writing; ``RunNotFound`` when there is no
    such run."""
    with transaction(conn):
        if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
            raise RunNotFound(run_id)
        return _lease(conn, run_id)


def lease_op(
    conn: sqlite3.Connection,
    run_id: str,
    change: Callable[[LeaseRecord | None], LeaseRecord | None],
) -> LeaseRecord | None:
    """Read the run's lease, write ``change(lease)`` back (one transaction); the new lease.
    ``RunNotFound`` when there is no such run.

    The run's row keeps the largest token ever given (``runs.fence``): a record lost
    or deleted by hand is read as a released one at that token, and one whose token is
    below it has its token raised to it (``fenced``), so a new token is always above
    every token given before.

    Leases need not outlive a power loss (every owner on the host dies with it), so
    the transaction skips the fsync of the commits; a later commit's fsync covers it
    (the WAL is written in order), so a token any commit carried is never lost.
    """
    with transaction(conn, write=True, durable=False):
        row = conn.execute("SELECT fence FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        fence = row[0]
        if type(fence) is not int or fence < 0:
            raise damaged_lease(run_id, _where(conn), f"the run's fence is {fence!r}")
        old = _lease(conn, run_id)
        floor = old if old is not None and old.token >= fence else fenced(old, fence)
        new = change(floor)
        if new is not None and new != floor:
            conn.execute(
                "INSERT OR REPLACE INTO leases (run_id, token, owner, expires) VALUES (?, ?, ?, ?)",
                (run_id, new.token, new.owner, new.expires),
            )
            if new.token > fence:
                conn.execute("UPDATE runs SET fence = ? WHERE run_id = ?", (new.token, run_id))
    return new


def apply_commit(
    conn: sqlite3.Connection,
    run_id: str,
    expect: tuple[int, int] | None,
    rows: CommitRows,
    fence: Lease | None = None,
    release: bool = False,
    take: LeaseChange | None = None,
    taken: list[LeaseRecord] | None = None,
) -> tuple[bool, Stored | None]:
    """Write ``rows`` if the run's (row id, revision) is ``expect`` (None: no run yet)
    and ``fence`` (if any) is the run's current lease (else ``LeaseLost``), inside the
    caller's ``BEGIN IMMEDIATE`` transaction; with ``release``, give ``fence`` up with it
    (as ``released`` does: the record keeps its token, without owner or expiry); with
    ``take``, a new run's lease record becomes ``take(record)`` (the record a deleted run
    left, if any), its token the run's fence, and is put in ``taken`` (nothing when that
    record's owner may hold it still: the run is created without its lease).

    Returns (True, the new head) when the commit landed, else (False, the stored
    head it found instead), having written nothing.
    """
    if fence is None:
        found = conn.execute("SELECT id, revision FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    else:
        found = _fenced_head(conn, run_id, fence, rows.revision - 1)
    if (None if found is None else tuple(found)) != expect:
        return False, _stored(conn, run_id)
    if found is not None:
        _check_cancel(conn, run_id, found[0], rows.cancels)
    if found is None:
        cursor = conn.execute(
            "INSERT INTO runs (revision, state, model, turns, created_at, updated_at,"
            " updated_us, head, run_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*rows.columns, run_id),
        )
        rid = int(cursor.lastrowid or 0)
        if take is not None:
            record = _taken(conn, run_id, rid, take)
            if record is not None and taken is not None:
                taken.append(record)
    else:
        rid = found[0]
        conn.execute(
            "UPDATE runs SET revision = ?, state = ?, model = ?, turns = ?, created_at = ?,"
            " updated_at = ?, updated_us = ?, head = ? WHERE id = ?",
            (*rows.columns, rid),
        )
    _write_parts(conn, rid, rows)
    if rows.tags is not None:
        if found is not None:
            conn.execute("DELETE FROM run_tags WHERE rid = ?", (rid,))
        _insert(
            conn,
            "INSERT INTO run_tags (rid, key, value) VALUES (?, ?, ?)",
            [(rid, k, v) for k, v in rows.tags],
        )
    if release and fence is not None:  # checked current above, in this transaction
        conn.execute("UPDATE leases SET owner = NULL, expires = 0 WHERE run_id = ?", (run_id,))
    return True, Stored(rid, run_id, rows.revision, rows.columns[1], rows.columns[-1])


def _check_cancel(conn: sqlite3.Connection, run_id: str, rid: int, cancels: bool) -> None:
    """Refuse a commit while the run keeps a cancel request (``CancelRequested``), unless
    it ``cancels``: the commit that carries the request out removes it."""
    row = conn.execute("SELECT doc FROM cancels WHERE rid = ?", (rid,)).fetchone()
    if row is None:
        return
    if not cancels:
        raise cancel_requested(run_id, row[0], _where(conn))
    conn.execute("DELETE FROM cancels WHERE rid = ?", (rid,))


def keep_cancel(conn: sqlite3.Connection, run_id: str, data: bytes) -> bytes | None:
    """Keep the cancel request ``data`` for the run unless one is kept (that one's bytes
    are returned); ``RunNotFound``; ``InvalidTransition`` for a completed or failed run."""
    with transaction(conn, write=True):
        stored = _stored(conn, run_id)
        if stored is None:
            raise RunNotFound(run_id)
        row = conn.execute("SELECT doc FROM cancels WHERE rid = ?", (stored.rid,)).fetchone()
        if row is not None:
            kept: bytes = row[0]  # checked when decoded (a damaged one: CorruptCheckpoint)
            return kept
        check_cancellable(run_id, stored.state)
        conn.execute("INSERT INTO cancels (rid, doc) VALUES (?, ?)", (stored.rid, data))
        return None


def read_cancel(conn: sqlite3.Connection, run_id: str) -> bytes | None:
    """The run's kept cancel request, as stored (None: none, or no such run; a store of
    an older layout, read-only here, keeps none)."""
    with transaction(conn):
        try:
            row = conn.execute(
                "SELECT c.doc FROM runs r JOIN cancels c ON c.rid = r.id WHERE r.run_id = ?",
                (run_id,),
            ).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            return None
        return None if row is None else row[0]


def _taken(
    conn: sqlite3.Connection, run_id: str, rid: int, take: LeaseChange
) -> LeaseRecord | None:
    """The lease of a run created in this transaction, taken: ``take`` of the record a
    deleted run of that id left (its token only grows), or of none. None when that
    record's owner may still hold it (``RunBusy``): the run is created without it."""
    try:
        new = take(_lease(conn, run_id))
    except RunBusy:
        return None
    if new is None:
        raise AssertionError("taking a lease gave no lease record")
    conn.execute(
        "INSERT OR REPLACE INTO leases (run_id, token, owner, expires) VALUES (?, ?, ?, ?)",
        (run_id, new.token, new.owner, new.expires),
    )
    conn.execute("UPDATE runs SET fence = ? WHERE id = ?", (new.token, rid))
    return new


def _write_parts(conn: sqlite3.Connection, rid: int, rows: CommitRows) -> None:
    conn.execute(
        "INSERT INTO commits (rid, revision, entry) VALUES (?, ?, ?)",
        (rid, rows.revision, rows.entry),
    )
    for table, first, docs in (
        ("messages", rows.first_message, rows.messages),
        ("turns", rows.first_turn, rows.turns),
    ):
        _insert(
            conn,
            f"INSERT INTO {table} (rid, pos, doc) VALUES (?, ?, ?)",
            [(rid, first + i, d) for i, d in enumerate(docs)],
        )
    _insert(
        conn,
        "INSERT OR IGNORE INTO blobs (rid, key, data) VALUES (?, ?, ?)",
        [(rid, k, v) for k, v in rows.blobs],
    )


def _insert(conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    if len(rows) == 1:
        conn.execute(sql, rows[0])
    elif rows:
        conn.executemany(sql, rows)


@attrs.frozen
class Parts:
    """What a load reads in one transaction."""

    stored: Stored
    head: dict[str, Any]
    entries: list[tuple[int, bytes]]
    messages: list[bytes]
    turns: list[bytes]
    blobs: dict[str, bytes]


def read_parts(
    conn: sqlite3.Connection,
    run_id: str,
    first_entry: Callable[[Stored], int | None],
    head_of: Callable[[Stored, list[tuple[int, bytes]]], dict[str, Any]],
    ends: Callable[[dict[str, Any]], tuple[int, int]],
) -> Parts | None:
    """A run's stored head, its commit log entries from ``first_entry(stored)`` on (none
    for None), the head to decode (``head_of``), message and turn documents up to
    ``ends(head)`` and all its blobs."""
    with transaction(conn):
        stored = _stored(conn, run_id)
        if stored is None:
            return None
        rid = stored.rid
        first = first_entry(stored)
        entries: list[tuple[int, bytes]] = []
        if first is not None:
            rows = conn.execute(
                "SELECT revision, entry FROM commits WHERE rid = ? AND revision >= ?"
                " ORDER BY revision",
                (rid, first),
            ).fetchall()
            entries = [_checked(r, (int, bytes), f"commit log of {run_id!r}") for r in rows]
        head = head_of(stored, entries)
        m_end, t_end = ends(head)
        return Parts(
            stored,
            head,
            entries,
            _docs(conn, "messages", rid, m_end),
            _docs(conn, "turns", rid, t_end),
            _blobs(conn, rid),
        )


def _blobs(conn: sqlite3.Connection, rid: int) -> dict[str, bytes]:
    rows = conn.execute("SELECT key, data FROM blobs WHERE rid = ?", (rid,)).fetchall()
    found = dict(rows)
    if len(found) != len(rows) or not all(
        type(k) is str and type(v) is bytes for k, v in found.items()
    ):  # checked in one pass; the row that is wrong is named only when one is
        return dict(_checked(r, (str, bytes), "blobs") for r in rows)
    return found


def _docs(conn: sqlite3.Connection, table: str, rid: int, end: int) -> list[bytes]:
    if end == 0:
        return []
    rows = conn.execute(
        f"SELECT doc FROM {table} WHERE rid = ? AND pos < ? ORDER BY pos", (rid, end)
    ).fetchall()
    docs = [r[0] for r in rows]
    if not all(type(d) is bytes for d in docs):  # the row that is wrong named only then
        return [_checked(r, (bytes,), table)[0] for r in rows]
    return docs


def read_events(
    conn: sqlite3.Connection,
    run_id: str,
    first: int,
    collect: Callable[[list[tuple[int, bytes]]], bool],
) -> Stored | None:
    """Hand commit log entries from revision ``first`` on to ``collect`` in batches until
    it returns True or they run out; the run's stored head, None when there is no such run."""
    with transaction(conn):
        stored = _stored(conn, run_id)
        if stored is None:
            return None
        cursor = conn.execute(
            "SELECT revision, entry FROM commits WHERE rid = ? AND revision >= ? ORDER BY revision",
            (stored.rid, first),
        )
        while True:
            batch = [_checked(r, (int, bytes), "commit log") for r in cursor.fetchmany(256)]
            if not batch or collect(batch):
                return stored


def delete_run(conn: sqlite3.Connection, run_id: str) -> bool:
    """Remove a run with all its rows; False if there was none."""
    with transaction(conn, write=True):
        row = conn.execute("SELECT id FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return False
        conn.execute("DELETE FROM cancels WHERE rid = ?", (row[0],))
        for table in ("commits", "messages", "turns", "blobs", "run_tags"):
            conn.execute(f"DELETE FROM {table} WHERE rid = ?", (row[0],))
        conn.execute("DELETE FROM runs WHERE id = ?", (row[0],))
        conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))
        return True


def fetch_all(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    """The rows of one query, in its own read transaction."""
    with transaction(conn):
        return conn.execute(sql, params).fetchall()
