"""``sqlite:///path.db``: runs in one SQLite file (WAL, safe across processes).

``sqlite:///runs.db`` is relative to the working directory, ``sqlite:////abs/runs.db``
absolute. Options in the query: ``synchronous=full|normal|extra`` (default full)
and ``busy_timeout=<ms>`` (default 10000). A commit is one ``BEGIN IMMEDIATE``
transaction that checks the head revision, writes the head, its commit log entry,
new messages, turns and blobs.

Every operation is one function run whole on the connection's thread
(``_ops``, on the daemon thread of ``_thread``), so it costs one hop
from the event loop. Commits of different runs that are ready at the same moment
share that hop, one transaction and one fsync (group commit: ``_group``,
``_writer``), each with its own compare-and-set and outcome. A store remembers the
head it last wrote or loaded per run; the commit's transaction checks that the
stored (row id, revision) is still that head before it writes, and when not, the
commit is encoded again on the head found (or refused with ``ConflictError``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from statekernel._records.events import Event
from statekernel._records.run import Cancellation, Run, StateId
from statekernel._records.tags import check_tag_filter
from statekernel._storage.closing import Closing
from statekernel._storage.protocol import Checkpoint, DamagedRun, Lease, RunPage, RunSummary
from statekernel._storage.shielding import shielded
from statekernel._storage.unclosed import warn_unclosed
from statekernel.errors import (
    ConfigError,
    CorruptCheckpoint,
    RunNotFound,
    StatekernelError,
    StoreError,
)
from statekernel.stores._common import (
    HeadCache,
    Prior,
    check_head,
    check_revision,
    checked_events,
    checked_listing,
    checked_revision,
    checked_run_id,
    created_run,
    micros,
)
from statekernel.stores._format.cancels import decode_cancel, encode_cancel
from statekernel.stores._format.checksum import seal, unseal, unseal_blobs, unseal_each
from statekernel.stores._format.codec import (
    EncodedCommit,
    check_log,
    check_parts,
    decode_events,
    decode_run,
    encode_commit,
    head_summary,
    iter_history,
    log_ends,
    snapshot_of,
)
from statekernel.stores._format.documents import dump_bytes, enc_time, load_json
from statekernel.stores._group import GroupCommit
from statekernel.stores._host.holders import holder_of
from statekernel.stores._host.owners import Clock, HostLeased, HostLeases, LeaseChange, LeaseRecord
from statekernel.stores._listing import decode_cursor, encode_cursor, has_tags
from statekernel.stores._sql.columns import BAD_STATE, column_problem
from statekernel.stores._sql.rows import BadRow, CommitRows, Stored, sealed_rows
from statekernel.stores._sql.tables import (
    PendingWrite,
    checked_head,
    head_at,
    log_entries,
    parse_docs,
)
from statekernel.stores.sqlite._file import (
    StoreConnection,
    connect,
    file_state,
    needs_read_only,
    opens_immutable,
    prepare_file,
)
from statekernel.stores.sqlite._ops import (
    Parts,
    delete_run,
    fetch_all,
    keep_cancel,
    lease_op,
    read_cancel,
    read_events,
    read_head,
    read_lease,
    read_parts,
)
from statekernel.stores.sqlite._schema import (
    STORE_VERSION,
    TAGS_VERSION,
    check_layout,
    migrate_schema,
)
from statekernel.stores.sqlite._thread import SQLiteThread
from statekernel.stores.sqlite._writer import Outcome, Pending, write_commits

__all__ = ["SQLiteStore"]

T = TypeVar("T")
_SYNC = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}


def parse_sqlite_url(url: str) -> tuple[str, str, int]:
    """(path, synchronous, busy timeout ms) of a ``sqlite://`` URL."""
    parts = urlsplit(url)
    if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
        raise ConfigError(f"bad SQLite URL {url!r}: expected sqlite:///relative or sqlite:////abs")
    path = unquote(parts.path[1:])  # %xx: a folder with '#' or '?' in its name
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    sync = options.pop("synchronous", "full").lower()
    timeout = options.pop("busy_timeout", "10000")
    if sync not in _SYNC or not timeout.isdigit() or options:
        raise ConfigError(
            f"bad SQLite URL options in {url!r} (synchronous=full|normal|extra, busy_timeout=ms)"
        )
    return path, _SYNC[sync], int(timeout)


class SQLiteStore(HostLeased, Closing):
    """Runs in one SQLite database file; several processes may share it."""

    settles_on_cancel = True
    """A cancelled commit has landed whole or not at all when the cancellation propagates
    (one still queued is not written; one being written is waited for)."""

    def __init__(
        self, url: str, *, read_only: bool | None = None, clock: Clock | None = None
    ) -> None:
        """``read_only`` None: read-only when the file exists but it or its folder
        cannot be written (a commit then fails with ``StoreError``). Leases of owners of
        this process expire on the monotonic clock, or on ``clock`` (seconds since the
        epoch) when given one, such as ``statekernel.testing.ManualClock``."""
        self.url = url
        self.path, self._sync, self._timeout = parse_sqlite_url(url)
        self.read_only = needs_read_only(self.path) if read_only is None else read_only
        self._conn: SQLiteThread | None = None
        self._raw: sqlite3.Connection | None = None
        self._layout = STORE_VERSION
        """The layout of the file as opened (read-only: perhaps an older one)."""
        self._snapshot: tuple[object, ...] | None = None
        """``file_state`` when the file was opened ``immutable`` (else None)."""
        self._lock = asyncio.Lock()
        self._heads: HeadCache[Stored] = HeadCache()
        folder = None if self.path == ":memory:" else Path(self.path + "-owners")
        self._leases = HostLeases(folder, self._apply, clock=clock)
        self._group: GroupCommit[PendingWrite, Outcome] = GroupCommit(self._write, self._failed)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.url!r})"

    def __del__(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:  # never closed: say so, and let its thread end
            warn_unclosed(f"SQLiteStore {self.url!r}", self)
            conn.stop()

    def _error(self, exc: BaseException) -> StoreError:
        mode = " (opened read-only: it or its folder cannot be written)" if self.read_only else ""
        return StoreError(f"SQLite store {self.path!r}{mode}: {exc}")

    def _connect(self) -> sqlite3.Connection:
        """Open the database file (runs on the connection's own thread)."""
        self._raw = connect(self.path, read_only=self.read_only, timeout_ms=self._timeout)
        return self._raw

    def _setup(self, raw: sqlite3.Connection) -> None:
        """Pragmas and the store's own schema migrations (read-only: a layout check)."""
        if self.read_only:
            self._layout = check_layout(raw, self.path)
            return
        mode = raw.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        raw.execute(f"PRAGMA synchronous = {self._sync}")
        if isinstance(raw, StoreConnection):
            raw.wal = str(mode).lower() == "wal"
            raw.durable = raw.sync = self._sync
        raw.execute("PRAGMA secure_delete = ON")
        migrate_schema(raw)

    def _written_since_opened(self) -> bool:
        """An ``immutable`` connection sees no later write: True when the file changed."""
        if self._snapshot is None:
            return False
        try:
            return file_state(self.path) != self._snapshot
        except OSError:
            return True

    async def _open(self) -> SQLiteThread:
        async with self._lock:
            if self._conn is not None and self._written_since_opened():
                conn, self._conn, self._raw = self._conn, None, None
                self._heads.clear()
                await conn.close()
            if self._conn is not None:
                return self._conn
            try:
                immutable = self.read_only and opens_immutable(self.path)
                self._snapshot = file_state(self.path) if immutable else None
                if self.path != ":memory:" and not self.read_only:
                    prepare_file(Path(self.path))
                conn = SQLiteThread(self._connect, name=f"statekernel {self.url}")
                await conn.open()
            except (OSError, sqlite3.Error) as exc:
                raise self._error(exc) from exc
            try:
                await conn.call(self._setup, self._raw)
            except BaseException as exc:
                await conn.close()
                if isinstance(exc, (sqlite3.Error, StoreError, UnicodeDecodeError)):
                    raise self._error(exc) from exc
                raise
            self._conn = conn
            return conn

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` whole on the connection's thread: one hop.

        The thread runs every call on its connection, one after another (one
        transaction here).
        """
        conn = await self._open()
        try:
            result: T = await conn.call(fn, self._raw, *args)
        except (sqlite3.Error, UnicodeDecodeError, BadRow) as exc:
            raise self._typed(exc) from exc
        return result

    def _typed(self, exc: Exception) -> Exception:
        """A ``statekernel.errors`` exception for ``exc`` (itself if it is one already);
        a value SQLite cannot store (an int beyond 64 bits) is a ``StoreError`` too."""
        if isinstance(exc, StatekernelError):
            return exc
        if isinstance(exc, BadRow):
            return CorruptCheckpoint(f"invalid data in SQLite store {self.path!r}: {exc}")
        return self._error(exc)  # sqlite3 errors, undecodable text in an error message

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its head, or at ``revision``."""
        checked_revision(run_id, revision)
        return await shielded(self._load(run_id, revision))

    async def _load(self, run_id: str, revision: int | None) -> Run:
        what = f"run {run_id!r} in {self.url}"
        heads: list[dict[str, Any]] = []

        def first_entry(stored: Stored) -> int | None:
            heads.append(checked_head(stored, what))  # the columns the load trusts
            wanted = check_revision(run_id, revision, stored.revision)
            return None if wanted == stored.revision else snapshot_of(wanted)

        def head_of(stored: Stored, entries: list[tuple[int, bytes]]) -> dict[str, Any]:
            return head_at(stored, entries, revision, what) if entries else heads[0]

        parts = await self._call(read_parts, run_id, first_entry, head_of, log_ends)
        if parts is None:
            raise RunNotFound(run_id)
        if not parts.entries:
            self._heads.put(run_id, Prior(parts.stored, parts.head))
        return _decode(parts, what)

    async def history(self, run_id: str) -> AsyncIterator[tuple[Run, list[Event]]]:
        """Every revision with the events of its commit, oldest first (for copying runs)."""
        what = f"history of {run_id!r} in {self.url}"

        def head_of(stored: Stored, entries: list[tuple[int, bytes]]) -> dict[str, Any]:
            return head_at(stored, [], None, what)

        parts = await shielded(self._call(read_parts, run_id, lambda _: 0, head_of, log_ends))
        if parts is None:
            raise RunNotFound(run_id)
        entries = log_entries(parts.entries, what)
        messages = parse_docs(unseal_each(parts.messages, f"message of {what}"), what)
        turns = parse_docs(unseal_each(parts.turns, f"completed turn of {what}"), what)
        blobs = unseal_blobs(parts.blobs, what)
        last = parts.stored.revision
        for item in iter_history(entries, messages, turns, blobs, run_id, last=last, what=what):
            yield item

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Land the checkpoint in a ``BEGIN IMMEDIATE`` transaction (compare-and-set, and
        the lease check when ``lease`` is given), shared with the commits of other runs
        that are ready at the same moment."""
        await self._commit(checkpoint, lease)

    def _refuse_leases(self) -> None:
        """A store opened read-only gives no leases (a lease is a write)."""
        if self.read_only:
            raise self._error(OSError("a lease is a write, and this store cannot write"))

    async def _apply(self, run_id: str, change: LeaseChange) -> LeaseRecord | None:
        return await shielded(self._call(lease_op, run_id, change))

    async def holder(self, run_id: str) -> str | None:
        """The live owner holding the run's lease, or None (``ShowsHolders``): read
        without writing, so a store opened read-only tells too."""
        checked_run_id(run_id)
        record = await shielded(self._call(read_lease, run_id))
        return holder_of(record, self._leases.clock(), self._leases.proofs)

    async def request_cancel(self, run_id: str, request: Cancellation) -> Cancellation | None:
        """Keep ``request`` unless a request is kept already (``CancelsRuns``), in one
        ``BEGIN IMMEDIATE`` transaction (so it is ordered with every commit)."""
        checked_run_id(run_id)
        data = encode_cancel(request)
        kept = await shielded(self._call(keep_cancel, run_id, data))
        return None if kept is None else decode_cancel(kept, run_id, self.url)

    async def cancel_request(self, run_id: str) -> Cancellation | None:
        """The run's kept cancel request (``CancelsRuns``)."""
        checked_run_id(run_id)
        kept = await shielded(self._call(read_cancel, run_id))
        return None if kept is None else decode_cancel(kept, run_id, self.url)

    async def commit_and_release(self, checkpoint: Checkpoint, *, lease: Lease) -> None:
        """``commit`` that also gives ``lease`` up in its transaction (``ReleasesWithCommit``)."""
        await self._commit(checkpoint, lease, release=True)
        self._leases.let_go(lease)

    async def create_leased(
        self, checkpoint: Checkpoint, owner: str, *, ttl: float
    ) -> Lease | None:
        """``commit`` of a new run that takes its lease in its transaction (``CreatesLeased``)."""
        self._refuse_leases()
        created_run(checkpoint)
        run_id = checkpoint.run.run_id

        async def write(change: LeaseChange) -> LeaseRecord | None:
            return await self._commit(checkpoint, None, take=change)

        return await self._leases.create(run_id, owner, ttl, write)

    async def _commit(
        self,
        cp: Checkpoint,
        lease: Lease | None,
        *,
        release: bool = False,
        take: LeaseChange | None = None,
    ) -> LeaseRecord | None:
        """Land ``cp``; with ``take``, the lease record taken with it."""
        run_id = cp.run.run_id
        known = self._heads.get(run_id) if cp.run.revision > 0 else None
        if cp.run.revision > 0 and (known is None or known.key.revision != cp.expected_revision):
            known = self._prior(run_id, await self._call(read_head, run_id))
        while True:
            check_head(cp, None if known is None else known.key.revision)
            if known is None:
                enc, expect, prior = encode_commit(cp, None), None, None
            else:
                enc = encode_commit(cp, known.head, known.refs)
                expect, prior = (known.key.rid, known.key.revision), known.head
            release = release and lease is not None
            pending = Pending(run_id, expect, _rows(cp, enc, prior), lease, release, take)
            landed, stored = await self._group.submit(PendingWrite(pending, enc))
            if landed:
                return pending.taken[0] if pending.taken else None
            known = self._prior(run_id, stored)

    async def _write(self, batch: list[PendingWrite]) -> list[Outcome | Exception]:
        """Write a batch of commits in one transaction; remember the heads that landed."""
        outcomes = await self._call(write_commits, [c.pending for c in batch])
        for commit, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, Exception):
                continue
            landed, stored = outcome
            if landed and stored is not None:
                enc = commit.encoded
                self._heads.put(commit.pending.run_id, Prior(stored, enc.head, enc.refs))
        return [self._typed(o) if isinstance(o, Exception) else o for o in outcomes]

    def _failed(self, exc: BaseException) -> BaseException:
        """What each caller of a batch whose transaction failed gets."""
        if isinstance(exc, StoreError):
            return StoreError(str(exc))
        return self._error(exc)

    def _prior(self, run_id: str, stored: Stored | None) -> Prior[Stored] | None:
        return None if stored is None else Prior(stored, self._head(stored, run_id))

    def _head(self, stored: Stored, run_id: str) -> dict[str, Any]:
        return checked_head(stored, f"run {run_id!r} in {self.url}")

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Persisted events of the revisions after ``after_revision``."""
        after_revision, limit = checked_events(run_id, after_revision, limit)
        what = f"events of run {run_id!r} in {self.url}"
        found: list[Event] = []
        first = max(after_revision + 1, 0)
        nxt = [first]

        def collect(batch: list[tuple[int, bytes]]) -> bool:
            entries = log_entries(batch, what)
            check_log(entries, nxt[0], None, what)
            nxt[0] += len(entries)
            found.extend(decode_events(entries, run_id, what=what))
            return limit is not None and len(found) >= limit

        stored = await shielded(self._call(read_events, run_id, first, collect))
        if stored is None:
            raise RunNotFound(run_id)
        checked_head(stored, f"run {run_id!r} in {self.url}")
        if limit is None or len(found) < limit:
            check_log([], nxt[0], stored.revision, what)
        return found if limit is None else found[:limit]

    async def run_ids(self, prefix: str, *, limit: int) -> list[str]:
        """The ids of at most ``limit`` runs starting with ``prefix`` (``FindsRunIds``):
        one range of the runs' primary key."""
        after = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"
        sql = "SELECT run_id FROM runs WHERE run_id >= ? AND run_id < ?"
        sql += " AND substr(run_id, 1, ?) = ? ORDER BY run_id LIMIT ?"
        params = [prefix, after, len(prefix), prefix, max(limit, 0)]
        rows = await shielded(self._call(fetch_all, sql, params))
        return [str(row[0]) for row in rows]

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        """Runs, newest update first; ``tags`` found through the ``run_tags`` index (a
        read-only file of an older layout has no run with tags)."""
        limit = checked_listing(state, updated_after, limit, cursor)
        wanted = check_tag_filter(tags)
        if wanted and self.read_only:
            await self._open()  # the file's layout is known once it is open
        if wanted and self._layout < TAGS_VERSION:
            return RunPage(())
        where, params = _filters(state, updated_after, cursor, wanted)
        sql = f"SELECT {_LISTED} FROM runs{where} ORDER BY updated_us DESC, run_id DESC LIMIT ?"
        params.append(max(limit, 0) + 1)
        rows = await shielded(self._call(fetch_all, sql, params))
        summaries: list[RunSummary] = []
        damaged: list[DamagedRun] = []
        for row in rows:
            self._summary(row, summaries, damaged, wanted)
        if state is not None and cursor is None:  # rows the filter cannot match: damaged
            bad_sql = f"SELECT {_LISTED} FROM runs INDEXED BY runs_by_state WHERE {BAD_STATE[0]}"
            bad = await shielded(self._call(fetch_all, bad_sql, BAD_STATE[1]))
            for row in bad:
                self._summary(row, [], damaged)
        page = tuple(summaries[:limit])
        more = len(rows) > limit and bool(page)
        return RunPage(page, encode_cursor(page[-1]) if more else None, tuple(damaged))

    def _summary(
        self,
        row: tuple[Any, ...],
        found: list[RunSummary],
        damaged: list[DamagedRun],
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """The listing line of a ``runs`` row, or the row named in ``damaged`` when its
        head cannot be read, its columns do not match its head, or it was found by
        ``tags`` its head does not carry (its ``run_tags`` rows are damaged)."""
        run_id, revision, state, updated_us, head = row
        what = f"run {run_id!r} in {self.url}"
        try:
            summary = head_summary(load_json(unseal(head, f"head of {what}"), what), what=what)
            columns = {"run_id": run_id, "revision": revision, "state": state}
            problem = column_problem({**columns, "updated_us": updated_us}, summary)
            if problem is None and tags and not has_tags(summary, tags):
                problem = f"its run_tags rows hold {dict(tags)!r}, its head {summary.tags!r}"
            if problem is not None:
                raise CorruptCheckpoint(f"invalid {what}: {problem}")
        except CorruptCheckpoint as exc:
            damaged.append(DamagedRun(str(run_id), str(exc)))
            return
        found.append(summary)

    def forget(self, run_id: str) -> None:
        """Forget the run's head this store remembers from its last commit or load (it
        builds the next commit on it). For a writer that changed the run's records
        without the store (a repair, a test that damages them): the next commit or load
        reads the head from the database again."""
        checked_run_id(run_id)
        self._heads.drop(run_id)

    async def delete(self, run_id: str) -> bool:
        """Remove the run with every revision, part, blob and event."""
        checked_run_id(run_id)
        self._heads.drop(run_id)
        return await shielded(self._call(delete_run, run_id))

    async def aclose(self) -> None:
        """Close the connection."""
        async with self._lock:
            conn, self._conn, self._raw = self._conn, None, None
            self._heads.clear()
            self._leases.close()
            if conn is not None:
                await conn.close()


def _rows(cp: Checkpoint, enc: EncodedCommit, prior: dict[str, Any] | None) -> CommitRows:
    run = cp.run
    turns = enc.head["$t"][1] + (1 if "current_turn" in enc.head else 0)
    columns = (
        run.revision,
        run.state,
        run.model,
        turns,
        enc_time(run.created_at),
        enc_time(run.updated_at),
        micros(run.updated_at),
        seal(dump_bytes(enc.head)),
    )
    return sealed_rows(columns, cp, enc, prior)


_LISTED = "run_id, revision, state, updated_us, head"
"""The columns a listing reads: the head, and the columns it checks against the head."""


def _decode(parts: Parts, what: str) -> Run:
    check_parts(log_ends(parts.head), len(parts.messages), len(parts.turns), what)
    messages = unseal_each(parts.messages, f"message of {what}")  # parsed as decoded
    turns = unseal_each(parts.turns, f"completed turn of {what}")  # parsed when read
    blobs = unseal_blobs(parts.blobs, what)
    return decode_run(parts.head, messages, turns, blobs, what=what)


def _filters(
    state: StateId | None,
    updated_after: datetime | None,
    cursor: str | None,
    tags: Mapping[str, str] | None = None,
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for key, value in (tags or {}).items():  # each pair: one range of run_tags_by_pair
        clauses.append("id IN (SELECT rid FROM run_tags WHERE key = ? AND value = ?)")
        params += [key, value]
    if state is not None:
        clauses.append("state = ?")
        params.append(state)
    if updated_after is not None:
        clauses.append("updated_us > ?")
        params.append(micros(updated_after))
    if cursor is not None:
        at, run_id = decode_cursor(cursor)
        clauses.append("(updated_us < ? OR (updated_us = ? AND run_id < ?))")
        params += [micros(at), micros(at), run_id]
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params
