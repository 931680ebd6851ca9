"""The PostgreSQL store (``postgresql://``): ``PostgresStore``, on asyncpg
(``pip install 'statekernel[postgres]'``)."""

from __future__ import annotations

from statekernel.stores.postgres._store import PostgresStore

__all__ = ["PostgresStore"]
