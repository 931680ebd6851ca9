"""The SQLite store: ``_store`` (the store), ``_schema`` (tables and migrations),
``_ops`` (the SQL of reads and commits), ``_writer`` (group commit), ``_thread`` (the
connection's own thread), ``_file`` (opening the database file) and ``_doctor`` (its
checks); the rows and column checks it shares with the PostgreSQL store are in
``statekernel.stores._sql``. ``SQLiteStore`` is imported when first used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from statekernel import _exports

if TYPE_CHECKING:
    from statekernel.stores.sqlite._store import SQLiteStore

__getattr__, __dir__ = _exports.lazy_exports(__name__, {"SQLiteStore": "._store"})
__all__ = ["SQLiteStore"]
