"""Stored documents as bytes: compact UTF-8 JSON, times as integers, what cannot be read.

Every record a store keeps is a JSON document (a head, a message, a turn, a commit
log entry) written compactly (``dump_bytes``) and parsed back (``load_json``: with
``orjson`` when it is installed, giving the same values as ``json``). A time in UTC
is integer microseconds since the epoch (``enc_time``); any other keeps its ISO
text. Whatever cannot be read raises ``CorruptCheckpoint`` naming it (``corrupt``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from statekernel.errors import CorruptCheckpoint

__all__ = ["canonical", "corrupt", "dec_time", "dump_bytes", "enc_time", "load_json"]

_fast_loads: Callable[[bytes | str], Any] | None
try:
    from orjson import loads as _orjson_loads

    _fast_loads = _orjson_loads
except ImportError:  # pragma: no cover - optional speed-up
    _fast_loads = None

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def corrupt(what: str, exc: BaseException | str) -> CorruptCheckpoint:
    """A ``CorruptCheckpoint`` naming what could not be read and why."""
    detail = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return CorruptCheckpoint(f"invalid {what}: {detail}")


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def canonical(value: Any) -> str:
    """The compact JSON text of a value (the form tool results are fed back in)."""
    return _ENCODER.encode(value)


def dump_bytes(doc: Any) -> bytes:
    """A document as UTF-8 JSON; text with lone surrogates falls back to ASCII escapes."""
    try:
        return canonical(doc).encode()
    except UnicodeEncodeError:
        return json.dumps(doc, separators=(",", ":")).encode()


_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_TEXT = re.compile(r"[0-9]{19}")
"""Where an integer beyond 64 bits may be (orjson would read it as a float)."""


def load_json(data: bytes | str, what: str) -> Any:
    """Parse stored JSON; anything unreadable raises ``CorruptCheckpoint``.

    Uses ``orjson`` when it is installed and falls back to ``json`` for what orjson
    refuses (NaN) or reads otherwise (an integer beyond 64 bits becomes a float in
    orjson: text with a run of 19 digits or more goes to ``json``), so the result is
    the same either way.
    """
    long_digits = _LONG_DIGITS_TEXT if isinstance(data, str) else _LONG_DIGITS
    if _fast_loads is not None and long_digits.search(data) is None:
        try:
            return _fast_loads(data)
        except ValueError:
            pass
    try:
        return json.loads(data)
    except (ValueError, TypeError) as exc:
        raise corrupt(what, exc) from exc


def enc_time(value: datetime) -> int | str:
    """UTC times as integer microseconds since the epoch, any other as ISO text."""
    if value.tzinfo is UTC:
        return (value - _EPOCH) // _MICRO
    return value.isoformat()


def dec_time(value: Any) -> datetime:
    """The inverse of ``enc_time``."""
    if type(value) is int:
        return _EPOCH + value * _MICRO
    if type(value) is str:
        return datetime.fromisoformat(value)
    raise TypeError(f"expected a time, got {type(value).__name__}")
