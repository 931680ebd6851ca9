"""Small pieces shared by the persistent stores."""

from __future__ import annotations

from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import attrs

from statekernel._records.arguments import optional_text, run_id_arg
from statekernel._records.run import STATE_IDS
from statekernel._storage.protocol import Checkpoint
from statekernel.errors import ConflictError, InvalidArgument, RunNotFound

__all__ = [
    "MAX_REVISION",
    "HeadCache",
    "Prior",
    "check_head",
    "check_revision",
    "checked_events",
    "checked_listing",
    "checked_revision",
    "checked_run_id",
    "created_run",
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


def created_run(checkpoint: Checkpoint) -> None:
    """Refuse a ``create_leased`` of anything but a new run's first commit (revision 0)
    with ``InvalidArgument``, before any storage is touched."""
    if checkpoint.run.revision != 0:
        raise InvalidArgument(
            f"create_leased creates a run: its checkpoint is at revision 0, not at"
            f" {checkpoint.run.revision} (run {checkpoint.run.run_id!r})"
        )


def checked_run_id(run_id: object) -> str:
    """A run id as every store takes it (a non-empty ``str`` UTF-8 can hold), else
    ``InvalidArgument``: the same refusal on every store, before any storage is touched."""
    return run_id_arg(run_id)


def checked_events(run_id: object, after_revision: object, limit: object) -> tuple[int, int | None]:
    """(``after_revision``, ``limit``) of an ``events`` call as a store uses them; a run
    id ``checked_run_id`` refuses, an ``after_revision`` that is not an int, or a limit
    that is not None or an int >= 0 is ``InvalidArgument``. An ``after_revision`` past
    what a store can count asks for nothing (one below -1 for everything)."""
    checked_run_id(run_id)
    if type(after_revision) is not int:
        raise InvalidArgument(f"after_revision must be an int, got {after_revision!r}")
    after = min(max(after_revision, -1), MAX_REVISION - 1)
    return after, None if limit is None else _limit(limit)


def checked_listing(state: object, updated_after: object, limit: object, cursor: object) -> int:
    """The ``limit`` of a ``list_runs`` call (at most what a store can count); a state
    that is not a state id, an ``updated_after`` that is not a datetime, a limit that is
    not an int >= 0 or a cursor that is not a str is ``InvalidArgument``."""
    if state is not None and state not in STATE_IDS:
        raise InvalidArgument(f"state must be None or one of {', '.join(STATE_IDS)}, got {state!r}")
    if updated_after is not None and not isinstance(updated_after, datetime):
        raise InvalidArgument(f"updated_after must be None or a datetime, got {updated_after!r}")
    optional_text("cursor", cursor)
    return _limit(limit)


def _limit(limit: object) -> int:
    """A limit: an int >= 0 (one beyond what a store can count is no limit below it)."""
    if type(limit) is not int or limit < 0:
        raise InvalidArgument(f"limit must be an int of at least 0, got {limit!r}")
    return min(limit, MAX_REVISION - 1)


def checked_revision(run_id: object, revision: object) -> int | None:
    """``revision`` as passed to ``load``: None or an int, else ``InvalidArgument``
    (and so is a run id that ``checked_run_id`` refuses)."""
    checked_run_id(run_id)
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
