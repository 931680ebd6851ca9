"""The Postgres store's SQL: each operation a coroutine on one connection.

Reads run in a ``REPEATABLE READ`` read-only transaction (one snapshot). A commit is
``apply_commit`` inside the transaction of its batch (``writer``): compare-and-set on
the run's (row id, revision) in the ``UPDATE`` itself, after the fencing check on the
run's lease row (read ``FOR SHARE``, so an ``acquire`` waits for the commit and the
commit is ordered before it). Lease changes read the lease row ``FOR UPDATE``. Locks
are taken in one order (lease row, then run row) so no two operations deadlock.

A run's cancel request is a column of its row (``runs.cancel``, ``_cancels``): a
commit's ``UPDATE`` lands only while none is kept, unless it carries the request out
(``CommitRows.cancels``), and always clears it; one refused for it raises
``CancelRequested``, after the lease and revision checks as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statekernel.stores._format.cancels import cancel_requested
from statekernel.stores._host.lease_records import damaged_lease, host_record, kept_record
from statekernel.stores._host.owners import LeaseRecord, check_fence
from statekernel.stores._sql.rows import BadRow, CommitRows, Stored
from statekernel.stores._sql.tables import Pending

__all__ = [
    "Tables",
    "apply_commit",
    "below",
    "commit_at_once",
    "delete_run",
    "lease_record",
    "read_entries",
    "read_head",
    "read_head_parts",
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
        self.tags = f"{s}.run_tags"


async def _stored(conn: Any, t: Tables, run_id: str) -> Stored | None:
    row = await conn.fetchrow(
        f"SELECT id, run_id, revision, state, head FROM {t.runs} WHERE run_id = $1",
        run_key(run_id),
    )
    return None if row is None else _row_stored(row, run_id)


def _row_stored(row: Any, run_id: str) -> Stored:
    """A run row's (id, run_id, revision, state, head) as read."""
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


async def read_head_parts(
    conn: Any, t: Tables, run_id: str
) -> tuple[Stored, list[tuple[int, bytes]], list[tuple[int, bytes]], dict[str, bytes]] | None:
    """A run's stored head with every message and turn document (with its position) and
    every blob, in one statement (one round trip, one snapshot), for a load of its head
    (``read_parts`` does a revision's: its commit log first). None: no such run."""
    rows = await conn.fetch(
        f"WITH r AS (SELECT id, revision, state, head, run_id FROM {t.runs} WHERE run_id = $1)"
        " SELECT 0, r.revision, r.state, r.head, r.run_id, r.id FROM r"
        f" UNION ALL SELECT 1, m.pos, NULL, m.doc, NULL, NULL FROM {t.messages} m, r"
        "  WHERE m.rid = r.id"
        f" UNION ALL SELECT 2, d.pos, NULL, d.doc, NULL, NULL FROM {t.turns} d, r"
        "  WHERE d.rid = r.id"
        f" UNION ALL SELECT 3, NULL, b.key, b.data, NULL, NULL FROM {t.blobs} b, r"
        "  WHERE b.rid = r.id"
        " ORDER BY 1, 2",
        run_key(run_id),
    )
    if not rows or rows[0][0] != 0:
        return None
    top = rows[0]
    stored = Stored(top[5], _text(top[4], f"run {run_id!r}: run_id"), top[1], top[2], top[3])
    parts: tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]] = ([], [])
    blobs: dict[str, bytes] = {}
    for kind, pos, key, data, _, _ in rows[1:]:
        if kind == 3:
            blobs[key] = data
        else:
            parts[kind - 1].append((pos, data))
    return stored, parts[0], parts[1], blobs


def below(docs: list[tuple[int, bytes]], end: int) -> list[bytes]:
    """The documents at positions below ``end`` (as ``read_parts`` reads them)."""
    return [doc for pos, doc in docs if pos < end]


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


async def apply_commit(conn: Any, t: Tables, pending: Pending) -> tuple[bool, Stored | None]:
    """Write the ``pending`` commit's rows if the run's (row id, revision) is its
    ``expect`` (None: no run yet) and its ``fence`` (if any) is the run's current lease
    (else ``LeaseLost``), inside the caller's transaction; with ``release``, give the
    fence up with it. (True, the new head) when it landed, else (False, the head found
    instead), having written nothing; ``CancelRequested`` when the run keeps a cancel
    request and the commit does not carry it out."""
    run_id, expect, rows, fence = pending.run_id, pending.expect, pending.rows, pending.fence
    key = run_key(run_id)
    if fence is not None:
        record = await _lease(conn, t, run_id, "UPDATE" if pending.release else "SHARE")
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
        if rid is not None and pending.take is not None:
            await _take_new(conn, t, pending, rid)
    else:
        rid = await conn.fetchval(
            f"UPDATE {t.runs} SET revision = $1, state = $2, updated_us = $3, head = $4,"
            f" fence = GREATEST(fence, $8), {_CANCEL_GONE} WHERE id = $5 AND revision = $6"
            f" AND run_id = $7 AND {_UNLESS_CANCEL.format(p='$9')} RETURNING id",
            revision,
            state,
            updated_us,
            head,
            expect[0],
            expect[1],
            key,
            token,
            rows.cancels,
        )
    if rid is None:
        return False, await _refused(conn, t, pending)
    await _write_parts(conn, t, rid, rows)
    if pending.release and fence is not None:  # checked current above, in this transaction
        await conn.execute(f"UPDATE {t.leases} SET {_FREED} WHERE run_id = $1", key)
    return True, Stored(rid, run_id, rows.revision, state, head)


_FREED = "owner = NULL, expires = 0, suspect = NULL"
"""A lease row given up (``give_back``): its token stays."""

_UNLESS_CANCEL = "(cancel IS NULL OR {p}::boolean)"
"""The condition of a commit's ``UPDATE`` of the run row: no cancel request is kept, or
the commit carries it out (the parameter ``p``, ``CommitRows.cancels``). Checked on the
row the ``UPDATE`` locked (``READ COMMITTED`` reads it again after waiting for another
writer of the row): a request kept meanwhile refuses the commit."""

_CANCEL_GONE = "cancel = NULL"
"""What a commit that lands sets: no request was kept, or it carried the request out."""


async def _refused(conn: Any, t: Tables, pending: Pending) -> Stored | None:
    """The head found instead of the one a refused ``UPDATE`` of ``apply_commit`` expected
    (None: no run); ``CancelRequested`` when the head is the one expected and the run
    keeps a cancel request (read again: the refusal was for it)."""
    run_id = pending.run_id
    row = await conn.fetchrow(
        f"SELECT id, run_id, revision, state, head, cancel FROM {t.runs} WHERE run_id = $1",
        run_key(run_id),
    )
    if row is None:
        return None
    stored = _row_stored(row, run_id)
    if (row[0], row[2]) == pending.expect and row[5] is not None and not pending.rows.cancels:
        raise cancel_requested(run_id, row[5], t.where)
    return stored


async def commit_at_once(conn: Any, t: Tables, pending: Pending) -> Stored | None:
    """The commit of ``apply_commit`` in one statement (one round trip, its own
    transaction) for the cases that are not refused: a new run whose id is free, or a
    fenced commit with the run at ``expect`` and ``fence`` its current lease, the lease
    row read ``FOR SHARE`` first as ``apply_commit`` reads it (``FOR UPDATE`` when the
    commit gives it up: ``release``). The new head when it landed; None when it did not
    (nothing was written) or is of another kind: then ``apply_commit`` tells why (another
    head, ``LeaseLost``, a damaged lease row). ``CancelRequested`` (nothing written) when
    the lease and head checks passed and the run keeps a cancel request the commit does
    not carry out; the statement reads it for the refusal (a request kept while it
    waited for the run row's lock leaves it to ``apply_commit`` to say so)."""
    run_id, expect, rows, fence = pending.run_id, pending.expect, pending.rows, pending.fence
    revision, state, updated_us, head = rows.columns
    key = run_key(run_id)
    if expect is None and fence is None and pending.take is not None:
        return await _create_leased_at_once(conn, t, pending)
    if expect is not None and rows.tags is not None:
        return None  # a change of the run's tags: apply_commit replaces its index rows
    if expect is None and fence is None:
        rid = await conn.fetchval(
            f"WITH landed AS (INSERT INTO {t.runs} (run_id, revision, state, updated_us, head,"
            "  fence) VALUES ($5, $1, $2, $3, $4, 0) ON CONFLICT (run_id) DO NOTHING"
            "  RETURNING id),"
            # its lease row, free: the first acquire takes it in one statement
            f" lease AS (INSERT INTO {t.leases} (run_id, token, owner, expires)"
            "  SELECT $5, 0, NULL, 0 FROM landed ON CONFLICT DO NOTHING),"
            f"{_parts(t, 6, tags=13)}",
            revision,
            state,
            updated_us,
            head,
            key,
            *_part_values(rows),
            *_tag_values(rows),
        )
        return None if rid is None else Stored(rid, run_id, rows.revision, state, head)
    if expect is None or fence is None:
        return None
    token = fence.token
    if not token.isdigit() or str(int(token)) != token:
        return None  # no lease row holds such a token: apply_commit says so
    lock, freed = "SHARE", ""
    if pending.release:
        lock = "UPDATE"
        freed = (
            f" freed AS (UPDATE {t.leases} SET {_FREED} WHERE run_id = $7"
            "  AND EXISTS (SELECT 1 FROM landed)),"
        )
    found = await conn.fetchrow(
        f"WITH held AS (SELECT 1 FROM {t.leases} WHERE run_id = $7 AND token = $8"
        f"  AND owner = $9 FOR {lock}),"
        f" landed AS (UPDATE {t.runs} SET revision = $1, state = $2, updated_us = $3,"
        f"  head = $4, fence = GREATEST(fence, $8), {_CANCEL_GONE} WHERE id = $5"
        "  AND revision = $6 AND run_id = $7 AND EXISTS (SELECT 1 FROM held)"
        f"  AND {_UNLESS_CANCEL.format(p='$17')} RETURNING id),{freed}"
        f"{_parts(t, 10, _LANDED_OR_CANCEL.format(runs=t.runs))}",
        revision,
        state,
        updated_us,
        head,
        expect[0],
        expect[1],
        key,
        int(token),
        run_key(fence.owner),
        *_part_values(rows),
        rows.cancels,
    )
    if found is None:
        return None
    if found[0] is None:
        raise cancel_requested(run_id, found[1], t.where)
    return Stored(found[0], run_id, rows.revision, state, head)


_LANDED_OR_CANCEL = (
    " SELECT id, NULL::bytea FROM landed"
    " UNION ALL SELECT NULL, r.cancel FROM {runs} r WHERE NOT EXISTS (SELECT 1 FROM landed)"
    "  AND r.id = $5 AND r.revision = $6 AND r.run_id = $7 AND EXISTS (SELECT 1 FROM held)"
    "  AND r.cancel IS NOT NULL AND NOT $17::boolean"
)
"""The result of a fenced one-statement commit: (its run row's id, NULL) when it landed;
(NULL, the request) when the lease and head checks passed and a cancel request refused
it; no row otherwise. The request is read from the statement's snapshot, and only when
nothing landed (a one-time filter: a commit that landed reads nothing more)."""


async def _take_new(conn: Any, t: Tables, pending: Pending, rid: int) -> None:
    """The lease of a run just created in this transaction (``Pending.take``, a ``Claim``),
    as ``_create_leased_at_once`` takes it (token 1, the run's fence), in one statement,
    unless its id kept a lease row (then nothing: the run stays without its lease)."""
    claim = pending.take
    taken = await conn.fetchval(
        f"WITH lease AS (INSERT INTO {t.leases} (run_id, token, owner, expires, proof,"
        "  lock_key) VALUES ($1, 1, $2, extract(epoch FROM clock_timestamp())::float8"
        "  + $3::float8, $4, $5) ON CONFLICT DO NOTHING RETURNING token)"
        f" UPDATE {t.runs} SET fence = 1 WHERE id = $6 AND EXISTS (SELECT 1 FROM lease)"
        " RETURNING 1",
        run_key(pending.run_id),
        run_key(claim.owner),
        claim.ttl,
        claim.proof,
        claim.lock_key,
        rid,
    )
    if taken is not None:
        pending.taken.append(1)


async def _create_leased_at_once(conn: Any, t: Tables, pending: Pending) -> Stored | None:
    """A new run whose lease is taken with it (``Pending.take``, a ``Claim``) in one
    statement: token 1, the run's fence. None (nothing written) when the id has a run
    or a lease row already: ``apply_commit`` then refuses it, or creates the run without
    its lease (``Pending.taken`` stays empty). A batch of commits goes through
    ``apply_commit``, which takes it as this does (``_take_new``)."""
    rows, claim = pending.rows, pending.take
    revision, state, updated_us, head = rows.columns
    rid = await conn.fetchval(
        f"WITH landed AS (INSERT INTO {t.runs} (run_id, revision, state, updated_us, head,"
        f"  fence) SELECT $5, $1, $2, $3, $4, 1 WHERE NOT EXISTS (SELECT 1 FROM {t.leases}"
        "  WHERE run_id = $5) ON CONFLICT (run_id) DO NOTHING RETURNING id),"
        f" lease AS (INSERT INTO {t.leases} (run_id, token, owner, expires, proof, lock_key)"
        "  SELECT $5, 1, $13::bytea, extract(epoch FROM clock_timestamp())::float8"
        "  + $14::float8, $15::text, $16::bigint FROM landed),"
        f"{_parts(t, 6, tags=17)}",
        revision,
        state,
        updated_us,
        head,
        run_key(pending.run_id),
        *_part_values(rows),
        run_key(claim.owner),
        claim.ttl,
        claim.proof,
        claim.lock_key,
        *_tag_values(rows),
    )
    if rid is None:
        return None
    pending.taken.append(1)
    return Stored(rid, pending.run_id, rows.revision, state, head)


def _parts(
    t: Tables, n: int, result: str = " SELECT id FROM landed", *, tags: int | None = None
) -> str:
    """The rest of a one-statement commit after its ``landed`` (the run row's id when it
    landed): the commit entry, messages, turns and blobs, from the ``_part_values`` given
    as parameters ``$n`` onwards (``$1`` is the revision), and the statement's ``result``
    (by default the run row's id, when it landed). With ``tags`` (a new run's commit),
    its tag index rows too, from the ``_tag_values`` given as ``$tags`` onwards."""
    p = [f"${n + i}" for i in range(7)]
    tagged = (
        ""
        if tags is None
        else f" tags AS (INSERT INTO {t.tags} (rid, key, value) SELECT id, k, v FROM landed,"
        f"  unnest(${tags}::text[], ${tags + 1}::text[]) AS u(k, v)),"
    )
    return (
        tagged + f" entry AS (INSERT INTO {t.commits} (rid, revision, entry)"
        f"  SELECT id, $1, {p[0]} FROM landed),"
        f" messages AS (INSERT INTO {t.messages} (rid, pos, doc)"
        f"  SELECT id, {p[1]} + n - 1, d FROM landed,"
        f"  unnest({p[2]}::bytea[]) WITH ORDINALITY AS u(d, n)),"
        f" turns AS (INSERT INTO {t.turns} (rid, pos, doc)"
        f"  SELECT id, {p[3]} + n - 1, d FROM landed,"
        f"  unnest({p[4]}::bytea[]) WITH ORDINALITY AS u(d, n)),"
        f" blobs AS (INSERT INTO {t.blobs} (rid, key, data)"
        f"  SELECT id, k, d FROM landed, unnest({p[5]}::text[], {p[6]}::bytea[]) AS u(k, d)"
        "  ON CONFLICT DO NOTHING)"
        f"{result}"
    )


def _part_values(rows: CommitRows) -> tuple[Any, ...]:
    """The parameters of ``_parts``, in order."""
    return (
        rows.entry,
        rows.first_message,
        list(rows.messages),
        rows.first_turn,
        list(rows.turns),
        [k for k, _ in rows.blobs],
        [v for _, v in rows.blobs],
    )


def _tag_values(rows: CommitRows) -> tuple[list[str], list[str]]:
    """The parameters of the tag index rows of ``_parts``: keys, then values."""
    pairs = rows.tags or ()
    return [k for k, _ in pairs], [v for _, v in pairs]


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
    if rows.tags is not None:  # the run's tag index rows replaced
        await conn.execute(f"DELETE FROM {t.tags} WHERE rid = $1", rid)
        await conn.execute(
            f"INSERT INTO {t.tags} (rid, key, value)"
            " SELECT $1, k, v FROM unnest($2::text[], $3::text[]) AS u(k, v)",
            rid,
            *_tag_values(rows),
        )


async def delete_run(conn: Any, t: Tables, run_id: str) -> bool:
    """Remove a run with all its rows; False if there was none."""
    key = run_key(run_id)
    async with conn.transaction():
        await conn.execute(f"DELETE FROM {t.leases} WHERE run_id = $1", key)
        rid = await conn.fetchval(f"DELETE FROM {t.runs} WHERE run_id = $1 RETURNING id", key)
        if rid is None:
            return False
        for table in (t.commits, t.messages, t.turns, t.blobs, t.tags):
            await conn.execute(f"DELETE FROM {table} WHERE rid = $1", rid)
        return True
