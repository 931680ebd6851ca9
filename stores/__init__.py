"""Checkpoint stores behind one async protocol, chosen by URL.

``memory://``, ``file:///dir``, ``sqlite:///path.db`` and ``redis://host:port/db``
(also ``rediss://``) all implement :class:`CheckpointStore`.
"""

from __future__ import annotations

from statekernel._storage import Checkpoint, CheckpointStore, RunPage, RunSummary
from statekernel.stores._memory import MemoryStore
from statekernel.stores._open import open_store, redact_url

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "MemoryStore",
    "RunPage",
    "RunSummary",
    "open_store",
    "redact_url",
]
