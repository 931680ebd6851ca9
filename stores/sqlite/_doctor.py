"""The doctor's probe of a SQLite store: read-only, settings and integrity."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import (
    ConfigError,
    CorruptCheckpoint,
    StoreError,
)
from statekernel.stores._doctor_probe import (
    DAMAGED,
    OK,
    SHOWN,
    WARNING,
    Finding,
    LeaseView,
    RunRef,
    host_lease,
    permissions,
)
from statekernel.stores._host.lease_records import host_record
from statekernel.stores.sqlite._file import connect
from statekernel.stores.sqlite._schema import READABLE, STORE_VERSION
from statekernel.stores.sqlite._store import SQLiteStore, parse_sqlite_url

__all__ = ["SQLiteProbe"]

# -- SQLite ------------------------------------------------------------------------


class ReadOnlySQLiteStore(SQLiteStore):
    """A ``SQLiteStore`` opened read-only, on which a damaged database file
    (``sqlite3.DatabaseError`` other than an operational error such as a lock) is
    reported as ``CorruptCheckpoint``."""

    def __init__(self, url: str) -> None:
        super().__init__(url, read_only=True)

    def _typed(self, exc: Exception) -> Exception:
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
            return CorruptCheckpoint(f"damaged SQLite store {self.path!r}: {exc}")
        return super()._typed(exc)


_DURABLE_JOURNALS = ("wal", "delete", "truncate", "persist")


class SQLiteProbe:
    """``sqlite:///path.db``, opened read-only."""

    local_errors = False

    def __init__(self, url: str) -> None:
        path, self._sync, timeout = parse_sqlite_url(url)
        if path == ":memory:":
            raise ConfigError("sqlite:///:memory: lives only in the process that opens it")
        self.path = Path(path)
        if not self.path.is_file():
            what = "is not a file" if self.path.exists() else "does not exist"
            raise StoreError(f"no SQLite store at {path!r}: the file {what}")
        self.subject = path
        self._timeout = timeout
        self._conn: sqlite3.Connection | None = None
        self._readable = False
        self.store: CheckpointStore | None = ReadOnlySQLiteStore(url)

    def _files(self) -> Iterator[Path]:
        yield self.path
        for suffix in ("-wal", "-shm", "-journal"):
            yield Path(f"{self.path}{suffix}")
        owners = Path(f"{self.path}-owners")
        yield owners
        with contextlib.suppress(OSError):
            yield from owners.iterdir()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        if self._conn is None:
            self._conn = connect(str(self.path), read_only=True, timeout_ms=self._timeout)
        return self._conn.execute(sql, params).fetchall()

    async def settings(self) -> list[Finding]:
        """Permissions (before the file is opened), layout, integrity, journal mode
        and synchronous level."""
        found = [permissions(self._files(), "permissions", self.subject)]
        found += await asyncio.to_thread(self._settings)
        return found

    def _settings(self) -> list[Finding]:
        try:
            layout = self._layout()
        except sqlite3.OperationalError as exc:
            raise StoreError(f"SQLite store {self.subject!r}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            return [Finding("store layout", self.subject, DAMAGED, f"not readable: {exc}")]
        found = [layout]
        rows = self._query("PRAGMA quick_check")
        lines = [str(r[0]) for r in rows]
        if lines == ["ok"]:
            found.append(Finding("integrity", self.subject, OK, "PRAGMA quick_check: ok"))
        else:
            shown = "; ".join(lines[:SHOWN])
            found.append(Finding("integrity", self.subject, DAMAGED, f"quick_check: {shown}"))
        found.append(self._journal(self._journal_mode()))
        found.append(self._synchronous())
        return found

    def _layout(self) -> Finding:
        tables = {str(r[0]) for r in self._query("SELECT name FROM sqlite_master")}
        if "statekernel_schema" not in tables:
            if not tables:
                self._readable = False
                detail = "an empty database: no runs (the store creates its tables on first use)"
                return Finding("store layout", self.subject, WARNING, detail)
            return Finding(
                "store layout", self.subject, DAMAGED, "not a statekernel store: no schema table"
            )
        row = self._query("SELECT version FROM statekernel_schema")
        version = row[0][0] if row else None
        if version == STORE_VERSION:
            self._readable = True
            return Finding("store layout", self.subject, OK, f"layout version {version}")
        if version in READABLE and type(version) is int:
            self._readable = True
            detail = (
                f"layout version {version}: read as it is; the first writer of this release"
                f" upgrades it to {STORE_VERSION}, which older releases then refuse"
            )
            return Finding("store layout", self.subject, WARNING, detail)
        if isinstance(version, int) and version > STORE_VERSION:
            raise StoreError(
                f"SQLite store {self.subject!r} has layout version {version}, newer than this"
                f" release ({STORE_VERSION}): upgrade statekernel to check it"
            )
        detail = f"layout version {version!r}: this release reads {READABLE[0]} to {STORE_VERSION}"
        return Finding("store layout", self.subject, DAMAGED, detail)

    def _journal_mode(self) -> str:
        """The file's journal mode; a file opened ``immutable`` (read-only folder) reports
        ``delete`` whatever it is, so its header says whether it is in WAL mode."""
        mode = str(self._query("PRAGMA journal_mode")[0][0]).lower()
        with self.path.open("rb") as file:
            header = file.read(20)
        return "wal" if mode == "delete" and header[18:20] == b"\x02\x02" else mode

    def _journal(self, mode: str) -> Finding:
        if mode == "wal":
            return Finding("journal_mode", self.subject, OK, "wal")
        if mode in _DURABLE_JOURNALS:
            detail = (
                f"{mode}, not the store's wal: durable, but readers wait for writers;"
                " the store sets wal when it next opens the file"
            )
            return Finding("journal_mode", self.subject, WARNING, detail)
        detail = (
            f"{mode}: not durable: a crash in the middle of a commit can leave the database"
            " damaged (the store sets wal when it next opens the file)"
        )
        return Finding("journal_mode", self.subject, WARNING, detail)

    def _synchronous(self) -> Finding:
        where = "set from the store URL on every connection; the file keeps no setting"
        if self._sync in ("FULL", "EXTRA"):
            detail = f"{self._sync} ({where}): each commit is on disk before it returns"
            return Finding("synchronous", self.subject, OK, detail)
        detail = (
            f"{self._sync} ({where}): not durable against a power loss or OS crash: the"
            " last commits that returned can be lost, so 'committed before the side effect'"
            " holds against process crashes only; use synchronous=full"
        )
        return Finding("synchronous", self.subject, WARNING, detail)

    async def runs(self) -> list[RunRef]:
        """The ``run_id`` column of the ``runs`` table."""
        if not self._readable:
            return []
        rows = await asyncio.to_thread(self._query, "SELECT run_id FROM runs ORDER BY run_id")
        return [RunRef(str(r[0]), str(r[0])) for r in rows]

    async def lease(self, run_id: str) -> LeaseView | None:
        """The run's row of the ``leases`` table."""
        return await asyncio.to_thread(self._lease, run_id)

    def _lease(self, run_id: str) -> LeaseView | None:
        rows = self._query("SELECT token, owner, expires FROM leases WHERE run_id = ?", (run_id,))
        if not rows:
            return None
        record = host_record(rows[0], run_id, f"SQLite store {self.subject!r}")
        owners = Path(f"{self.path}-owners")
        return host_lease((record.token, record.owner, record.expires), owners)

    async def cross_checks(self) -> list[Finding]:
        """None."""
        return []

    async def aclose(self) -> None:
        """Close both connections."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.store is not None:
            await self.store.aclose()
