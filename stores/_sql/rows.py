"""The rows the stores on SQL tables (SQLite, PostgreSQL) read and write: a run's stored
head with the columns beside it, the rows of one commit, and the error for a row whose
values have the wrong types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from statekernel._storage.protocol import Checkpoint
from statekernel.stores._format.checksum import seal
from statekernel.stores._format.codec import EncodedCommit
from statekernel.stores._format.dicts import dump_entry

__all__ = ["BadRow", "CommitRows", "Stored", "sealed_rows", "tag_rows"]


class BadRow(ValueError):
    """A stored row holds values of the wrong types (a damaged database); the store
    reports it as ``CorruptCheckpoint`` naming its path."""


@attrs.frozen
class Stored:
    """A run's row id, the run id, revision and state columns beside its head (checked
    against the head when it is read: ``columns``) and the head document bytes
    as stored."""

    rid: int
    run_id: str
    revision: int
    state: str
    head: bytes


@attrs.frozen
class CommitRows:
    """What one commit writes: the ``runs`` columns and the new rows of each table."""

    columns: tuple[Any, ...]
    revision: int
    entry: bytes
    first_message: int
    messages: Sequence[bytes]
    first_turn: int
    turns: Sequence[bytes]
    blobs: Sequence[tuple[str, bytes]]
    cancels: bool = False
    """The commit carries out the run's cancel request (``Checkpoint.cancels``)."""
    tags: tuple[tuple[str, str], ...] | None = None
    """The run's tags when the commit changes them (the tag index rows of the run are
    replaced by these), None when it keeps them."""


def sealed_rows(
    columns: tuple[Any, ...],
    cp: Checkpoint,
    enc: EncodedCommit,
    prior: Mapping[str, Any] | None,
) -> CommitRows:
    """What the commit of ``cp``, encoded as ``enc`` on the stored head ``prior``, writes
    beside the ``runs`` columns ``columns``: each row sealed with its checksum.

    Returns:
        The commit's rows.
    """
    return CommitRows(
        columns,
        cp.run.revision,
        seal(dump_entry(enc.entry)),
        enc.first_message,
        [seal(m) for m in enc.messages],
        enc.first_turn,
        [seal(t) for t in enc.turns],
        [(k, seal(v)) for k, v in enc.blobs.items()],
        cancels=cp.cancels,
        tags=tag_rows(prior, enc.head),
    )


def tag_rows(
    prior: Mapping[str, Any] | None, head: Mapping[str, Any]
) -> tuple[tuple[str, str], ...] | None:
    """The tag index rows of a commit from ``prior`` (the stored head it builds on, None
    when not known or a new run) to ``head``: None when the tags stay, so a commit that
    keeps them writes no index row."""
    tags = head.get("tags", {})
    if prior is None:
        return tuple(tags.items()) if tags or head.get("revision") != 0 else None
    if prior.get("tags", {}) == tags:
        return None
    return tuple(tags.items())
