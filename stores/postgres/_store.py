"""``postgresql://user:pass@host:port/db`` (also ``postgres://``): runs in PostgreSQL.

The records and their checksums are those of the SQLite store (``stores/_format``),
in tables of one schema (``schema=``, default ``statekernel``; ``schema``). The driver
is asyncpg: ``PostgresStore(url)`` opens a pool of its own, ``PostgresStore(pool=...)``
uses one the caller owns (and closes). ``pgbouncer=1`` for PgBouncer in transaction
mode (``url``).

A commit is one transaction: the fencing check on the run's lease row and the
compare-and-set on the run's (row id, revision) in its ``UPDATE`` (``ops``). Commits
of different runs that are ready at the same moment share one transaction, each in a
savepoint of its own with its own outcome (``_group``, ``writer``). A run's cancel
request is kept in its row and checked in that same ``UPDATE`` (``cancels``). A lease expires
on the server's clock; its row says how its owner proves it is alive (``leases``): by
its session's advisory lock (``owners``), so a crashed owner's runs are taken over
about a second after its lock went free, or by renewals alone (PgBouncer).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from statekernel._records.events import Event
from statekernel._records.run import STATE_IDS, Cancellation, Run, StateId, TraceParent
from statekernel._records.tags import check_tag_filter
from statekernel._secrets import logger, redact, redact_url, remember_url
from statekernel._storage.closing import Closing
from statekernel._storage.protocol import Checkpoint, DamagedRun, Lease, RunPage, RunSummary
from statekernel._storage.queues import queue_key
from statekernel._storage.shielding import shielded
from statekernel._storage.unclosed import warn_unclosed
from statekernel._storage.watching import Feed, poll_watch
from statekernel.errors import (
    ConfigError,
    CorruptCheckpoint,
    LeaseLost,
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
)
from statekernel.stores._format.cancels import check_cancellable, decode_cancel, encode_cancel
from statekernel.stores._format.checksum import unseal, unseal_blobs, unseal_each
from statekernel.stores._format.codec import (
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
from statekernel.stores._format.documents import load_json
from statekernel.stores._group import GroupCommit
from statekernel.stores._listing import encode_cursor, has_tags
from statekernel.stores._sql.columns import column_problem
from statekernel.stores._sql.rows import BadRow, Stored
from statekernel.stores._sql.tables import (
    PendingWrite,
    checked_head,
    head_at,
    log_entries,
    parse_docs,
)
from statekernel.stores.postgres import _cancels as cancels
from statekernel.stores.postgres import _leases as leases
from statekernel.stores.postgres import _listening
from statekernel.stores.postgres import _ops as ops
from statekernel.stores.postgres._connections import (
    DRIVER_ERRORS,
    Reused,
    borrowed,
    give_back_reset,
)
from statekernel.stores.postgres._leases import EFFECT_WINDOW, LOCK, RENEWAL, Claim
from statekernel.stores.postgres._listening import Listening
from statekernel.stores.postgres._owners import OwnerLocks
from statekernel.stores.postgres._queue import PostgresRunQueue
from statekernel.stores.postgres._queue_admin import queue_names
from statekernel.stores.postgres._rows import commit_rows, listing_filters
from statekernel.stores.postgres._schema import (
    CANCELS_VERSION,
    STORE_VERSION,
    TAGS_VERSION,
    commits_channel,
    layout_version,
    migrate_schema,
)
from statekernel.stores.postgres._url import check_schema, parse_postgres_url
from statekernel.stores.postgres._warm import prepare_statements
from statekernel.stores.postgres._writer import Outcome, Pending, write_commits

__all__ = ["PostgresStore"]

T = TypeVar("T")
log = logger("statekernel.stores")

MIN_POOL = 2
"""The smallest pool a store can work with: one connection for the owners' advisory
locks, one for everything else. Each connection that listens (a run queue being read,
the store's watches) needs one more: a listener that would leave none for the rest is
refused (``ConfigError``), as commits would wait for a connection forever."""

_DRIVER_ERRORS = DRIVER_ERRORS
"""What asyncpg raises for a server, connection or value it cannot send, its protocol
errors after a server fault included (a ``StoreError`` here, ``_connections``);
``BadRow`` is damage (``CorruptCheckpoint``)."""


class PostgresStore(Closing):
    """Runs in a PostgreSQL database; many processes and hosts may share it."""

    settles_on_cancel = True
    """A cancelled commit has landed whole or not at all when the cancellation propagates
    (one still queued is not written; one being written is waited for)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        schema: str | None = None,
        pgbouncer: bool | None = None,
        read_only: bool = False,
    ) -> None:
        """Either ``url`` (the store opens its own pool on first use) or ``pool`` (an
        ``asyncpg.Pool`` the caller owns: never closed here). ``schema`` and
        ``pgbouncer`` override what the URL says (defaults: ``statekernel``, off).
        ``read_only``: the store creates and upgrades nothing (a schema without a
        layout this release reads, its own or an older one, is a ``StoreError``), and
        refuses commits, leases and deletes."""
        if (url is None) == (pool is None):
            raise ConfigError("PostgresStore takes a URL or a pool, one of the two")
        if url is not None:
            remember_url(url)
            target = parse_postgres_url(url)
            self._dsn: str | None = target.dsn
            schema = target.schema if schema is None else schema
            pgbouncer = target.pgbouncer if pgbouncer is None else pgbouncer
            self._notify = target.notify
        else:
            self._dsn = None
            self._notify = True
            size = pool.get_max_size() if pool is not None else MIN_POOL
            if size < MIN_POOL:
                raise ConfigError(
                    f"PostgresStore needs a pool of at least {MIN_POOL} connections, got"
                    f" {size}: an owner's advisory lock holds one for as long as it drives"
                    " runs, and commits need another"
                )
        self.url = url
        self.schema = check_schema("statekernel" if schema is None else schema)
        self.pgbouncer = bool(pgbouncer)
        self.read_only = read_only
        self._pool: asyncpg.Pool | None = pool
        self._owns_pool = pool is None
        self._ready = False
        self._layout = STORE_VERSION  # a read-only store's: read when it opens
        self._lock = asyncio.Lock()
        where = f"Postgres store {self._shown()}"
        self._t = ops.Tables(self.schema, where)
        self._heads: HeadCache[Stored] = HeadCache()
        self._owners = OwnerLocks(
            self.schema,
            self._owner_conn,
            self._owner_done,
            enabled=not self.pgbouncer,
            errors=_DRIVER_ERRORS,
        )
        self._group: GroupCommit[PendingWrite, Outcome] = GroupCommit(self._write, self._failed)
        self._queues: weakref.WeakSet[PostgresRunQueue] = weakref.WeakSet()
        self._watching = asyncio.Lock()
        self._listeners = 0  # connections of the pool that listen (queues, watches)
        self._listening: Listening | None = None

    def _shown(self) -> str:
        target = redact_url(self.url) if self.url is not None else "(a pool)"
        return f"{target!r} schema {self.schema!r}"

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None and getattr(self, "_owns_pool", False):  # never closed
            try:
                what = f"PostgresStore {self._shown()}"
            except Exception:  # at the interpreter's exit the redacted URL may not build
                what = f"PostgresStore in schema {self.schema!r}"
            warn_unclosed(what, self)
            with contextlib.suppress(Exception):
                pool.terminate()  # the server's sessions end now, not at the process's exit

    def __repr__(self) -> str:
        if self.url is None:
            return f"PostgresStore(pool=..., schema={self.schema!r})"
        return f"PostgresStore({redact_url(self.url)!r})"

    def _error(self, exc: BaseException) -> StoreError:
        text = redact(f"{type(exc).__name__}: {exc}")
        return StoreError(f"Postgres store {self._shown()}: {text}")

    def _typed(self, exc: BaseException) -> BaseException:
        if isinstance(exc, StatekernelError):
            return exc
        if isinstance(exc, BadRow):
            return CorruptCheckpoint(f"invalid data in Postgres store {self._shown()}: {exc}")
        return self._error(exc)

    async def _open(self) -> asyncpg.Pool:
        async with self._lock:
            if self._pool is not None and self._ready:
                return self._pool
            try:
                if self._pool is None:
                    self._pool = await asyncpg.create_pool(
                        self._dsn,
                        min_size=1,
                        max_size=10,
                        statement_cache_size=0 if self.pgbouncer else 100,
                        server_settings=None if self._notify else {"statekernel.notify": "off"},
                        init=_warmer(self),
                        connection_class=Reused,
                    )
                async with borrowed(self._pool) as conn:
                    if self.read_only:
                        await self._check_layout(conn)
                    else:
                        await migrate_schema(conn, self.schema)
                    self._ready = True  # the tables exist: new connections warm up
                    await self._warm(conn)
            except (*_DRIVER_ERRORS, ValueError) as exc:
                raise self._typed(exc) from exc
            return self._pool

    async def _warm(self, conn: Any) -> None:
        """Prepare a drive's statements on a new connection of the store's own pool
        (its ``init``), once its tables exist; not behind PgBouncer (no statement is kept
        there). Best effort: a failure shows again where the statement is used."""
        if not self._ready or self.pgbouncer:
            return
        try:
            await prepare_statements(conn, self._t, writable=not self.read_only)
        except (*_DRIVER_ERRORS, BadRow) as exc:
            log.debug("%s: preparing statements: %s", self._shown(), exc)

    async def _check_layout(self, conn: Any) -> None:
        """A read-only store reads its layout or an older one (versions 2 to 5 added
        the run queues, the commit notices and the lease rows' proofs, 6 the cancel
        requests: runs, revisions and events are stored as in version 1), and upgrades
        nothing."""
        version = await layout_version(conn, self.schema)
        if version is None or not 1 <= version <= STORE_VERSION:
            found = "no store" if version is None else f"layout version {version}"
            raise StoreError(
                f"Postgres store {self._shown()}: {found} (this release reads 1 to"
                f" {STORE_VERSION}); opened read-only, nothing is created or upgraded"
            )
        self._layout = version

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"Postgres store {self._shown()} is opened read-only")

    async def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(connection, tables, *args)`` on a connection of the pool, to its end even
        if the caller is cancelled (no half transactions, nothing left running); a
        connection whose state a fault put in doubt is discarded (``_connections``)."""
        pool = await self._open()

        async def work() -> T:
            try:
                async with borrowed(pool) as conn:
                    return await fn(conn, self._t, *args)
            except (*_DRIVER_ERRORS, BadRow) as exc:
                raise self._typed(exc) from exc

        return await shielded(work())

    async def _owner_conn(self) -> Any:
        pool = await self._open()
        try:
            return await pool.acquire()
        except _DRIVER_ERRORS as exc:
            raise self._typed(exc) from exc

    async def _listener_conn(self) -> Any:
        """A connection of the pool to listen on, for as long as a queue is read or
        watches are open; ``ConfigError`` when the pool could then not hold the owners'
        advisory locks and one connection for everything else."""
        pool = await self._open()
        room = pool.get_max_size() - MIN_POOL - self._listeners
        if room < 1:
            raise ConfigError(
                f"Postgres store {self._shown()}: a pool of {pool.get_max_size()}"
                f" connections cannot hold one more that listens ({self._listeners} do"
                f" already, the owners' advisory locks hold one and commits need one):"
                " give the store a larger pool"
            )
        self._listeners += 1
        try:
            return await self._owner_conn()
        except BaseException:
            self._listeners -= 1
            raise

    async def _owner_done(self, conn: Any) -> None:
        """Give back a connection of ``_owner_conn`` with its session's advisory locks
        released; one that fails to release them is discarded (its session ends, and
        its locks with it). Never raises, but for a cancellation."""
        if self._pool is None:
            return
        await give_back_reset(self._pool, conn)

    # -- reads ---------------------------------------------------------------------

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its head, or at ``revision``."""
        checked_revision(run_id, revision)
        what = f"run {run_id!r} in {self._shown()}"
        heads: list[dict[str, Any]] = []

        def first_entry(stored: Stored) -> int | None:
            heads.append(checked_head(stored, what))
            wanted = check_revision(run_id, revision, stored.revision)
            return None if wanted == stored.revision else snapshot_of(wanted)

        def head_of(stored: Stored, entries: list[tuple[int, bytes]]) -> dict[str, Any]:
            return head_at(stored, entries, revision, what) if entries else heads[0]

        if revision is None:  # the head: one statement
            found = await self._run(ops.read_head_parts, run_id)
            if found is None:
                raise RunNotFound(run_id)
            stored, message_docs, turn_docs, blobs = found
            first_entry(stored)
            head = heads[0]
            m_end, t_end = log_ends(head)
            entries: list[tuple[int, bytes]] = []
            messages, turns = ops.below(message_docs, m_end), ops.below(turn_docs, t_end)
        else:
            parts = await self._run(ops.read_parts, run_id, first_entry, head_of, log_ends)
            if parts is None:
                raise RunNotFound(run_id)
            stored, head, entries, messages, turns, blobs = parts
        if not entries:
            self._heads.put(run_id, Prior(stored, head))
        check_parts(log_ends(head), len(messages), len(turns), what)
        return decode_run(
            head,
            unseal_each(messages, f"message of {what}"),
            unseal_each(turns, f"completed turn of {what}"),
            unseal_blobs(blobs, what),
            what=what,
        )

    async def history(self, run_id: str) -> AsyncIterator[tuple[Run, list[Event]]]:
        """Every revision with the events of its commit, oldest first (for copying runs)."""
        what = f"history of {run_id!r} in {self._shown()}"

        def head_of(stored: Stored, entries: list[tuple[int, bytes]]) -> dict[str, Any]:
            return checked_head(stored, what)

        parts = await self._run(ops.read_parts, run_id, lambda _: 0, head_of, log_ends)
        if parts is None:
            raise RunNotFound(run_id)
        stored, _, rows, messages, turns, blobs = parts
        entries = log_entries(rows, what)
        docs = parse_docs(unseal_each(messages, f"message of {what}"), what)
        done = parse_docs(unseal_each(turns, f"completed turn of {what}"), what)
        found = unseal_blobs(blobs, what)
        last = stored.revision
        for item in iter_history(entries, docs, done, found, run_id, last=last, what=what):
            yield item

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Persisted events of the revisions after ``after_revision``."""
        after_revision, limit = checked_events(run_id, after_revision, limit)
        what = f"events of run {run_id!r} in {self._shown()}"
        first = max(after_revision + 1, 0)
        found = await self._run(ops.read_entries, run_id, first, None)
        if found is None:
            raise RunNotFound(run_id)
        stored, rows = found
        checked_head(stored, f"run {run_id!r} in {self._shown()}")
        events: list[Event] = []
        nxt = first
        for start in range(0, len(rows), 256):
            entries = log_entries(rows[start : start + 256], what)
            check_log(entries, nxt, None, what)
            nxt += len(entries)
            events.extend(decode_events(entries, run_id, what=what))
            if limit is not None and len(events) >= limit:
                return events[:limit]
        check_log([], nxt, stored.revision, what)
        return events if limit is None else events[:limit]

    async def run_ids(self, prefix: str, *, limit: int) -> list[str]:
        """The ids of at most ``limit`` runs starting with ``prefix`` (``FindsRunIds``):
        one range of the runs' unique key (run ids are stored as their UTF-8 bytes, which
        sort bytewise)."""
        low = ops.run_key(prefix)
        sql = f"SELECT run_id FROM {self._t.runs} WHERE run_id >= $1"
        params: list[Any] = [low]
        if low.rstrip(b"\xff"):  # the first byte string after every one starting so
            high = low.rstrip(b"\xff")
            params.append(high[:-1] + bytes([high[-1] + 1]))
            sql += " AND run_id < $2"
        params.append(max(limit, 0))
        sql += f" ORDER BY run_id LIMIT ${len(params)}"
        rows = await self._run(_fetch, sql, params)
        return [bytes(row[0]).decode("utf-8", "surrogatepass") for row in rows]

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        """Runs, newest update first; ``tags`` found through ``run_tags`` (a read-only
        store of an older layout has no run with tags)."""
        limit = checked_listing(state, updated_after, limit, cursor)
        wanted = check_tag_filter(tags)
        if wanted and self.read_only:
            await self._open()  # the layout is known once the store is open
        if wanted and self._layout < TAGS_VERSION:
            return RunPage(())
        where, params = listing_filters(self._t, state, updated_after, cursor, wanted)
        params.append(max(limit, 0) + 1)
        sql = (
            f"SELECT run_id, revision, state, updated_us, head FROM {self._t.runs}{where}"
            f" ORDER BY updated_us DESC, run_id DESC LIMIT ${len(params)}"
        )
        rows = await self._run(_fetch, sql, params)
        summaries: list[RunSummary] = []
        damaged: list[DamagedRun] = []
        for row in rows:
            self._summary(row, summaries, damaged, wanted)
        if state is not None and cursor is None:  # rows the filter cannot match: damaged
            bad = (
                f"SELECT run_id, revision, state, updated_us, head FROM {self._t.runs}"
                " WHERE state <> ALL($1::text[])"
            )
            for row in await self._run(_fetch, bad, [list(STATE_IDS)]):
                self._summary(row, [], damaged)
        page = tuple(summaries[:limit])
        more = len(rows) > limit and bool(page)
        return RunPage(page, encode_cursor(page[-1]) if more else None, tuple(damaged))

    def _summary(
        self,
        row: Any,
        found: list[RunSummary],
        damaged: list[DamagedRun],
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """The listing line of a row, or the row in ``damaged`` (a head that cannot be
        read, columns or ``run_tags`` rows that do not match it)."""
        raw_id, revision, state, updated_us, head = row
        run_id = raw_id.decode("utf-8", "replace")
        what = f"run {run_id!r} in {self._shown()}"
        try:
            summary = head_summary(load_json(unseal(head, f"head of {what}"), what), what=what)
            columns = {"run_id": run_id, "revision": revision, "state": state}
            problem = column_problem({**columns, "updated_us": updated_us}, summary)
            if problem is None and tags and not has_tags(summary, tags):
                problem = f"its run_tags rows hold {dict(tags)!r}, its head {summary.tags!r}"
            if problem is not None:
                raise CorruptCheckpoint(f"invalid {what}: {problem}")
        except CorruptCheckpoint as exc:
            damaged.append(DamagedRun(run_id, str(exc)))
            return
        found.append(summary)

    # -- writes --------------------------------------------------------------------

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Land the checkpoint in one transaction (compare-and-set, and the lease check
        when ``lease`` is given), shared with the commits of other runs ready at the
        same moment."""
        await self._commit(checkpoint, lease)

    async def commit_and_release(self, checkpoint: Checkpoint, *, lease: Lease) -> None:
        """``commit`` that also gives ``lease`` up in its transaction (``ReleasesWithCommit``),
        and then, with the owner's last lease here, its advisory lock. The commit has
        landed once that step begins: a failure to unlock is logged, not raised (raised,
        it would read as a commit whose outcome is unknown, and the lease be counted
        off twice)."""
        await self._commit(checkpoint, lease, release=True)
        try:
            await self._owner_locks(self._owners.drop(lease.owner))
        except StoreError as exc:  # the lock ends with its session
            log.warning("%s: giving back the owner lock of %s: %s", self._shown(), lease.owner, exc)

    async def create_leased(
        self, checkpoint: Checkpoint, owner: str, *, ttl: float
    ) -> Lease | None:
        """``commit`` of a new run that takes its lease in the same statement (token 1;
        ``CreatesLeased``), under the owner's advisory lock as ``acquire`` takes it. An id
        that kept a lease row (its run deleted by hand) gets its run created without the
        lease (None): ``acquire`` decides about that row as usual."""
        checked_run_id(checkpoint.run.run_id)
        self._writable()
        created_run(checkpoint)
        await self._owner_locks(self._owners.hold(owner))
        try:
            token = await self._commit(checkpoint, None, take=self._claim(owner, ttl))
        except BaseException:
            await self._owner_locks(self._owners.drop(owner))
            raise
        if token is None:
            await self._owner_locks(self._owners.drop(owner))
            return None
        return Lease(checkpoint.run.run_id, owner, str(token))

    async def _commit(
        self,
        checkpoint: Checkpoint,
        lease: Lease | None,
        *,
        release: bool = False,
        take: Claim | None = None,
    ) -> int | None:
        """Land ``checkpoint``; with ``take`` (a new run), the token of the lease taken."""
        self._writable()
        cp = checkpoint
        run_id = cp.run.run_id
        known = self._heads.get(run_id) if cp.run.revision > 0 else None
        if cp.run.revision > 0 and (known is None or known.key.revision != cp.expected_revision):
            known = self._prior(run_id, await self._run(ops.read_head, run_id))
        while True:
            check_head(cp, None if known is None else known.key.revision)
            if known is None:
                enc, expect, prior = encode_commit(cp, None), None, None
            else:
                enc = encode_commit(cp, known.head, known.refs)
                expect, prior = (known.key.rid, known.key.revision), known.head
            release = release and lease is not None
            rows = commit_rows(cp, enc, prior)
            pending = Pending(run_id, expect, rows, lease, release, take)
            landed, stored = await self._group.submit(PendingWrite(pending, enc))
            if landed:
                return int(pending.taken[0]) if pending.taken else None
            known = self._prior(run_id, stored)

    async def _write(self, batch: list[PendingWrite]) -> list[Outcome | BaseException]:
        outcomes = await self._run(write_commits, [c.pending for c in batch])
        for commit, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                continue
            landed, stored = outcome
            if landed and stored is not None:
                enc = commit.encoded
                self._heads.put(commit.pending.run_id, Prior(stored, enc.head, enc.refs))
        return [self._typed(o) if isinstance(o, BaseException) else o for o in outcomes]

    def _failed(self, exc: BaseException) -> BaseException:
        if isinstance(exc, StoreError):
            return StoreError(str(exc))
        return self._typed(exc)

    def _prior(self, run_id: str, stored: Stored | None) -> Prior[Stored] | None:
        if stored is None:
            return None
        return Prior(stored, checked_head(stored, f"run {run_id!r} in {self._shown()}"))

    async def request_cancel(self, run_id: str, request: Cancellation) -> Cancellation | None:
        """Keep ``request`` in the run's row unless a request is kept already
        (``CancelsRuns``), in one statement that locks the row: a commit of the run
        waits for it, or it for the commit (``cancels``)."""
        checked_run_id(run_id)
        self._writable()
        data = encode_cancel(request)
        found = await self._run(cancels.keep_cancel, run_id, data)
        if found is None:
            raise RunNotFound(run_id)
        state, kept, now = found
        if kept is not None:
            return decode_cancel(kept, run_id, self._t.where)
        check_cancellable(run_id, state)
        if not now:  # the locked row allowed it: the statement must have kept it
            raise StoreError(f"Postgres store {self._shown()}: the cancel request was not kept")
        return None

    async def cancel_request(self, run_id: str) -> Cancellation | None:
        """The run's kept cancel request (``CancelsRuns``): None also when no run has the
        id, or when the store, opened read-only, has a layout older than cancel requests."""
        checked_run_id(run_id)
        await self._open()
        if self._layout < CANCELS_VERSION:
            return None
        kept = await self._run(cancels.read_cancel, run_id)
        return None if kept is None else decode_cancel(kept, run_id, self._t.where)

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
        self._writable()
        self._heads.drop(run_id)
        return await self._run(ops.delete_run, run_id)

    # -- commit notices ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def watch(self, run_id: str | None = None) -> AsyncIterator[Feed]:
        """Notices of the commits of ``run_id`` (or of every run) made once entered, sent
        by a trigger on the runs table and received with ``LISTEN`` on a connection of
        the pool (listened again after the server ended its session: notices of the gap
        are missed); the watches of a store share that one connection. Behind
        PgBouncer, where a session cannot listen, it polls the listing instead."""
        if run_id is not None:
            checked_run_id(run_id)
        if self.pgbouncer:
            async with poll_watch(self, run_id) as polled:
                yield polled
            return
        await self._open()
        feed = Feed(run_id)
        async with self._watching:
            listening = self._listening
            if listening is None:
                listening = Listening(self, commits_channel(self.schema))
                await listening.start()
                self._listening = listening
            listening.feeds.add(feed)
        try:
            yield feed
        finally:
            listening.feeds.discard(feed)
            if not listening.feeds and self._listening is listening:
                self._listening = None  # the last watch gives the connection back
                await shielded(listening.stop())  # to its end, cancelled again or not

    # -- run queues ----------------------------------------------------------------

    async def queue_names(self) -> list[str]:
        """The names of the run queues with entries or dead letters, sorted."""
        return await self._run(queue_names)

    def run_queue(self, name: str) -> PostgresRunQueue:
        """The run queue ``name``: a table next to the runs, read with ``SKIP LOCKED``
        and woken by ``LISTEN/NOTIFY`` (polled behind PgBouncer)."""
        queue = PostgresRunQueue(
            name,
            self._t,
            self._run,
            acquire=self._listener_conn,
            release=self._listener_done,
            listens=not self.pgbouncer,
            typed=self._driver_error,
        )
        self._queues.add(queue)  # closed with the store: a pool waits for its connections
        return queue

    async def submit(
        self,
        run_id: str,
        queue: str = "default",
        *,
        delay_ms: int = 0,
        key: str | None = None,
        key_limit: int = 1,
        trace: TraceParent | None = None,
    ) -> str:
        """Enqueue the existing run on the run queue ``queue`` for workers, taken no
        sooner than ``delay_ms`` from now, and with a ``key`` only while fewer than
        ``key_limit`` entries of that key are taken, carrying ``trace``; the entry id."""
        checked_run_id(run_id)
        self._writable()
        limit = queue_key(key, key_limit)
        run_queue = self.run_queue(queue)
        found = await run_queue.submit_existing(run_id, delay_ms, key, limit, trace)
        if found is None:
            raise RunNotFound(run_id)
        return str(found)

    def _driver_error(self, exc: BaseException) -> BaseException:
        """A ``StoreError`` for what the driver raised, else ``exc`` as is."""
        return self._typed(exc) if isinstance(exc, _DRIVER_ERRORS) else exc

    async def _listener_done(self, conn: Any) -> None:
        """Give a listening connection (a queue's, the watches') back to the pool, its
        session's ``LISTEN`` and locks ended first (discarded when they cannot be)."""
        self._listeners -= 1
        if self._pool is not None:
            await give_back_reset(self._pool, conn)

    # -- leases --------------------------------------------------------------------

    @property
    def effect_window(self) -> float | None:
        """Seconds after the start of the last renewal of a lease that succeeded within
        which its owner may start a model or tool call without renewing first (None:
        the TTL alone bounds it). An owner proven alive by its advisory lock renews at
        least this often while it starts effects (``_leases``), so that a taker who
        found its lock free cannot have taken the run meanwhile."""
        return None if self.pgbouncer else EFFECT_WINDOW

    def _claim(self, owner: str, ttl: float) -> Claim:
        key = self._owners.key(owner)
        return Claim(owner, ttl, RENEWAL if key is None else LOCK, key)

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        """Take the run's lease. An owner whose lease expired on the server's clock is
        taken over; a live one never: one proven by its advisory lock once the lock has
        stayed free for ``GRACE`` seconds (about a second after its process died), one
        proven by renewals (PgBouncer) once its lease expired."""
        checked_run_id(run_id)
        self._writable()
        await self._owner_locks(self._owners.hold(owner))
        try:
            token, was = await self._run(leases.take_over, run_id, self._claim(owner, ttl))
        except BaseException:
            await self._owner_locks(self._owners.drop(owner))
            raise
        return Lease(run_id, owner, str(token), taken_from=was)

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        """Extend the lease from the server's now (``LeaseLost`` if it moved on)."""
        checked_run_id(lease.run_id)
        claim = self._claim(lease.owner, ttl)
        await self._run(leases.renew, lease.run_id, lease.owner, _token(lease), claim)

    async def release(self, lease: Lease) -> None:
        """Give the lease up and, with the owner's last lease here, its advisory lock."""
        try:
            checked_run_id(lease.run_id)
            await self._run(leases.give_back, lease.run_id, lease.owner, _token(lease))
        finally:
            await self._owner_locks(self._owners.drop(lease.owner))

    async def holder(self, run_id: str) -> str | None:
        """The live owner holding the run, read without writing (``ShowsHolders``): a
        store opened read-only, by a role that may only read, answers too."""
        checked_run_id(run_id)
        return await self._run(leases.holder, run_id)

    async def fence(self, run_id: str) -> int:
        """The largest fencing token given for the run (``KeepsFences``)."""
        checked_run_id(run_id)
        return await self._run(leases.fence, run_id)

    async def keep_fence(self, run_id: str, at_least: int) -> None:
        """Make every later token of the run larger than ``at_least`` (``KeepsFences``)."""
        checked_run_id(run_id)
        self._writable()
        await self._run(leases.keep_fence, run_id, at_least)

    async def _owner_locks(self, step: Awaitable[None]) -> None:
        """Take or give back an owner's advisory lock; the driver's errors are typed."""
        try:
            await step
        except _DRIVER_ERRORS as exc:
            raise self._typed(exc) from exc

    async def aclose(self) -> None:
        """Close the pool the store opened (a pool it was given stays open), after the
        listening connections of its run queues and watches went back to it."""
        for queue in list(self._queues):
            await queue.aclose()
        listening, self._listening = self._listening, None
        if listening is not None:
            await shielded(listening.stop())
        await self._owners.close()
        async with self._lock:
            pool, self._ready = self._pool, False
            self._heads.clear()
            if self._owns_pool:
                self._pool = None
                if pool is not None:
                    await _close(pool)


def _token(lease: Lease) -> int:
    """The number a lease's token is stored as; ``LeaseLost`` for one no lease has."""
    try:
        return int(lease.token)
    except ValueError:
        raise LeaseLost(lease.run_id, -1, lease.token) from None


async def _close(pool: asyncpg.Pool) -> None:
    """Close ``pool`` gracefully within ``_listening.STOP_WITHIN`` seconds, else terminate it: a
    graceful close waits for every connection to be given back, and one that never is
    (its task stuck on a server that died) held ``aclose`` forever (asyncpg advises
    bounding it so)."""
    try:
        async with asyncio.timeout(_listening.STOP_WITHIN):
            await pool.close()
    except TimeoutError:
        log.warning(
            "the PostgreSQL pool did not close within %.0f s: its connections are cut",
            _listening.STOP_WITHIN,
        )
        pool.terminate()


async def _fetch(conn: Any, t: ops.Tables, sql: str, params: list[Any]) -> list[Any]:
    return list(await conn.fetch(sql, *params))


def _warmer(store: PostgresStore) -> Callable[[Any], Awaitable[None]]:
    """The pool's ``init``: ``store._warm``, without the pool keeping the store alive (a
    store collected unclosed must warn and end its sessions)."""
    ref = weakref.ref(store)

    async def warm(conn: Any) -> None:
        live = ref()
        if live is not None:
            await live._warm(conn)

    return warm
