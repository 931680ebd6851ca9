"""SQLite and PostgreSQL stores turned back into the layouts older releases wrote, for the tests of
reading them as they are and upgrading them."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from statekernel.stores._sql.bundles import unbundle

__all__ = ["as_sqlite_layout", "unbundle_postgres"]


def _unbundled(conn: sqlite3.Connection) -> None:
    """Each record of the ``parts`` rows in a row of its own (``messages``, ``turns``,
    ``blobs``), as layouts before 7 wrote them, and no ``parts`` table."""
    rows = conn.execute("SELECT rid, first_message, first_turn, doc FROM parts").fetchall()
    for rid, first_message, first_turn, doc in rows:
        messages, turns, blobs = unbundle(doc, "parts")
        for table, first, docs in (
            ("messages", first_message, messages),
            ("turns", first_turn, turns),
        ):
            conn.executemany(
                f"INSERT INTO {table} (rid, pos, doc) VALUES (?, ?, ?)",
                [(rid, first + i, d) for i, d in enumerate(docs)],
            )
        conn.executemany(
            "INSERT OR IGNORE INTO blobs (rid, key, data) VALUES (?, ?, ?)",
            [(rid, k, v) for k, v in blobs],
        )
    conn.execute("DROP TABLE parts")


def as_sqlite_layout(path: Path, version: int) -> None:
    """Turn the SQLite store at ``path`` back into layout ``version`` (4, 5 or 6), as
    the release that wrote it left it: 6 had no ``parts``, 5 no ``cancels``, 4 no
    ``runs.fence``."""
    with sqlite3.connect(path) as conn:
        _unbundled(conn)
        if version < 6:
            conn.execute("DROP TABLE cancels")
        if version < 5:
            conn.execute("ALTER TABLE runs DROP COLUMN fence")
        conn.execute("UPDATE statekernel_schema SET version = ?", (version,))
    conn.close()


async def unbundle_postgres(conn: Any, schema: str) -> None:
    """Each record of a PostgreSQL store's ``parts`` rows in a row of its own, as
    layouts before 8 wrote them, and no ``parts`` table (``conn``: an asyncpg
    connection)."""
    s = f'"{schema}"'
    rows = await conn.fetch(f"SELECT rid, first_message, first_turn, doc FROM {s}.parts")
    for rid, first_message, first_turn, doc in rows:
        messages, turns, blobs = unbundle(doc, "parts")
        for table, first, docs in (
            ("messages", first_message, messages),
            ("turns", first_turn, turns),
        ):
            await conn.executemany(
                f"INSERT INTO {s}.{table} (rid, pos, doc) VALUES ($1, $2, $3)",
                [(rid, first + i, d) for i, d in enumerate(docs)],
            )
        await conn.executemany(
            f"INSERT INTO {s}.blobs (rid, key, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            [(rid, k, v) for k, v in blobs],
        )
    await conn.execute(f"DROP TABLE {s}.parts")
