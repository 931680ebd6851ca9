"""Blobs: long strings and large JSON values kept once per run, by a hash of their text.

A tool output that appears in a tool call record, a tool message and a head
revision is written once. In a document a blob is a marker, a one-key object whose
key starts with ``$``: ``{"$b": key}`` for a string of at least ``BLOB_MIN``
characters, ``{"$v": key}`` for an object or array whose JSON text is that long. A
user object with a key starting with ``$`` is wrapped as ``{"$e": {...}}`` so it is
never read back as a marker. A blob's bytes are its UTF-8 text, zlib-compressed when
that saves a tenth (``blob_bytes``). ``BlobWriter`` encodes a commit's strings and
values and collects the blobs it must write; ``BlobReader`` reads them back.
``missing_blob`` finds a blob a stored document references that a run does not hold,
without decoding the document (a load raises for it at once, not when the record is
first read).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from statekernel.stores._format.documents import canonical, load_json

__all__ = [
    "BLOB_MIN",
    "ZIP_MIN",
    "BlobReader",
    "BlobWriter",
    "blob_bytes",
    "blob_key",
    "blob_refs",
    "blob_text",
    "escape",
    "missing_blob",
]

BLOB_MIN = 256
"""Strings (and JSON texts of values) at least this long are stored as blobs."""

ZIP_MIN = 512
"""Blobs of at least this many bytes are stored zlib-compressed when that saves a tenth."""

_MARKER = re.compile(rb'"\$[bv]"\s*:\s*"([^"\\]*)"')
"""A blob marker in stored JSON text (or an escaped user object that looks like one)."""
_MARKER_TEXT = re.compile(_MARKER.pattern.decode())

_ZIPPED = b"\x00z"
_ESCAPED = b"\x00"
_BLOB_CODES = ("$b", "$v")


def blob_key(text: str) -> str:
    """The key of a blob: 128 bits of BLAKE2b over its UTF-8 text, base64url."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def blob_bytes(text: str) -> bytes:
    """How a blob is stored: UTF-8; or ``NUL z`` + zlib of it when that is a tenth smaller;
    or NUL + a JSON string when UTF-8 cannot hold the text or it starts with NUL."""
    if not text.startswith("\x00"):
        try:
            data = text.encode()
        except UnicodeEncodeError:
            pass
        else:
            if len(data) >= ZIP_MIN:
                packed = zlib.compress(data, 6)
                if len(packed) + 2 <= len(data) * 0.9:
                    return _ZIPPED + packed
            return data
    return _ESCAPED + json.dumps(text).encode()


def blob_text(data: bytes) -> str:
    """The text of a stored blob (inverse of ``blob_bytes``)."""
    if data[:1] == _ESCAPED:
        if data[1:2] == b"z":
            return zlib.decompress(data[2:]).decode()
        text = json.loads(data[1:])
        if not isinstance(text, str):
            raise ValueError("blob escape is not a JSON string")
        return text
    return data.decode()


def escape(value: Any) -> Any:
    """A JSON value as a document keeps it: objects with a ``$`` key wrapped as ``{"$e": ...}``."""
    if type(value) is dict:
        out = {k: escape(v) for k, v in value.items()}
        if any(type(k) is str and k[:1] == "$" for k in out):
            return {"$e": out}
        return out
    if isinstance(value, list | tuple):
        return [escape(v) for v in value]
    return value


class BlobWriter:
    """Encodes strings and JSON values, collecting the blobs that must be written.

    ``known`` holds keys already stored for the run; they are not written again.
    """

    def __init__(self, known: frozenset[str] = frozenset(), *, inline: bool = False) -> None:
        self.known = known
        self.inline = inline
        """Keep every string and value in the document (escaped), writing no blob."""
        self.blobs: dict[str, bytes] = {}
        self.refs: set[str] = set()
        """Keys referenced since this set was last replaced."""

    def put(self, text: str) -> str:
        """Store ``text`` as a blob (once); its key."""
        key = _cached_key(text)
        self.refs.add(key)
        if key not in self.known and key not in self.blobs:
            self.blobs[key] = blob_bytes(text)
        return key

    def s(self, text: str) -> Any:
        """A string field: itself, or a blob marker when long."""
        if len(text) < BLOB_MIN or self.inline:
            return text
        return {"$b": self.put(text)}

    def opt(self, text: str | None) -> Any:
        """An optional string field."""
        return None if text is None else self.s(text)

    def json(self, value: Any) -> Any:
        """A JSON value owned by the caller (context, tool input and output, event data)."""
        if type(value) is str:
            return self.s(value)
        if isinstance(value, dict | list | tuple):
            if self.inline:
                return escape(value)
            text = canonical(value)
            if len(text) >= BLOB_MIN:
                return {"$v": self.put(text)}
            return escape(value)
        return value


class BlobReader:
    """Decodes what ``BlobWriter`` wrote, given the run's blobs."""

    def __init__(self, blobs: Mapping[str, bytes | str]) -> None:
        self._blobs = blobs
        self._texts: dict[str, str] = {}
        self.missing: str | None = None
        """The key of the last blob asked for that the run does not hold (a damaged
        store): what fails to decode names it."""

    @property
    def stored(self) -> Mapping[str, bytes | str]:
        """The run's blobs as stored, by key."""
        return self._blobs

    def text(self, key: Any) -> str:
        """The text of the blob ``key``."""
        text = self._texts.get(key)
        if text is None:
            data = self._blobs.get(key)
            if data is None:
                self.missing = str(key)
                raise KeyError(f"missing blob {key!r}")
            text = self._texts[key] = data if isinstance(data, str) else blob_text(data)
        return text

    def s(self, value: Any) -> str:
        """A string field."""
        if type(value) is str:
            return value
        if type(value) is dict and len(value) == 1 and "$b" in value:
            return self.text(value["$b"])
        raise TypeError(f"expected a string, got {type(value).__name__}")

    def opt(self, value: Any) -> str | None:
        """An optional string field."""
        return None if value is None else self.s(value)

    def json(self, value: Any) -> Any:
        """A JSON value."""
        kind = type(value)
        if kind is list:
            return [self.json(v) for v in value]
        if kind is not dict:
            return value
        if len(value) == 1:
            key = next(iter(value))
            if key == "$b":
                return self.text(value[key])
            if key == "$v":
                return load_json(self.text(value[key]), "stored JSON value")
            if key == "$e":
                inner = value[key]
                if type(inner) is not dict:
                    raise TypeError("escaped object is not an object")
                return {k: self.json(v) for k, v in inner.items()}
        for k in value:
            if k[:1] == "$":
                raise ValueError(f"unknown marker {k!r}")
        return {k: self.json(v) for k, v in value.items()}


_KEY_CACHE: dict[int, tuple[str, str]] = {}


def _cached_key(text: str) -> str:
    """``blob_key`` with a small identity cache: the same string objects (a tool output,
    the tool specs) are encoded again in every commit while their turn is current."""
    hit = _KEY_CACHE.get(id(text))
    if hit is not None and hit[0] is text:
        return hit[1]
    key = blob_key(text)
    if len(_KEY_CACHE) >= 256:
        with contextlib.suppress(StopIteration, RuntimeError, KeyError):
            del _KEY_CACHE[next(iter(_KEY_CACHE))]
    _KEY_CACHE[id(text)] = (text, key)
    return key


def blob_refs(doc: Any) -> frozenset[str]:
    """Keys of every blob a document references."""
    found: set[str] = set()
    _collect(doc, found.add)
    return frozenset(found)


def _collect(doc: Any, add: Callable[[str], None]) -> None:
    if type(doc) is list:
        for v in doc:
            _collect(v, add)
    elif type(doc) is dict:
        if len(doc) == 1:
            key = next(iter(doc))
            if key in _BLOB_CODES:
                add(doc[key])
                return
            if key == "$e" and type(doc[key]) is dict:
                doc = doc[key]
        for v in doc.values():
            _collect(v, add)


def missing_blob(doc: Any, blobs: Mapping[str, Any], what: str) -> str | None:
    """The key of a blob that the stored document ``doc`` (its JSON text, or the
    document) references and ``blobs`` does not hold; None when it holds them all.

    JSON text is scanned for markers first, without parsing it; only a text naming a
    key that ``blobs`` lacks is parsed, to tell a marker from a user object wrapped as
    ``{"$e": ...}`` that merely looks like one (``what`` names ``doc`` if it cannot be
    parsed).
    """
    if isinstance(doc, bytes | str):
        if all(key in blobs for key in _named(doc)):
            return None
        doc = load_json(doc, what)
    lacking = sorted(str(key) for key in blob_refs(doc) if key not in blobs)
    return lacking[0] if lacking else None


def _named(text: bytes | str) -> list[str]:
    """The keys that the markers in a JSON text (and look-alikes) name."""
    if isinstance(text, str):
        return [m.group(1) for m in _MARKER_TEXT.finditer(text)]
    return [m.group(1).decode("utf-8", "replace") for m in _MARKER.finditer(text)]
