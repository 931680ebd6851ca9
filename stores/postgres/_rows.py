"""The rows of a commit and the filter of a listing, as the Postgres store writes and
reads them: the ``runs`` columns beside a head, and the ``WHERE`` of ``list_runs``
(state, update time, cursor, and each tag pair as a range of ``run_tags_by_pair``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from statekernel._records.run import StateId
from statekernel._storage.protocol import Checkpoint
from statekernel.stores._common import micros
from statekernel.stores._format.checksum import seal
from statekernel.stores._format.codec import EncodedCommit
from statekernel.stores._format.documents import dump_bytes
from statekernel.stores._listing import decode_cursor
from statekernel.stores._sql.rows import CommitRows, sealed_rows
from statekernel.stores.postgres._ops import Tables, run_key

__all__ = ["commit_rows", "listing_filters"]


def commit_rows(cp: Checkpoint, enc: EncodedCommit, prior: dict[str, Any] | None) -> CommitRows:
    """What the commit of ``cp`` writes, encoded as ``enc`` on the stored head ``prior``."""
    run = cp.run
    columns = (run.revision, run.state, micros(run.updated_at), seal(dump_bytes(enc.head)))
    return sealed_rows(columns, cp, enc, prior)


def listing_filters(
    t: Tables,
    state: StateId | None,
    updated_after: datetime | None,
    cursor: str | None,
    tags: Mapping[str, str] | None = None,
) -> tuple[str, list[Any]]:
    """The ``WHERE`` of a listing (empty without a filter) and its parameters."""
    clauses: list[str] = []
    params: list[Any] = []

    def param(value: Any) -> str:
        params.append(value)
        return f"${len(params)}"

    if state is not None:
        clauses.append(f"state = {param(state)}")
    if updated_after is not None:
        clauses.append(f"updated_us > {param(micros(updated_after))}")
    if cursor is not None:
        at, run_id = decode_cursor(cursor)
        us, key = param(micros(at)), param(run_key(run_id))
        clauses.append(f"(updated_us < {us} OR (updated_us = {us} AND run_id < {key}))")
    for name, value in (tags or {}).items():
        clauses.append(
            f"id IN (SELECT rid FROM {t.tags} WHERE key = {param(name)} AND value = {param(value)})"
        )
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params
