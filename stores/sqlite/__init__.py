"""The SQLite store: ``_store`` (the store), ``_schema`` (tables and migrations),
``_ops`` (the SQL of reads and commits), ``_writer`` (group commit), ``_thread`` (the
connection's own thread), ``_file`` (opening the database file), ``_columns`` (typed
columns) and ``_doctor`` (its checks)."""

from statekernel.stores.sqlite._store import SQLiteStore

__all__ = ["SQLiteStore"]
