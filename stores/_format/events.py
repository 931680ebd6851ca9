"""Stored form of events, inside the commit log entry of the revision that wrote them.

An entry's events are ``"E": [event, ...]`` with ``"q"``, the ``seq`` of the first
one. Each is the storage converter's document of the ``Event`` (``converter``)
without what the entry implies: ``run_id`` and ``revision`` when they are the
entry's, ``seq`` when it follows on, ``at`` when it is the commit's ``updated_at``.
Event data stays in the entry (no blobs): events are read without the run's parts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from statekernel._records.events import Event
from statekernel.stores._format.converter import (
    INLINE,
    NO_BLOBS,
    StorageConverter,
    reading,
    writing,
)
from statekernel.stores._format.documents import corrupt

__all__ = ["decode_events", "encode_events", "entry_time"]

_DECODE_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError)


def encode_events(
    events: Iterable[Event], run_id: str, revision: int, first: int, at: Any
) -> list[dict[str, Any]]:
    """The stored form of a commit's events; ``at`` is the commit's stored ``updated_at``."""
    implied: dict[str, Any] = {"run_id": run_id, "revision": revision, "at": at}
    docs: list[dict[str, Any]] = []
    with writing(INLINE) as conv:
        unstructure = conv.get_unstructure_hook(Event)
        for i, event in enumerate(events):
            doc = unstructure(event)
            implied["seq"] = first + i
            docs.append({k: v for k, v in doc.items() if implied.get(k, _NONE) != v})
    return docs


_NONE = object()


def entry_time(entry: Mapping[str, Any]) -> Any:
    """The stored ``updated_at`` of a commit log entry (its head or patch carries it)."""
    doc = entry["f"] if "f" in entry else entry["p"]
    return doc["updated_at"]


def decode_events(
    entries: Iterable[tuple[int, Any]], run_id: str, *, what: str = "events"
) -> list[Event]:
    """The events of commit log entries, given as (revision, entry) pairs."""
    events: list[Event] = []
    try:
        with reading(NO_BLOBS) as conv:
            for revision, entry in entries:
                if "E" in entry:
                    _decode_entry(events, entry, revision, run_id, conv, what)
    except _DECODE_ERRORS as exc:
        raise corrupt(what, exc) from exc
    return events


def _decode_entry(
    out: list[Event],
    entry: Mapping[str, Any],
    revision: int,
    run_id: str,
    conv: StorageConverter,
    what: str,
) -> None:
    first = entry["q"]
    at = entry_time(entry)
    for i, doc in enumerate(entry["E"]):
        if type(doc) is not dict:
            raise TypeError(f"an event is a {type(doc).__name__}")
        full = {"run_id": run_id, "revision": revision, "seq": first + i, "at": at, **doc}
        out.append(conv.load(full, Event, what))
