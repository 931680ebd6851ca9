"""Run listing shared by the stores: summaries, filtering and cursor pagination."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from statekernel._records.run import StateId
from statekernel._storage.protocol import RunPage, RunSummary
from statekernel.errors import StoreError

__all__ = ["decode_cursor", "encode_cursor", "has_tags", "page_of"]


def encode_cursor(summary: RunSummary) -> str:
    """An opaque cursor positioned after ``summary`` in newest-first order."""
    return f"{summary.updated_at.isoformat()}|{summary.run_id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (updated_at, run_id) position of a cursor; a bad cursor raises ``StoreError``."""
    stamp, sep, run_id = cursor.partition("|")
    try:
        if not sep:
            raise ValueError("no separator")
        return datetime.fromisoformat(stamp), run_id
    except ValueError as exc:
        raise StoreError(f"invalid listing cursor {cursor!r}") from exc


def page_of(
    summaries: Iterable[RunSummary],
    *,
    state: StateId | None,
    updated_after: datetime | None,
    limit: int,
    cursor: str | None,
    tags: Mapping[str, str] | None = None,
) -> RunPage:
    """Filter, sort newest first (ties by run id) and cut one page. ``tags`` (checked
    already) are matched by reading each summary's tags: stores without a tag index
    scan every run."""
    rows = [
        s
        for s in summaries
        if (state is None or s.state == state)
        and (updated_after is None or s.updated_at > updated_after)
        and (not tags or has_tags(s, tags))
    ]
    rows.sort(key=lambda s: (s.updated_at, s.run_id), reverse=True)
    if cursor is not None:
        position = decode_cursor(cursor)
        rows = [s for s in rows if (s.updated_at, s.run_id) < position]
    page = tuple(rows[:limit])
    more = len(rows) > limit
    return RunPage(page, encode_cursor(page[-1]) if more and page else None)


def has_tags(summary: RunSummary, tags: Mapping[str, str]) -> bool:
    """True when the run carries every pair of ``tags``."""
    return all(summary.tags.get(k) == v for k, v in tags.items())
