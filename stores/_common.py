"""Small pieces shared by the persistent stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from statekernel._storage import Checkpoint
from statekernel.errors import ConflictError, RunNotFound

__all__ = ["check_head", "check_revision", "micros"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def check_revision(run_id: str, revision: int | None, head: int) -> int:
    """The revision to load (the head when None); a revision not stored is ``RunNotFound``."""
    if revision is None:
        return head
    if not 0 <= revision <= head:
        raise RunNotFound(run_id, f"no revision {revision} (head is {head})")
    return revision
