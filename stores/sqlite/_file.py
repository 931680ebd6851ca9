"""How a SQLite store's file is opened: for writing, or read-only when it cannot be written.

A write waits for the database's write lock up to the store's ``busy_timeout``; when
it has waited ``FIRST_WAIT_MS`` it says so once on the ``statekernel.stores`` logger
(another process is writing), then waits the rest.

A store in a folder (or a file) this process may not write is still readable: listing,
showing and checking its runs work, and a commit fails with a ``StoreError`` saying
the store is read-only. SQLite reads a WAL database through its ``-shm`` file; in a
folder where that file cannot be created, the database is opened ``immutable``: no
process is writing it then (a writer needs that file too), and should one start (one
with more rights than this process), the store sees the file change and opens it
again before its next read (a read torn by a write in between fails its checksum).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from statekernel._secrets import logger
from statekernel.errors import StoreError
from statekernel.stores._private import private_folder

__all__ = [
    "FIRST_WAIT_MS",
    "StoreConnection",
    "begin_immediate",
    "begin_read",
    "connect",
    "file_state",
    "needs_read_only",
    "opens_immutable",
    "prepare_file",
    "sync_at",
    "wait_up_to",
]

FIRST_WAIT_MS = 1000
"""How long a write waits for the lock before it says that it waits."""

log = logger("statekernel.stores")


class StoreConnection(sqlite3.Connection):
    """A connection that knows its store's path and how long a write may wait, and
    keeps the ``busy_timeout`` and ``synchronous`` it last set, so that a transaction
    sets either only when it needs another value (a run of commits sets none)."""

    path = ""
    patience_ms = 0
    waiting_ms = -1
    """The connection's ``busy_timeout`` now (-1: not set yet; ``sqlite3.connect``
    makes it 5 s, whatever the store asked for)."""
    wal = False
    """True once the database is in WAL mode: only ``BEGIN`` then waits for a lock (a
    write transaction already holds the write lock; its ``COMMIT`` takes no other)."""
    durable = ""
    """The store's ``synchronous`` for commits (``FULL``...; empty: never set)."""
    sync = ""
    """The connection's ``synchronous`` now (empty: unknown)."""


def wait_up_to(conn: sqlite3.Connection, ms: int) -> None:
    """Let the next statements wait ``ms`` for a lock (a ``PRAGMA`` only if it changes)."""
    if not isinstance(conn, StoreConnection):
        return
    if conn.waiting_ms != ms:
        conn.execute(f"PRAGMA busy_timeout = {ms}")
        conn.waiting_ms = ms


def sync_at(conn: sqlite3.Connection, level: str) -> None:
    """The ``synchronous`` level of the next commits (a ``PRAGMA`` only if it changes)."""
    if isinstance(conn, StoreConnection) and conn.sync != level:
        conn.execute(f"PRAGMA synchronous = {level}")
        conn.sync = level


def begin_read(conn: sqlite3.Connection) -> None:
    """``BEGIN`` of a read transaction, waiting the full ``busy_timeout`` for a lock."""
    if isinstance(conn, StoreConnection):
        wait_up_to(conn, conn.patience_ms)
    conn.execute("BEGIN")


def begin_immediate(conn: sqlite3.Connection, *, durable: bool = True) -> None:
    """``BEGIN IMMEDIATE``; a wait for another writer's lock longer than
    ``FIRST_WAIT_MS`` is logged once, naming the store, and goes on to the full
    ``busy_timeout`` (every other statement waits the full timeout at once).

    ``durable`` False: the transaction is committed at ``synchronous = NORMAL`` (no
    fsync: leases), else at the store's own level.
    """
    if not isinstance(conn, StoreConnection):
        conn.execute("BEGIN IMMEDIATE")
        return
    if conn.durable:
        sync_at(conn, conn.durable if durable else "NORMAL")
    if conn.patience_ms <= FIRST_WAIT_MS:
        wait_up_to(conn, conn.patience_ms)
        conn.execute("BEGIN IMMEDIATE")
        return
    wait_up_to(conn, FIRST_WAIT_MS)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
            raise
        rest = conn.patience_ms - FIRST_WAIT_MS
        log.warning(
            "SQLite store %r: waiting for its write lock, held by another connection"
            " (up to %.1f s more)",
            conn.path,
            rest / 1000,
            extra={"store": conn.path},
        )
        wait_up_to(conn, rest)
        conn.execute("BEGIN IMMEDIATE")
    if not conn.wal:  # a rollback journal's COMMIT waits for readers: the full timeout
        wait_up_to(conn, conn.patience_ms)


def prepare_file(path: Path) -> None:
    """Create the parent folder (0700) and the database file (0600) if missing."""
    if not path.parent.exists():
        private_folder(path.parent)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def needs_read_only(path: str) -> bool:
    """True when the database file exists but cannot be written: the file itself is not
    writable, or its folder is not and SQLite could not create its ``-wal`` and
    ``-shm`` files there (missing or not writable)."""
    file = Path(path)
    if path == ":memory:" or not file.is_file():
        return False
    if not os.access(file, os.W_OK):
        return True
    folder = file.parent if str(file.parent) else Path(".")
    if os.access(folder, os.W_OK):
        return False
    sides = [Path(f"{file}-wal"), Path(f"{file}-shm")]
    return not all(p.exists() and os.access(p, os.W_OK) for p in sides)


def opens_immutable(path: str) -> bool:
    """True when a read-only store must be opened ``immutable``: SQLite reads a WAL
    database through its ``-shm`` file, which cannot be created in its folder."""
    file = Path(path).resolve()
    return not Path(f"{file}-shm").exists() and not os.access(file.parent, os.W_OK)


def file_state(path: str) -> tuple[object, ...]:
    """What changes when another process writes the database: the file's size and
    modification time, and whether its ``-wal`` and ``-shm`` files exist."""
    stat = Path(path).stat()
    sides = (Path(f"{path}-wal").exists(), Path(f"{path}-shm").exists())
    return (stat.st_mtime_ns, stat.st_size, *sides)


def connect(path: str, *, read_only: bool, timeout_ms: int) -> sqlite3.Connection:
    """A connection to the store's file, waiting up to ``timeout_ms`` for a lock; a
    read-only one may be used from any thread, and is ``immutable`` when
    ``opens_immutable`` (its owner reopens it when ``file_state`` changes)."""
    if not read_only:
        conn = sqlite3.connect(path, isolation_level=None, factory=StoreConnection)
        conn.path, conn.patience_ms = path, timeout_ms
        wait_up_to(conn, timeout_ms)
        return conn
    file = Path(path).resolve()
    uri = file.as_uri() + "?mode=ro"
    if opens_immutable(path):
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
