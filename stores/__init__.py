"""Checkpoint stores behind one async protocol, chosen by URL.

``memory://``, ``file:///dir``, ``sqlite:///path.db`` and ``redis://host:port/db``
(also ``rediss://``) all implement :class:`CheckpointStore`. What a store may offer
beyond it is declared by two small protocols, checked by ``check_store`` when a store
declares them: :class:`RevisionHistory` and :class:`SettlesOnCancel`.
"""

from __future__ import annotations

from statekernel._storage import (
    Checkpoint,
    CheckpointStore,
    DamagedRun,
    Lease,
    RevisionHistory,
    RunPage,
    RunSummary,
    SettlesOnCancel,
    StoreWrapper,
)
from statekernel.stores._file import FileStore
from statekernel.stores._memory import MemoryStore
from statekernel.stores._migrate import Migration, migrate
from statekernel.stores._open import open_store, redact_url
from statekernel.stores._redis import RedisStore
from statekernel.stores._sqlite import SQLiteStore

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "DamagedRun",
    "FileStore",
    "Lease",
    "MemoryStore",
    "Migration",
    "RedisStore",
    "RevisionHistory",
    "RunPage",
    "RunSummary",
    "SQLiteStore",
    "SettlesOnCancel",
    "StoreWrapper",
    "migrate",
    "open_store",
    "redact_url",
]
