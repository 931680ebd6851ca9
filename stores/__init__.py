"""Checkpoint stores behind one async protocol, chosen by URL.

``memory://``, ``file:///dir``, ``sqlite:///path.db``, ``redis://host:port/db``
(also ``rediss://``) and ``postgresql://user@host/db`` (``postgres://``; the
``postgres`` extra) all implement :class:`CheckpointStore`, where what each method
returns and raises is written once for every store (a SQLite or PostgreSQL store opened
read-only also raises ``StoreError`` for a write). What a store may offer
beyond it is declared by small protocols: :class:`RevisionHistory` and
:class:`SettlesOnCancel` (checked by ``check_store`` when a store declares them),
:class:`KeepsFences` (a run's largest fencing token, which ``migrate`` carries) and
:class:`BoundsEffects` (how soon before an effect its owner must have renewed),
:class:`ShowsHolders` (who holds a run, read without writing),
:class:`ReleasesWithCommit` (a commit that gives its lease back in the same step) and
:class:`CreatesLeased` (the commit that creates a run takes its lease with it) and
:class:`CancelsRuns` (a cancel request kept beside the lease, which refuses every
commit but the one that carries it out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statekernel import _exports
from statekernel._secrets import redact_url
from statekernel._storage.following import Following, follow, live_feed
from statekernel._storage.holders import ShowsHolders
from statekernel._storage.live import LiveFeed
from statekernel._storage.protocol import (
    BoundsEffects,
    CancelsRuns,
    Checkpoint,
    CheckpointStore,
    CreatesLeased,
    DamagedRun,
    KeepsFences,
    Lease,
    ReleasesWithCommit,
    RevisionHistory,
    RunPage,
    RunQueues,
    RunSummary,
    SettlesOnCancel,
    StoreWrapper,
)
from statekernel._storage.queues import (
    DeadLetter,
    ListsQueues,
    QueueDepth,
    QueuedRun,
    QueueEntry,
    RunQueue,
)
from statekernel._storage.watching import CommitNotice, Watches, watch
from statekernel.stores._open import open_store

if TYPE_CHECKING:
    from statekernel.stores._migrate import Migration, migrate
    from statekernel.stores.file._store import FileStore
    from statekernel.stores.memory._store import MemoryStore, StoredRun
    from statekernel.stores.postgres import PostgresStore
    from statekernel.stores.redis._store import RedisStore
    from statekernel.stores.sqlite._store import SQLiteStore

__getattr__, __dir__ = _exports.lazy_exports(
    __name__,
    {
        "FileStore": ".file._store",
        "MemoryStore": ".memory._store",
        "Migration": "._migrate",
        "PostgresStore": ".postgres",
        "RedisStore": ".redis._store",
        "SQLiteStore": ".sqlite._store",
        "StoredRun": ".memory._store",
        "migrate": "._migrate",
    },
)
__all__ = [
    "BoundsEffects",
    "CancelsRuns",
    "Checkpoint",
    "CheckpointStore",
    "CommitNotice",
    "CreatesLeased",
    "DamagedRun",
    "DeadLetter",
    "FileStore",
    "Following",
    "KeepsFences",
    "Lease",
    "ListsQueues",
    "LiveFeed",
    "MemoryStore",
    "Migration",
    "PostgresStore",
    "QueueDepth",
    "QueueEntry",
    "QueuedRun",
    "RedisStore",
    "ReleasesWithCommit",
    "RevisionHistory",
    "RunPage",
    "RunQueue",
    "RunQueues",
    "RunSummary",
    "SQLiteStore",
    "SettlesOnCancel",
    "ShowsHolders",
    "StoreWrapper",
    "StoredRun",
    "Watches",
    "follow",
    "live_feed",
    "migrate",
    "open_store",
    "redact_url",
    "watch",
]
