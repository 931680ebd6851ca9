"""What the Redis store's tag sets (``_index``) are fed from: the tags a commit gives a
run, those a stored head carries, and a page of the runs a listing by tags found."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from statekernel._records.run import StateId
from statekernel._storage.protocol import RunPage, RunSummary
from statekernel.errors import CorruptCheckpoint
from statekernel.stores._format.checksum import unseal
from statekernel.stores._format.documents import load_json
from statekernel.stores._listing import page_of
from statekernel.stores.redis._index import Pairs

__all__ = ["head_pairs", "new_pairs", "page_of_tagged"]


def _pairs(head: Mapping[str, Any] | None) -> Pairs:
    tags = {} if head is None else head.get("tags", {})
    return frozenset(tags.items()) if isinstance(tags, dict) else frozenset()


def new_pairs(prior: Mapping[str, Any] | None, head: Mapping[str, Any]) -> Pairs:
    """The tags ``head`` carries that ``prior`` (the head it was committed on, None for a
    new run or one not known) did not: the sets the run joins."""
    return _pairs(head) - _pairs(prior)


def head_pairs(doc: bytes | str, what: str) -> Pairs:
    """The tags of a stored head document (none when it cannot be read: a damaged head
    that is being deleted leaves its run in sets a listing checks against heads)."""
    data = doc.encode() if isinstance(doc, str) else doc
    try:
        head = load_json(unseal(data, f"head of {what}"), what)
    except CorruptCheckpoint:
        return frozenset()
    return _pairs(head if isinstance(head, dict) else None)


def page_of_tagged(
    summaries: list[RunSummary],
    state: StateId | None,
    updated_after: datetime | None,
    limit: int,
    cursor: str | None,
    tags: Mapping[str, str],
) -> RunPage:
    """One page of the runs whose heads carry ``tags``, from their summaries."""
    return page_of(
        summaries, state=state, updated_after=updated_after, limit=limit, cursor=cursor, tags=tags
    )
