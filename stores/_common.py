"""Small pieces shared by the persistent stores."""

from __future__ import annotations

from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import attrs

from statekernel._storage.protocol import Checkpoint
from statekernel.errors import ConflictError, InvalidArgument, RunNotFound

__all__ = [
    "MAX_REVISION",
    "HeadCache",
    "Prior",
    "check_head",
    "check_revision",
    "checked_revision",
    "micros",
]

K = TypeVar("K")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

MAX_REVISION = 2**63 - 1
"""The largest revision a store can hold (SQLite and Redis count in signed 64 bits)."""


def micros(value: datetime) -> int:
    """A sortable instant: microseconds since the epoch (naive times count as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // timedelta(microseconds=1)


def check_head(checkpoint: Checkpoint, actual: int | None) -> None:
    """Raise ``ConflictError`` unless the stored head (``actual``) is the one expected."""
    wanted = None if checkpoint.run.revision == 0 else checkpoint.expected_revision
    if checkpoint.run.revision < 0 or actual != wanted:
        raise ConflictError(checkpoint.run.run_id, checkpoint.expected_revision, actual)


def checked_revision(run_id: str, revision: object) -> int | None:
    """``revision`` as passed to ``load``: None or an int, else ``InvalidArgument``."""
    if revision is None or (isinstance(revision, int) and not isinstance(revision, bool)):
        return revision
    raise InvalidArgument(f"load of run {run_id!r}: revision must be an int, got {revision!r}")


def check_revision(run_id: str, revision: int | None, head: int) -> int:
    """The revision to load (the head when None); a revision not stored is ``RunNotFound``,
    one that is not an int ``InvalidArgument``."""
    revision = checked_revision(run_id, revision)
    if revision is None:
        return head
    if not 0 <= revision <= head:
        raise RunNotFound(run_id, f"no revision {revision} (head is {head})")
    return revision


@attrs.frozen
class Prior(Generic[K]):
    """A stored head as a store remembers it: ``key`` names it exactly (the store checks
    the key when it writes), ``refs`` are the blobs it references (None: not known)."""

    key: K
    head: dict[str, Any]
    refs: frozenset[str] | None = None


class HeadCache(Generic[K]):
    """The heads a store last wrote or read, per run: the prior of the next commit.

    The newest ``size`` runs are kept.
    """

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._items: OrderedDict[str, Prior[K]] = OrderedDict()

    @property
    def size(self) -> int:
        """How many runs are kept at most."""
        return self._size

    def __len__(self) -> int:
        return len(self._items)

    def get(self, run_id: str) -> Prior[K] | None:
        """The remembered head of a run, or None."""
        return self._items.get(run_id)

    def put(self, run_id: str, prior: Prior[K]) -> None:
        """Remember the head of a run (as the newest)."""
        self._items[run_id] = prior
        self._items.move_to_end(run_id)
        if len(self._items) > self._size:
            self._items.popitem(last=False)

    def drop(self, run_id: str) -> None:
        """Forget a run."""
        self._items.pop(run_id, None)

    def clear(self) -> None:
        """Forget every run."""
        self._items.clear()
