"""The records inside the part rows of the SQL stores (``stores._sql.bundles``): read
one by name, and a row's bundle with one record replaced or removed, for the raw access
of ``SQLiteRecords`` and ``PostgresRecords``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from statekernel.stores._sql.bundles import bundle, unbundle

__all__ = ["PartRow", "part_records", "rebundled", "record_of"]

PartRow = tuple[int, int, int, bytes]
"""A part row as read: (revision, first message, first turn, bundle)."""

_KINDS = ("message", "turn")


def part_records(rows: Iterable[Sequence[Any]]) -> dict[tuple[str, int | str], int]:
    """The records the part rows hold (``("message", position)``, ``("turn",
    position)``, ``("blob", key)``), each with the revision of the row that holds it."""
    found: dict[tuple[str, int | str], int] = {}
    for revision, first_message, first_turn, doc in rows:
        messages, turns, blobs = unbundle(bytes(doc), "parts")
        for kind, first, items in zip(
            _KINDS, (first_message, first_turn), (messages, turns), strict=True
        ):
            found.update({(kind, first + i): revision for i in range(len(items))})
        found.update({("blob", key): revision for key, _ in blobs})
    return found


def record_of(row: Sequence[Any], key: tuple[str, int | str]) -> bytes:
    """The bytes of the record ``key`` in the part row ``row``."""
    _, first_message, first_turn, doc = row
    messages, turns, blobs = unbundle(bytes(doc), "parts")
    kind, name = key
    if kind == "blob":
        return dict(blobs)[str(name)]
    assert isinstance(name, int)
    items, first = (messages, int(first_message)) if kind == "message" else (turns, int(first_turn))
    return items[name - first]


def rebundled(row: Sequence[Any], key: tuple[str, int | str], data: bytes | None) -> bytes:
    """The bundle of ``row`` with the record ``key`` replaced by ``data`` as it is, or
    removed (None)."""
    _, first_message, first_turn, doc = row
    messages, turns, blobs = unbundle(bytes(doc), "parts")
    kind, name = key
    if kind == "blob":
        at = [k for k, _ in blobs].index(str(name))
        blobs[at : at + 1] = [] if data is None else [(str(name), data)]
    else:
        items, first = (messages, first_message) if kind == "message" else (turns, first_turn)
        assert isinstance(name, int)
        items[name - first : name - first + 1] = [] if data is None else [data]
    return bundle(messages, turns, blobs)
