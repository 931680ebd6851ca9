"""The columns beside a run's head in a SQL store, checked against the head.

A ``runs`` row keeps copies of head fields in columns, to index and compare on:
``revision`` (the compare-and-set of a commit, which revision is the head),
``state`` (listing by state) and ``updated_us`` (listing order, cursors). Only the
head carries a checksum, so every read that trusts a column checks it against the
head: a damaged column is a ``CorruptCheckpoint`` naming the run and the column, never
a past revision served as the head, a commit refused as if it raced another, or a run
silently left out of a listing.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from statekernel._records.run import STATE_IDS
from statekernel._storage.protocol import RunSummary
from statekernel.errors import CorruptCheckpoint
from statekernel.stores._common import micros
from statekernel.stores._sql.rows import Stored

__all__ = ["BAD_STATE", "check_columns", "column_problem"]


def check_columns(stored: Stored, head: Mapping[str, Any], what: str) -> None:
    """Raise ``CorruptCheckpoint`` naming the column when the row's ``run_id``,
    ``revision`` or ``state`` is not the one of its (checksummed) head."""
    columns = {"run_id": stored.run_id, "revision": stored.revision, "state": stored.state}
    problem = column_problem(columns, head)
    if problem is not None:
        raise CorruptCheckpoint(f"invalid {what}: {problem}")


def column_problem(columns: Mapping[str, Any], head: Mapping[str, Any] | RunSummary) -> str | None:
    """What is wrong with a row's ``columns`` (some of ``run_id``, ``revision``,
    ``state``, ``updated_us``) given its head; None when they match it."""
    for column, value in columns.items():
        if isinstance(head, RunSummary):
            want = micros(head.updated_at) if column == "updated_us" else getattr(head, column)
        else:
            want = head.get(column)
        if type(value) is not type(want) or value != want:
            return f"its {column} column holds {value!r}, its head {want!r}"
    return None


def _bad_state() -> tuple[str, tuple[str, ...]]:
    ids = sorted(STATE_IDS)
    clauses = ["state < ?"]
    params = [ids[0]]
    for low, high in itertools.pairwise(ids):
        clauses.append("(state > ? AND state < ?)")
        params += [low, high]
    clauses.append("state > ?")
    params.append(ids[-1])
    return " OR ".join(clauses), tuple(params)


BAD_STATE = _bad_state()
"""A ``WHERE`` condition (and its parameters) matching rows whose ``state`` column holds
no state id: one range of the ``runs_by_state`` index per gap between the ids (text
sorts after numbers and before blobs), so a healthy store answers it at once."""
