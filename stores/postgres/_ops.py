"""The Postgres store's SQL: each operation a coroutine on one connection.

Reads run in a ``REPEATABLE READ`` read-only transaction (one snapshot). A commit is
``apply_commit`` inside the transaction of its batch (``writer``): compare-and-set on
the run's (row id, revision) in the ``UPDATE`` itself, after the fencing check on the
run's lease row (read ``FOR SHARE``, so an ``acquire`` waits for the commit and the
commit is ordered before it). Lease changes read the lease row ``FOR UPDATE``. Locks
are taken in one order (lease row, then run row) so no two operations deadlock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statekernel._storage.protocol import Lease
from statekernel.stores._lease_records import damaged_lease, host_record, kept_record
from statekernel.stores._owners import LeaseRecord, check_fence
from statekernel.stores.sqlite._ops import BadRow, CommitRows, Stored

__all__ = [
    "Tables",
    "apply_commit",
    "commit_at_once",
    "delete_run",
    "lease_record",
    "read_entries",
    "read_head",
    "read_parts",
    "run_key",
]


def run_key(run_id: str) -> bytes:
    """A run id (or owner) as stored: its UTF-8 bytes."""
    return run_id.encode("utf-8", "surrogatepass")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, bytes):
        raise BadRow(f"{what} holds a {type(value).__name__}, not bytes")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRow(f"{what} is not UTF-8: {exc}") from exc


class Tables:
    """The store's table names in its schema (quoted) and where errors say it is."""

    def __init__(self, schema: str, where: str) -> None:
        s = f'"{schema}"'
        self.schema = schema
        self.where = where
        self.runs, self.commits = f"{s}.runs", f"{s}.commits"
        self.messages, self.turns = f"{s}.messages", f"{s}.turns"
        self.blobs, self.leases = f"{s}.blobs", f"{s}.leases"
        self.queue, self.dead = f"{s}.queue_entries", f"{s}.dead_letters"


async def _stored(conn: Any, t: Tables, run_id: str) -> Stored | None:
    row = await conn.fetchrow(
        f"SELECT id, run_id, revision, state, head FROM {t.runs} WHERE run_id = $1",
        run_key(run_id),
    )
    if row is None:
        return None
    return Stored(row[0], _text(row[1], f"run {run_id!r}: run_id"), row[2], row[3], row[4])


async def read_head(conn: Any, t: Tables, run_id: str) -> Stored | None:
    """The stored head of a run, or None."""
    return await _stored(conn, t, run_id)


async def read_parts(
    conn: Any,
    t: Tables,
    run_id: str,
    first_entry: Callable[[Stored], int | None],
    head_of: Callable[[Stored, list[tuple[int, bytes]]], dict[str, Any]],
    ends: Callable[[dict[str, Any]], tuple[int, int]],
) -> (
    tuple[
        Stored, dict[str, Any], list[tuple[int, bytes]], list[bytes], list[bytes], dict[str, bytes]
    ]
    | None
):
    """A run's stored head, its commit log entries from ``first_entry(stored)`` on, the
    head to decode (``head_of``), message and turn documents up to ``ends(head)`` and
    its blobs, in one snapshot."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        stored = await _stored(conn, t, run_id)
        if stored is None:
            return None
        first = first_entry(stored)
        entries: list[tuple[int, bytes]] = []
        if first is not None:
            rows = await conn.fetch(
                f"SELECT revision, entry FROM {t.commits} WHERE rid = $1 AND revision >= $2"
                " ORDER BY revision",
                stored.rid,
                first,
            )
            entries = [(r[0], r[1]) for r in rows]
        head = head_of(stored, entries)
        m_end, t_end = ends(head)
        messages = await _docs(conn, t.messages, stored.rid, m_end)
        turns = await _docs(conn, t.turns, stored.rid, t_end)
        blobs = await conn.fetch(f"SELECT key, data FROM {t.blobs} WHERE rid = $1", stored.rid)
        return stored, head, entries, messages, turns, {r[0]: r[1] for r in blobs}


async def _docs(conn: Any, table: str, rid: int, end: int) -> list[bytes]:
    if end == 0:
        return []
    rows = await conn.fetch(
        f"SELECT doc FROM {table} WHERE rid = $1 AND pos < $2 ORDER BY pos", rid, end
    )
    return [r[0] for r in rows]


async def read_entries(
    conn: Any, t: Tables, run_id: str, first: int, limit: int | None
) -> tuple[Stored, list[tuple[int, bytes]]] | None:
    """The run's stored head and its commit log entries from revision ``first`` on (at
    most ``limit``), in one snapshot; None when there is no such run."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        stored = await _stored(conn, t, run_id)
        if stored is None:
            return None
        rows = await conn.fetch(
            f"SELECT revision, entry FROM {t.commits} WHERE rid = $1 AND revision >= $2"
            " ORDER BY revision LIMIT $3",
            stored.rid,
            first,
            limit,
        )
        return stored, [(r[0], r[1]) for r in rows]


def lease_record(row: Any, run_id: str, where: str) -> LeaseRecord:
    """A lease row (token, owner bytes, expires) as a record; ``CorruptCheckpoint``
    naming the run when it holds what no lease does."""
    owner = row[1]
    if owner is not None:
        try:
            owner = _text(owner, "owner")
        except BadRow as exc:
            raise damaged_lease(run_id, where, str(exc)) from exc
    return host_record((row[0], owner, row[2]), run_id, where)


async def _lease(conn: Any, t: Tables, run_id: str, lock: str) -> LeaseRecord | None:
    row = await conn.fetchrow(
        f"SELECT token, owner, expires FROM {t.leases} WHERE run_id = $1 FOR {lock}",
        run_key(run_id),
    )
    return None if row is None else lease_record(row, run_id, t.where)


async def apply_commit(
    conn: Any,
    t: Tables,
    run_id: str,
    expect: tuple[int, int] | None,
    rows: CommitRows,
    fence: Lease | None = None,
) -> tuple[bool, Stored | None]:
    """Write ``rows`` if the run's (row id, revision) is ``expect`` (None: no run yet)
    and ``fence`` (if any) is the run's current lease (else ``LeaseLost``), inside the
    caller's transaction. (True, the new head) when it landed, else (False, the head
    found instead), having written nothing."""
    key = run_key(run_id)
    if fence is not None:
        record = await _lease(conn, t, run_id, "SHARE")
        if record is None:
            found = await conn.fetchval(f"SELECT revision FROM {t.runs} WHERE run_id = $1", key)
            current = found is not None and found == rows.revision - 1
            record = kept_record(None, run_id, t.where, expected=current)
        check_fence(record, fence, rows.revision - 1)
    revision, state, updated_us, head = rows.columns
    token = 0 if fence is None else fence.generation  # the run's fence keeps the largest
    if expect is None:
        rid = await conn.fetchval(
            f"INSERT INTO {t.runs} (run_id, revision, state, updated_us, head, fence)"
            " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (run_id) DO NOTHING RETURNING id",
            key,
            revision,
            state,
            updated_us,
            head,
            token,
        )
    else:
        rid = await conn.fetchval(
            f"UPDATE {t.runs} SET revision = $1, state = $2, updated_us = $3, head = $4,"
            " fence = GREATEST(fence, $8) WHERE id = $5 AND revision = $6 AND run_id = $7"
            " RETURNING id",
            revision,
            state,
            updated_us,
            head,
            expect[0],
            expect[1],
            key,
            token,
        )
    if rid is None:
        return False, await _stored(conn, t, run_id)
    await _write_parts(conn, t, rid, rows)
    return True, Stored(rid, run_id, rows.revision, state, head)


async def commit_at_once(
    conn: Any, t: Tables, run_id: str, expect: tuple[int, int], rows: CommitRows, fence: Lease
) -> Stored | None:
    """The commit of ``apply_commit`` in one statement (one round trip, its own
    transaction) for the case that is not refused: the run at ``expect`` and ``fence``
    its current lease, the lease row read ``FOR SHARE`` first as ``apply_commit`` reads
    it. The new head when it landed; None when it did not (nothing was written): then
    ``apply_commit`` tells why (another head, ``LeaseLost``, a damaged lease row)."""
    token = fence.token
    if not token.isdigit() or str(int(token)) != token:
        return None  # no lease row holds such a token: apply_commit says so
    revision, state, updated_us, head = rows.columns
    key = run_key(run_id)
    rid = await conn.fetchval(
        f"WITH held AS (SELECT 1 FROM {t.leases} WHERE run_id = $7 AND token = $8"
        "  AND owner = $9 FOR SHARE),"
        f" landed AS (UPDATE {t.runs} SET revision = $1, state = $2, updated_us = $3,"
        "  head = $4, fence = GREATEST(fence, $8) WHERE id = $5 AND revision = $6"
        "  AND run_id = $7 AND EXISTS (SELECT 1 FROM held) RETURNING id),"
        f" entry AS (INSERT INTO {t.commits} (rid, revision, entry)"
        "  SELECT id, $1, $10 FROM landed),"
        f" messages AS (INSERT INTO {t.messages} (rid, pos, doc)"
        "  SELECT id, $11 + n - 1, d FROM landed, unnest($12::bytea[]) WITH ORDINALITY AS u(d, n)),"
        f" turns AS (INSERT INTO {t.turns} (rid, pos, doc)"
        "  SELECT id, $13 + n - 1, d FROM landed, unnest($14::bytea[]) WITH ORDINALITY AS u(d, n)),"
        f" blobs AS (INSERT INTO {t.blobs} (rid, key, data)"
        "  SELECT id, k, d FROM landed, unnest($15::text[], $16::bytea[]) AS u(k, d)"
        "  ON CONFLICT DO NOTHING)"
        " SELECT id FROM landed",
        revision,
        state,
        updated_us,
        head,
        expect[0],
        expect[1],
        key,
        int(token),
        run_key(fence.owner),
        rows.entry,
        rows.first_message,
        list(rows.messages),
        rows.first_turn,
        list(rows.turns),
        [k for k, _ in rows.blobs],
        [v for _, v in rows.blobs],
    )
    return None if rid is None else Stored(rid, run_id, rows.revision, state, head)


async def _write_parts(conn: Any, t: Tables, rid: int, rows: CommitRows) -> None:
    await conn.execute(
        f"INSERT INTO {t.commits} (rid, revision, entry) VALUES ($1, $2, $3)",
        rid,
        rows.revision,
        rows.entry,
    )
    for table, first, docs in (
        (t.messages, rows.first_message, rows.messages),
        (t.turns, rows.first_turn, rows.turns),
    ):
        if docs:
            await conn.execute(
                f"INSERT INTO {table} (rid, pos, doc)"
                " SELECT $1, $2 + n - 1, d FROM unnest($3::bytea[]) WITH ORDINALITY AS u(d, n)",
                rid,
                first,
                list(docs),
            )
    if rows.blobs:
        await conn.execute(
            f"INSERT INTO {t.blobs} (rid, key, data)"
            " SELECT $1, k, d FROM unnest($2::text[], $3::bytea[]) AS u(k, d)"
            " ON CONFLICT DO NOTHING",
            rid,
            [k for k, _ in rows.blobs],
            [v for _, v in rows.blobs],
        )


async def delete_run(conn: Any, t: Tables, run_id: str) -> bool:
    """Remove a run with all its rows; False if there was none."""
    key = run_key(run_id)
    async with conn.transaction():
        await conn.execute(f"DELETE FROM {t.leases} WHERE run_id = $1", key)
        rid = await conn.fetchval(f"DELETE FROM {t.runs} WHERE run_id = $1 RETURNING id", key)
        if rid is None:
            return False
        for table in (t.commits, t.messages, t.turns, t.blobs):
            await conn.execute(f"DELETE FROM {table} WHERE rid = $1", rid)
        return True
