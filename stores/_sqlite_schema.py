"""The SQLite store's tables, its own schema version and the migrations between versions."""

from __future__ import annotations

import aiosqlite

from statekernel.errors import StoreError

__all__ = ["SCHEMA", "STORE_VERSION", "migrate_schema"]

STORE_VERSION = 1
"""The layout version of the SQLite store written by this release."""

SCHEMA = """
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
    head BLOB NOT NULL
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

_MIGRATIONS: dict[int, str] = {}
"""SQL that upgrades the store from a version to the next one."""


async def migrate_schema(conn: aiosqlite.Connection) -> None:
    """Create the tables in a new database, or upgrade an older layout, in one transaction."""
    await conn.execute("BEGIN IMMEDIATE")
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS statekernel_schema (version INTEGER NOT NULL)"
        )
        cursor = await conn.execute("SELECT version FROM statekernel_schema")
        row = await cursor.fetchone()
        await cursor.close()
        version = 0 if row is None else int(row[0])
        if version > STORE_VERSION:
            raise StoreError(
                f"SQLite store layout version {version} is newer than this release"
                f" ({STORE_VERSION}); upgrade statekernel"
            )
        if version == 0:
            for statement in _statements(SCHEMA):
                await conn.execute(statement)
            await conn.execute("INSERT INTO statekernel_schema (version) VALUES (?)", (1,))
            version = 1
        while version < STORE_VERSION:
            for statement in _statements(_MIGRATIONS[version]):
                await conn.execute(statement)
            version += 1
            await conn.execute("UPDATE statekernel_schema SET version = ?", (version,))
        await conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            await conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
