"""What the stores on SQL tables (SQLite, PostgreSQL) share above their SQL: a commit
waiting for its batch, the stored head checked against the columns beside it, a past
head replayed from the commit log, and documents parsed in one go (the rows themselves:
``rows``; the column checks: ``columns``)."""

from __future__ import annotations

from typing import Any

import attrs

from statekernel._storage.protocol import Lease
from statekernel.errors import CorruptCheckpoint
from statekernel.stores._format.checksum import unseal
from statekernel.stores._format.codec import EncodedCommit, replay
from statekernel.stores._format.dicts import load_entry
from statekernel.stores._format.documents import load_json
from statekernel.stores._sql.columns import check_columns
from statekernel.stores._sql.rows import CommitRows, Stored

__all__ = [
    "Outcome",
    "Pending",
    "PendingWrite",
    "checked_head",
    "head_at",
    "log_entries",
    "parse_docs",
]

Outcome = tuple[bool, Stored | None]
"""(True, the new head) when a commit landed, else (False, the head found instead)."""


@attrs.frozen
class Pending:
    """One commit of a batch: the head it expects (row id, revision; None for a new
    run), its rows, the lease it is fenced by (if any), and whether that lease is given
    up with it (``ReleasesWithCommit``).

    ``take``: for a new run, the lease to take with it (``CreatesLeased``), in the
    store's own terms (SQLite: the change of the lease record; PostgreSQL: the owner's
    claim); what was taken is put in ``taken`` once it landed.
    """

    run_id: str
    expect: tuple[int, int] | None
    rows: CommitRows
    fence: Lease | None = None
    release: bool = False
    take: Any = None
    taken: list[Any] = attrs.field(factory=list, eq=False)


@attrs.frozen
class PendingWrite:
    """A commit waiting for its batch, with its encoding (the head it remembers)."""

    pending: Pending
    encoded: EncodedCommit


def checked_head(stored: Stored, what: str) -> dict[str, Any]:
    """The stored head document; its checksum, and the columns beside it, checked."""
    head = load_json(unseal(stored.head, f"head of {what}"), what)
    if not isinstance(head, dict):
        raise CorruptCheckpoint(f"invalid {what}: the head is not an object")
    check_columns(stored, head, what)
    return head


def head_at(
    stored: Stored, entries: list[tuple[int, bytes]], revision: int | None, what: str
) -> dict[str, Any]:
    """The head at ``revision``, replayed from the commit log ``entries`` up to it (the
    stored head itself when there are none)."""
    if not entries:
        return checked_head(stored, what)
    assert revision is not None  # entries are read only for a past revision
    chosen = [(r, e) for r, e in entries if r <= revision]
    return replay(log_entries(chosen, what), revision, what=what)


def log_entries(rows: list[tuple[int, bytes]], what: str) -> list[tuple[int, Any]]:
    """Commit log entries as documents, each checked against its checksum."""
    return [
        (r, load_entry(unseal(e, f"commit log entry of revision {r} of {what}"), what))
        for r, e in rows
    ]


def parse_docs(docs: list[bytes], what: str) -> list[Any]:
    """JSON documents (already unsealed) parsed in one call."""
    parsed = load_json(b"[" + b",".join(docs) + b"]", what)
    return parsed  # type: ignore[no-any-return]
