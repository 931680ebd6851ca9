"""``sqlite:///path.db``: runs in one SQLite file (aiosqlite, WAL, safe across processes).

``sqlite:///runs.db`` is relative to the working directory, ``sqlite:////abs/runs.db``
absolute. Options in the query: ``synchronous=full|normal|extra`` (default full)
and ``busy_timeout=<ms>`` (default 10000). A commit is one ``BEGIN IMMEDIATE``
transaction that checks the head revision, writes the head, its commit log entry,
new messages, turns and blobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import aiosqlite

from statekernel._codec import (
    decode_events,
    decode_run,
    encode_commit,
    head_summary,
    iter_history,
    log_ends,
    replay,
    snapshot_of,
)
from statekernel._codec_base import dump_bytes, enc_time, load_json
from statekernel._events import Event
from statekernel._run import Run, StateId
from statekernel._storage import Checkpoint, RunPage
from statekernel.errors import ConfigError, CorruptCheckpoint, RunNotFound, StoreError
from statekernel.stores._common import check_head, check_revision, micros
from statekernel.stores._listing import decode_cursor, encode_cursor
from statekernel.stores._sqlite_schema import migrate_schema

__all__ = ["SQLiteStore"]

T = TypeVar("T")
_SYNC = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}


def parse_sqlite_url(url: str) -> tuple[str, str, int]:
    """(path, synchronous, busy timeout ms) of a ``sqlite://`` URL."""
    parts = urlsplit(url)
    if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
        raise ConfigError(f"bad SQLite URL {url!r}: expected sqlite:///relative or sqlite:////abs")
    path = parts.path[1:]
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    sync = options.pop("synchronous", "full").lower()
    timeout = options.pop("busy_timeout", "10000")
    if sync not in _SYNC or not timeout.isdigit() or options:
        raise ConfigError(
            f"bad SQLite URL options in {url!r} (synchronous=full|normal|extra, busy_timeout=ms)"
        )
    return path, _SYNC[sync], int(timeout)


class SQLiteStore:
    """Runs in one SQLite database file; several processes may share it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path, self._sync, self._timeout = parse_sqlite_url(url)
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    def _error(self, exc: BaseException) -> StoreError:
        return StoreError(f"SQLite store {self.path!r}: {exc}")

    async def _open(self) -> aiosqlite.Connection:
        if self._conn is not None:
            return self._conn
        try:
            if self.path != ":memory:":
                _prepare_file(Path(self.path))
            conn = await aiosqlite.connect(self.path, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise self._error(exc) from exc
        try:
            await conn.execute(f"PRAGMA busy_timeout = {self._timeout}")
            await conn.execute("PRAGMA journal_mode = WAL")
            await conn.execute(f"PRAGMA synchronous = {self._sync}")
            await conn.execute("PRAGMA secure_delete = ON")
            await migrate_schema(conn)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        return conn

    @contextlib.asynccontextmanager
    async def _transaction(self, begin: str = "BEGIN") -> AsyncIterator[aiosqlite.Connection]:
        async with self._lock:
            try:
                conn = await self._open()
                await conn.execute(begin)
                try:
                    yield conn
                except BaseException:
                    await conn.execute("ROLLBACK")
                    raise
                await conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    async def _shielded(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` to its end even if the caller is cancelled (no half transactions)."""
        return await asyncio.shield(asyncio.ensure_future(work()))

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its head, or at ``revision``."""
        return await self._shielded(lambda: self._load(run_id, revision))

    async def _load(self, run_id: str, revision: int | None) -> Run:
        what = f"run {run_id!r} in {self.url}"
        async with self._transaction() as conn:
            row = await _one(conn, "SELECT id, revision, head FROM runs WHERE run_id = ?", run_id)
            if row is None:
                raise RunNotFound(run_id)
            rid, head_rev, head_doc = row
            wanted = check_revision(run_id, revision, head_rev)
            if wanted == head_rev:
                head = load_json(head_doc, what)
            else:
                rows = await conn.execute_fetchall(
                    "SELECT revision, entry FROM commits WHERE rid = ? AND revision BETWEEN ? AND ?"
                    " ORDER BY revision",
                    (rid, snapshot_of(wanted), wanted),
                )
                head = replay([(r, load_json(e, what)) for r, e in rows], what=what)
            m_end, t_end = log_ends(head)
            messages = await _docs(conn, "messages", rid, m_end, what)
            turns = await _docs(conn, "turns", rid, t_end, what)
            blob_rows = await conn.execute_fetchall(
                "SELECT key, data FROM blobs WHERE rid = ?", (rid,)
            )
        return decode_run(head, messages, turns, dict(blob_rows), what=what)  # type: ignore[arg-type]

    async def history(self, run_id: str) -> AsyncIterator[tuple[Run, list[Event]]]:
        """Every revision with the events of its commit, oldest first (for copying runs)."""
        what = f"history of {run_id!r} in {self.url}"

        async def work() -> tuple[list[Any], list[Any], list[Any], dict[str, Any]]:
            async with self._transaction() as conn:
                row = await _one(conn, "SELECT id, head FROM runs WHERE run_id = ?", run_id)
                if row is None:
                    raise RunNotFound(run_id)
                m_end, t_end = log_ends(load_json(row[1], what))
                rows = await conn.execute_fetchall(
                    "SELECT revision, entry FROM commits WHERE rid = ? ORDER BY revision", (row[0],)
                )
                messages = await _docs(conn, "messages", row[0], m_end, what)
                turns = await _docs(conn, "turns", row[0], t_end, what)
                blobs = await conn.execute_fetchall(
                    "SELECT key, data FROM blobs WHERE rid = ?", (row[0],)
                )
            entries = [(r, load_json(e, what)) for r, e in rows]
            return entries, messages, turns, dict(blobs)  # type: ignore[arg-type]

        entries, messages, turns, blobs = await self._shielded(work)
        for item in iter_history(entries, messages, turns, blobs, run_id, what=what):
            yield item

    async def commit(self, checkpoint: Checkpoint) -> None:
        """Land the checkpoint in one ``BEGIN IMMEDIATE`` transaction (compare-and-set)."""
        await self._shielded(lambda: self._commit(checkpoint))

    async def _commit(self, cp: Checkpoint) -> None:
        run = cp.run
        async with self._transaction("BEGIN IMMEDIATE") as conn:
            row = await _one(
                conn, "SELECT id, revision, head FROM runs WHERE run_id = ?", run.run_id
            )
            check_head(cp, None if row is None else row[1])
            prior = None if row is None else load_json(row[2], f"head of {run.run_id!r}")
            enc = encode_commit(cp, prior)
            summary = head_summary(enc.head)
            columns = (
                run.revision,
                run.state,
                run.model,
                summary.turns,
                enc_time(run.created_at),
                enc_time(run.updated_at),
                micros(run.updated_at),
                dump_bytes(enc.head),
            )
            if row is None:
                cursor = await conn.execute(
                    "INSERT INTO runs (revision, state, model, turns, created_at, updated_at,"
                    " updated_us, head, run_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*columns, run.run_id),
                )
                rid = int(cursor.lastrowid or 0)
            else:
                rid = row[0]
                await conn.execute(
                    "UPDATE runs SET revision = ?, state = ?, model = ?, turns = ?, created_at = ?,"
                    " updated_at = ?, updated_us = ?, head = ? WHERE id = ?",
                    (*columns, rid),
                )
            await conn.execute(
                "INSERT INTO commits (rid, revision, entry) VALUES (?, ?, ?)",
                (rid, run.revision, dump_bytes(enc.entry)),
            )
            await _append(conn, "messages", rid, enc.first_message, enc.messages)
            await _append(conn, "turns", rid, enc.first_turn, enc.turns)
            if enc.blobs:
                await conn.executemany(
                    "INSERT OR IGNORE INTO blobs (rid, key, data) VALUES (?, ?, ?)",
                    [(rid, k, v) for k, v in enc.blobs.items()],
                )

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Persisted events of the revisions after ``after_revision``."""
        return await self._shielded(lambda: self._events(run_id, after_revision, limit))

    async def _events(self, run_id: str, after: int, limit: int | None) -> list[Event]:
        what = f"events of {run_id!r} in {self.url}"
        found: list[Event] = []
        async with self._transaction() as conn:
            row = await _one(conn, "SELECT id FROM runs WHERE run_id = ?", run_id)
            if row is None:
                raise RunNotFound(run_id)
            cursor = await conn.execute(
                "SELECT revision, entry FROM commits WHERE rid = ? AND revision > ?"
                " ORDER BY revision",
                (row[0], after),
            )
            while limit is None or len(found) < limit:
                batch = await cursor.fetchmany(256)
                if not batch:
                    break
                found += decode_events(((r, load_json(e, what)) for r, e in batch), run_id)
            await cursor.close()
        return found if limit is None else found[:limit]

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> RunPage:
        """Runs, newest update first."""
        where, params = _filters(state, updated_after, cursor)
        sql = f"SELECT head FROM runs{where} ORDER BY updated_us DESC, run_id DESC LIMIT ?"

        async def work() -> list[Any]:
            async with self._transaction() as conn:
                return list(await conn.execute_fetchall(sql, (*params, max(limit, 0) + 1)))

        rows = await self._shielded(work)
        summaries = [head_summary(load_json(h, f"run head in {self.url}")) for (h,) in rows]
        page = tuple(summaries[:limit])
        more = len(summaries) > limit and bool(page)
        return RunPage(page, encode_cursor(page[-1]) if more else None)

    async def delete(self, run_id: str) -> bool:
        """Remove the run with every revision, part, blob and event."""

        async def work() -> bool:
            async with self._transaction("BEGIN IMMEDIATE") as conn:
                row = await _one(conn, "SELECT id FROM runs WHERE run_id = ?", run_id)
                if row is None:
                    return False
                for table in ("commits", "messages", "turns", "blobs"):
                    await conn.execute(f"DELETE FROM {table} WHERE rid = ?", (row[0],))
                await conn.execute("DELETE FROM runs WHERE id = ?", (row[0],))
                return True

        return await self._shielded(work)

    async def aclose(self) -> None:
        """Close the connection."""
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(sqlite3.Error, ValueError):
                    await conn.close()


def _prepare_file(path: Path) -> None:
    """Create the parent folder (0700) and the database file (0600) if missing."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


async def _one(conn: aiosqlite.Connection, sql: str, *params: Any) -> Any:
    cursor = await conn.execute(sql, params)
    row = await cursor.fetchone()
    await cursor.close()
    return row


async def _docs(conn: aiosqlite.Connection, table: str, rid: int, end: int, what: str) -> list[Any]:
    if end == 0:
        return []
    rows = await conn.execute_fetchall(
        f"SELECT doc FROM {table} WHERE rid = ? AND pos < ? ORDER BY pos", (rid, end)
    )
    docs = [d for (d,) in rows]
    if len(docs) != end:
        raise CorruptCheckpoint(f"invalid {what}: {len(docs)} of {end} {table} stored")
    parsed = load_json(b"[" + b",".join(docs) + b"]", f"{table} of {what}")
    return parsed  # type: ignore[no-any-return]


async def _append(
    conn: aiosqlite.Connection, table: str, rid: int, first: int, docs: Iterable[bytes]
) -> None:
    rows = [(rid, first + i, d) for i, d in enumerate(docs)]
    if rows:
        await conn.executemany(f"INSERT INTO {table} (rid, pos, doc) VALUES (?, ?, ?)", rows)


def _filters(
    state: StateId | None, updated_after: datetime | None, cursor: str | None
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
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
