"""Stored encoding of events, inside the commit log entry of the revision that wrote them.

An entry's events are ``"E": [event, ...]`` with ``"q"``, the ``seq`` of the first
one. An event is ``[type, data?, extra?]`` with trailing defaults left out:

* ``type``: a small integer for the kernel's event types (``EVENT_CODES``), else its name;
* ``data``: a list of values when its keys are the usual ones for the type
  (``EVENT_KEYS``, in that order), an object otherwise, ``{"$x": value}`` when it
  is not an object at all; ``{}`` is left out;
* ``extra``: what differs from what the entry implies: ``id`` (run id), ``r``
  (revision), ``s`` (seq) and ``t`` (time, when not the commit's ``updated_at``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from statekernel._codec_base import BlobReader, corrupt, dec_time, enc_time, escape
from statekernel._events import Event

__all__ = ["EVENT_CODES", "EVENT_KEYS", "decode_events", "encode_events", "entry_time"]

EVENT_CODES = (
    "run_started", "turn_started", "turn_prepared", "model_started", "model_restarted",
    "model_completed", "tool_call_started", "tool_call_completed", "tools_completed",
    "turn_completed", "run_paused", "run_resumed", "input_received", "run_failed",
    "run_retried", "run_completed", "run_forked",
)  # fmt: skip
"""Stored event types as small integers. Append only: positions are stored."""

EVENT_KEYS: Mapping[str, tuple[str, ...]] = {
    "run_started": ("model",),
    "turn_started": ("index",),
    "turn_prepared": ("index", "model", "messages", "tools"),
    "model_started": ("index", "attempt"),
    "model_restarted": ("index", "attempt"),
    "model_completed": ("index", "finish_reason", "tool_calls"),
    "tool_call_started": ("call_id", "name", "attempt"),
    "tool_call_completed": ("call_id", "name", "is_error"),
    "tools_completed": ("index", "calls"),
    "turn_completed": ("index",),
    "run_paused": ("reason", "resume_to", "metadata"),
    "run_resumed": ("reason", "resume_to"),
    "input_received": ("messages", "roles"),
    "run_failed": ("error", "message", "failed_in"),
    "run_retried": ("error", "resume_to"),
    "run_completed": ("reason",),
    "run_forked": ("from_run_id", "from_revision"),
}
"""The usual data keys of each event type, stored as positions. Never change an entry."""

_CODE_OF = {name: i for i, name in enumerate(EVENT_CODES)}
_DECODE_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError)
_READER = BlobReader({})


def encode_events(
    events: Iterable[Event], run_id: str, revision: int, first: int, at: Any
) -> list[list[Any]]:
    """The stored form of a commit's events; ``at`` is the commit's encoded ``updated_at``."""
    docs: list[list[Any]] = []
    for i, event in enumerate(events):
        extra: dict[str, Any] = {}
        if event.run_id != run_id:
            extra["id"] = event.run_id
        if event.revision != revision:
            extra["r"] = event.revision
        if event.seq != first + i:
            extra["s"] = event.seq
        when = enc_time(event.at)
        if when != at:
            extra["t"] = when
        doc: list[Any] = [_CODE_OF.get(event.type, event.type), _data(event.type, event.data)]
        if extra:
            doc.append(extra)
        elif doc[1] == {}:
            doc.pop()
        docs.append(doc)
    return docs


def _data(kind: str, data: Any) -> Any:
    if type(data) is not dict:
        return {"$x": escape(data)}
    keys = EVENT_KEYS.get(kind)
    if keys is not None and len(keys) == len(data) and tuple(data) == keys:
        return [escape(v) for v in data.values()]
    return escape(data)


def entry_time(entry: Mapping[str, Any]) -> Any:
    """The encoded ``updated_at`` of a commit log entry (its head or patch carries it)."""
    doc = entry["f"] if "f" in entry else entry["p"]
    return doc["ua"]


def decode_events(
    entries: Iterable[tuple[int, Any]], run_id: str, *, what: str = "events"
) -> list[Event]:
    """The events of commit log entries, given as (revision, entry) pairs."""
    events: list[Event] = []
    try:
        for revision, entry in entries:
            if "E" in entry:
                _decode_entry(events, entry, revision, run_id)
    except _DECODE_ERRORS as exc:
        raise corrupt(what, exc) from exc
    return events


def _decode_entry(out: list[Event], entry: Mapping[str, Any], revision: int, run_id: str) -> None:
    first = entry["q"]
    at = dec_time(entry_time(entry))
    for i, doc in enumerate(entry["E"]):
        kind = EVENT_CODES[doc[0]] if type(doc[0]) is int else _text(doc[0])
        extra = doc[2] if len(doc) > 2 else {}
        data = _decode_data(kind, doc[1]) if len(doc) > 1 else {}
        when = dec_time(extra["t"]) if "t" in extra else at
        out.append(
            Event(
                kind,
                extra.get("id", run_id),
                extra.get("r", revision),
                extra.get("s", first + i),
                data,
                when,
            )
        )


def _decode_data(kind: str, doc: Any) -> Any:
    if type(doc) is list:
        keys = EVENT_KEYS[kind]
        if len(keys) != len(doc):
            raise ValueError(f"{len(doc)} values for the {len(keys)} keys of {kind!r}")
        return {k: _READER.json(v) for k, v in zip(keys, doc, strict=True)}
    if type(doc) is dict and len(doc) == 1 and "$x" in doc:
        return _READER.json(doc["$x"])
    if type(doc) is not dict:
        raise TypeError(f"event data is a {type(doc).__name__}")
    return _READER.json(doc)


def _text(value: Any) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value
