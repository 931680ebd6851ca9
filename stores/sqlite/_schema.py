"""The SQLite store's tables, its own schema version and the migrations between versions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from statekernel.errors import StoreError
from statekernel.stores.sqlite._file import begin_immediate, connect

__all__ = [
    "READABLE",
    "SCHEMA",
    "STORE_VERSION",
    "TAGS_VERSION",
    "check_layout",
    "check_store_file",
    "migrate_schema",
]

STORE_VERSION = 7
"""The layout version of the SQLite store written by this release.

Every stored value ends with its checksum (``statekernel.stores._format.checksum``).
Layout 5 keeps each run's largest fencing token with the run (``runs.fence``), so a
lease record lost or deleted by hand never restarts its tokens. Layout 6 keeps cancel
requests (``cancels``, by run row id), which every commit checks: a release that does
not know them refuses the store rather than commit past one. Layout 7 indexes runs'
tags (``run_tags``: a row per run and key, indexed by key and value). A layout 4, 5 or 6
store is upgraded when opened for writing and read as it is when opened read-only
(readers never read the fence, find no cancel request there, and no run with tags: a
release before layout 7 wrote none). Layouts before 4 were never
released; a database in one is refused, not misread.
"""

READABLE = (4, 5, 6, STORE_VERSION)
"""Layouts a store opened read-only reads as they are."""

LEASES = """
CREATE TABLE IF NOT EXISTS leases (
    run_id TEXT PRIMARY KEY, token INTEGER NOT NULL, owner TEXT, expires REAL NOT NULL
) WITHOUT ROWID
"""

CANCELS = """
CREATE TABLE IF NOT EXISTS cancels (rid INTEGER PRIMARY KEY, doc BLOB NOT NULL);
"""

TAGS = """
CREATE TABLE IF NOT EXISTS run_tags (
    rid INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (rid, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS run_tags_by_pair ON run_tags (key, value, rid);
"""

TAGS_VERSION = 7
"""The first layout with ``run_tags``."""

SCHEMA = (
    """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL,
    model TEXT NOT NULL,
    turns INTEGER NOT NULL,
    created_at NOT NULL,
    updated_at NOT NULL,
    updated_us INTEGER NOT NULL,
    head BLOB NOT NULL,
    fence INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runs_by_update ON runs (updated_us, run_id);
CREATE INDEX runs_by_state ON runs (state, updated_us, run_id);
CREATE TABLE commits (
    rid INTEGER NOT NULL, revision INTEGER NOT NULL, entry BLOB NOT NULL,
    PRIMARY KEY (rid, revision)
) WITHOUT ROWID;
CREATE TABLE messages (
    rid INTEGER NOT NULL, pos INTEGER NOT NULL, doc BLOB NOT NULL,
    PRIMARY KEY (rid, pos)
) WITHOUT ROWID;
CREATE TABLE turns (
    rid INTEGER NOT NULL, pos INTEGER NOT NULL, doc BLOB NOT NULL,
    PRIMARY KEY (rid, pos)
) WITHOUT ROWID;
CREATE TABLE blobs (
    rid INTEGER NOT NULL, key TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (rid, key)
);
"""
    + CANCELS
    + TAGS
    + LEASES
)

_MIGRATIONS: dict[int, str] = {
    4: """
ALTER TABLE runs ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET fence = COALESCE(
    (SELECT token FROM leases WHERE leases.run_id = runs.run_id AND typeof(token) = 'integer'), 0
)
""",
    5: CANCELS,
    6: TAGS,  # no run of an older layout has tags: nothing to fill in
}
"""SQL that upgrades the store from a version to the next one."""


def migrate_schema(conn: sqlite3.Connection) -> None:
    """Create the tables in a new database, or upgrade an older layout, in one transaction."""
    begin_immediate(conn)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS statekernel_schema (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM statekernel_schema").fetchone()
        version = 0 if row is None else row[0]
        if type(version) is not int:
            raise StoreError(f"damaged store layout: version {version!r} is not an int")
        if version > STORE_VERSION:
            raise StoreError(
                f"SQLite store layout version {version} is newer than this release"
                f" ({STORE_VERSION}); upgrade statekernel"
            )
        if version == 0:
            for statement in _statements(SCHEMA):
                conn.execute(statement)
            conn.execute("INSERT INTO statekernel_schema (version) VALUES (?)", (STORE_VERSION,))
            version = STORE_VERSION
        if version < STORE_VERSION and version not in _MIGRATIONS:
            raise StoreError(
                f"SQLite store layout version {version} was written by an unreleased"
                f" development version and cannot be read by this release ({STORE_VERSION})"
            )
        while version < STORE_VERSION:
            for statement in _statements(_MIGRATIONS[version]):
                conn.execute(statement)
            version += 1
            conn.execute("UPDATE statekernel_schema SET version = ?", (version,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def check_layout(conn: sqlite3.Connection, path: str) -> int:
    """Refuse, without writing, a read-only file whose layout this release cannot read
    as it is; its layout version otherwise."""
    try:
        row = conn.execute("SELECT version FROM statekernel_schema").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        row = None
    if row is None:
        raise StoreError(f"{path!r} is not a statekernel SQLite store (no store layout)")
    if type(row[0]) is int and row[0] > STORE_VERSION:
        raise StoreError(
            f"SQLite store {path!r} has layout version {row[0]}, newer than this release"
            f" ({STORE_VERSION}); upgrade statekernel"
        )
    if row[0] not in READABLE or type(row[0]) is not int:
        raise StoreError(
            f"SQLite store {path!r} has layout version {row[0]!r}, this release reads"
            f" {READABLE[0]} to {STORE_VERSION}; it is read-only here, so it cannot be upgraded"
        )
    return int(row[0])


def _reader(path: str) -> sqlite3.Connection:
    """A connection that reads ``path`` and writes nothing, beside it either: a WAL
    database closed cleanly (no ``-wal`` or ``-shm`` file) is read ``immutable``, since
    a read-only connection would leave those two files behind."""
    file = Path(path)
    with file.open("rb") as f:
        header = f.read(20)
    sides = [Path(f"{path}-wal"), Path(f"{path}-shm")]
    if header[18:20] == b"\x02\x02" and not any(p.exists() for p in sides):
        uri = file.resolve().as_uri() + "?mode=ro&immutable=1"
        return sqlite3.connect(uri, uri=True, isolation_level=None)
    return connect(path, read_only=True, timeout_ms=10_000)


def check_store_file(path: str) -> None:
    """Refuse, writing nothing, an existing file that is not a statekernel SQLite store
    (another application's database, or no database at all): ``StoreError`` naming it.

    Commands that only read a store check this first, so they never turn a foreign
    database into a store by creating the store's tables in it.
    """
    try:
        conn = _reader(path)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"{path!r} cannot be read as a SQLite database: {exc}") from exc
    try:
        row = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'statekernel_schema'"
        ).fetchone()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path!r} is not a statekernel SQLite store: {exc}") from exc
    finally:
        conn.close()
    if row is None:
        raise StoreError(f"{path!r} is not a statekernel SQLite store (it holds no store tables)")
