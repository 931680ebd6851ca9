"""The SQLite store's columns beside a run's head, checked against the head.

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
from statekernel.stores._sqlite_ops import Stored

__all__ = ["BAD_STATE", "check_columns", "column_problem"]


def _mismatch(column: str, stored: Any, head: Any) -> str:
    return f"its {column} column holds {stored!r}, its head {head!r}"


def check_columns(stored: Stored, head: Mapping[str, Any], what: str) -> None:
    """Raise ``CorruptCheckpoint`` naming the column when the row's ``revision`` or
    ``state`` is not the one of its (checksummed) head."""
    problem = column_problem(stored.revision, stored.state, None, head)
    if problem is not None:
        raise CorruptCheckpoint(f"invalid {what}: {problem}")


def column_problem(
    revision: Any, state: Any, updated_us: Any, head: Mapping[str, Any] | RunSummary
) -> str | None:
    """What is wrong with a row's columns given its head (None: they match it);
    ``updated_us`` None is not compared."""
    values: dict[str, Any]
    if isinstance(head, RunSummary):
        values = {"revision": head.revision, "state": head.state}
        updated = micros(head.updated_at)
    else:
        values = {"revision": head.get("revision"), "state": head.get("state")}
        updated = None
    for column, value in (("revision", revision), ("state", state)):
        if type(value) is not type(values[column]) or value != values[column]:
            return _mismatch(column, value, values[column])
    if updated_us is not None and updated is not None and updated_us != updated:
        return _mismatch("updated_us", updated_us, updated)
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
