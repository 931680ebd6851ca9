"""How a SQLite store's file is opened: for writing, or read-only when it cannot be written.

A store in a folder (or a file) this process may not write is still readable: listing,
showing and checking its runs work, and a commit fails with a ``StoreError`` saying
the store is read-only. SQLite reads a WAL database through its ``-shm`` file; in a
folder where that file cannot be created, the database is opened ``immutable`` (no
process can be writing it then: a writer needs that file too).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from statekernel.errors import StoreError
from statekernel.stores._sqlite_schema import STORE_VERSION

__all__ = ["check_layout", "connect", "needs_read_only", "prepare_file"]


def prepare_file(path: Path) -> None:
    """Create the parent folder (0700) and the database file (0600) if missing."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def needs_read_only(path: str) -> bool:
    """True when the database file exists but it, or its folder, cannot be written."""
    file = Path(path)
    if path == ":memory:" or not file.is_file():
        return False
    folder = file.parent if str(file.parent) else Path(".")
    return not (os.access(file, os.W_OK) and os.access(folder, os.W_OK))


def connect(path: str, *, read_only: bool, timeout_ms: int) -> sqlite3.Connection:
    """A connection to the store's file; a read-only one may be used from any thread."""
    if not read_only:
        return sqlite3.connect(path, isolation_level=None)
    file = Path(path).resolve()
    uri = file.as_uri() + "?mode=ro"
    if not Path(f"{file}-shm").exists() and not os.access(file.parent, os.W_OK):
        wal = Path(f"{file}-wal")
        if wal.exists() and wal.stat().st_size:
            raise StoreError(
                f"SQLite store {path!r} is read-only and its write-ahead log {str(wal)!r}"
                " holds commits not yet in the database: open it once with write access"
            )
        uri += "&immutable=1"
    return sqlite3.connect(
        uri, uri=True, timeout=timeout_ms / 1000, isolation_level=None, check_same_thread=False
    )


def check_layout(conn: sqlite3.Connection, path: str) -> None:
    """Refuse, without writing, a read-only file that is not this release's store layout."""
    try:
        row = conn.execute("SELECT version FROM statekernel_schema").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        row = None
    if row is None:
        raise StoreError(f"{path!r} is not a statekernel SQLite store (no store layout)")
    if row[0] != STORE_VERSION:
        raise StoreError(
            f"SQLite store {path!r} has layout version {row[0]!r}, this release reads"
            f" {STORE_VERSION}; it is read-only here, so it cannot be upgraded"
        )
