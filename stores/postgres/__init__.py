"""The PostgreSQL store (``postgresql://``): ``PostgresStore``, on asyncpg
(``pip install 'statekernel[postgres]'``)."""

from __future__ import annotations

from statekernel.stores.postgres import _live  # noqa: F401  (carries the runs' live events)
from statekernel.stores.postgres._store import PostgresStore

__all__ = ["PostgresStore"]
