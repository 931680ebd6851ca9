"""Where the committed part of a run's log ends (file store layouts 4 and 5).

Each commit appended to ``log.jsonl`` ends with its head record,
``["h", at, "crc", head]`` sealed like every line: ``at`` is the offset where the
commit's lines begin, ``crc`` the CRC32 of their bytes (the head record excluded,
which its own seal covers) and ``head`` the head, compressed as commit log entries are
(``stores._format.dicts``) and in base64. The fsync of the log is the commit point: a commit is
there when its head record is, with its checksum matching the lines before it.

``head.json`` is a hint written after that fsync and not fsynced: the length of the
log it covers and the offset of the last head record (``{"v": 5, "sz", "h"}``). A
hint that is intact says that much of the log was committed, so a log that no
longer holds a whole commit there has lost committed data (``CorruptCheckpoint``).
Past the hint, whole commits (a hint not yet or never replaced) are committed too;
the bytes after the last whole commit are a torn commit, ignored and cut off by the
next one. Without a hint (missing or torn: it is not fsynced) the log's last whole
commit wins. A layout 3 ``head.json`` (``{"v": 3, "sz", "head"}``, fsynced: the
commit point of that layout) is a hint that holds the head itself.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Callable
from typing import Any

import attrs

from statekernel.errors import CorruptCheckpoint, StoreError
from statekernel.stores._format.checksum import seal_line, unseal_line
from statekernel.stores._format.dicts import dump_entry, load_entry
from statekernel.stores._format.documents import dump_bytes, load_json

__all__ = [
    "LAYOUT_VERSION",
    "TORN",
    "Committed",
    "Hint",
    "find_committed",
    "head_record",
    "hint_bytes",
    "parse_hint",
    "record_name",
]

LAYOUT_VERSION = 5
"""The file store layout: each commit ends with its head record in the log, and the head
of a commit made under a lease keeps the run's largest fencing token (``"$f"``; layout
4 is layout 5 without it)."""
_READABLE = (3, 4, LAYOUT_VERSION)
_HEAD = b'["h",'
_KINDS = {b"m": "message", b"t": "completed turn", b"c": "commit log entry of revision"}


@attrs.frozen
class Hint:
    """What ``head.json`` says: the committed log length and where the head is."""

    version: int
    size: int
    head_at: int
    """The offset of the last head record (layouts 4 and 5)."""
    head: dict[str, Any] | None = None
    """The head itself (layout 3)."""


TORN = "torn"
"""A ``head.json`` that is there but unreadable."""


@attrs.frozen
class Committed:
    """The committed part of a run's log: its length and the head of its last commit."""

    size: int
    head: dict[str, Any]
    settled: bool
    """Whether an intact hint covers it (else a commit past the hint, not yet known
    to be on disk: fsynced under the run's lock before it is served)."""


def head_record(at: int, lines: bytes, head: dict[str, Any]) -> bytes:
    """The line that ends a commit: its head, where the commit began, its checksum."""
    packed = base64.b64encode(dump_entry(head))
    body = b'["h",%d,"%08x","%s"]' % (at, zlib.crc32(lines), packed)
    return seal_line(body) + b"\n"


def hint_bytes(size: int, head_at: int) -> bytes:
    """The contents of ``head.json`` for a log of ``size`` bytes."""
    return seal_line(dump_bytes({"v": LAYOUT_VERSION, "sz": size, "h": head_at}))


def parse_hint(data: bytes, path: str) -> Hint | str:
    """The hint in ``head.json``'s bytes, or ``TORN``; a layout this version does not
    know (a newer release's) raises ``StoreError`` naming it and the layouts read here."""
    try:
        doc = load_json(unseal_line(data, "head file"), "head file")
    except CorruptCheckpoint:
        return TORN
    if not isinstance(doc, dict):
        return TORN
    version = doc.get("v")
    if version not in _READABLE:
        reads = f"this release reads layouts {_READABLE[0]} to {LAYOUT_VERSION}"
        if type(version) is int and version > LAYOUT_VERSION:
            reads += ": a newer statekernel wrote it; upgrade to read it"
        raise StoreError(f"head file {path!r}: unknown file store layout {version!r} ({reads})")
    if type(doc.get("sz")) is not int:
        return TORN
    if version == 3:
        head = doc.get("head")
        return Hint(3, doc["sz"], doc["sz"], head) if isinstance(head, dict) else TORN
    if type(doc.get("h")) is not int or not 0 <= doc["h"] < doc["sz"]:
        return TORN
    return Hint(version, doc["sz"], doc["h"])


Read = Callable[[int, int], bytes]
"""Bytes ``[start, end)`` of the log."""


@attrs.frozen
class _Record:
    at: int
    crc: int
    packed: str

    def head(self, what: str) -> dict[str, Any]:
        """The head the record holds (decoded only for the commit that is read)."""
        try:
            head = load_entry(base64.b64decode(self.packed, validate=True), what)
        except (ValueError, binascii.Error) as exc:
            raise CorruptCheckpoint(f"invalid {what}: {exc}") from exc
        if not isinstance(head, dict):
            raise CorruptCheckpoint(f"invalid {what}: not a head")
        return head


def _record(line: bytes) -> _Record | None:
    """The head record a line holds, or None when its seal or shape is wrong."""
    try:
        doc = load_json(unseal_line(line, "head record"), "head record")
    except CorruptCheckpoint:
        return None
    if (
        not isinstance(doc, list)
        or len(doc) != 4
        or doc[0] != "h"
        or type(doc[1]) is not int
        or not isinstance(doc[2], str)
        or len(doc[2]) != 8
        or not isinstance(doc[3], str)
    ):
        return None
    try:
        return _Record(doc[1], int(doc[2], 16), doc[3])
    except ValueError:
        return None


def record_name(body: bytes, number: int) -> str:
    """What a log line holds, for error messages ("message 3 (log line 9)")."""
    kind = body[2:3]
    if kind == b"h":
        return f"head record (log line {number})"
    end = body.find(b",", 5)
    label = body[5:end].decode("utf-8", "replace").strip('"') if end > 5 else "?"
    if kind in (b"b", b"z"):
        return f"blob {label} (log line {number})"
    if kind in _KINDS:
        return f"{_KINDS[kind]} {label} (log line {number})"
    return f"log line {number}"


def _damage(read: Read, start: int, end: int, where: str) -> CorruptCheckpoint:
    """What is damaged in the log bytes ``[start, end)``, where committed data was lost."""
    first = read(0, start).count(b"\n") + 1
    for number, line in enumerate(read(start, end).split(b"\n")[:-1], first):
        what = f"{record_name(line[:-9], number)} of {where}"
        try:
            unseal_line(line, what)
        except CorruptCheckpoint as exc:
            return exc
    return CorruptCheckpoint(
        f"damaged commit (log bytes {start} to {end}) of {where}: checksum mismatch"
    )


def find_committed(
    read: Read, size: int, hint: Hint | str | None, where: str, log_path: str
) -> Committed | None:
    """The committed part of a log of ``size`` bytes, given the run's hint; None when
    there is no commit (and no hint). Damage the hint makes certain, or a whole commit
    after a damaged one, raises ``CorruptCheckpoint``."""
    if isinstance(hint, Hint):
        if size < hint.size:
            raise CorruptCheckpoint(
                f"invalid log {log_path!r}: {size} of {hint.size} committed bytes"
            )
        if hint.head is not None:  # layout 3: the head file holds the head
            if hint.size and read(hint.size - 1, hint.size) != b"\n":
                raise CorruptCheckpoint(
                    f"invalid log {log_path!r}: {hint.size} committed bytes are not whole lines"
                )
            base = Committed(hint.size, hint.head, True)
        else:
            base = _hinted(read, hint, where)
        return _after(read, size, base, where)
    found = _after(read, size, None, where)
    if found is None and hint == TORN:
        raise CorruptCheckpoint(
            f"damaged head file of {where}: unreadable, and the log holds no commit"
        )
    return found


def _hinted(read: Read, hint: Hint, where: str) -> Committed:
    """The commit the hint points at, which must be whole: it was committed."""
    line = read(hint.head_at, hint.size)
    at_line = hint.head_at == 0 or read(hint.head_at - 1, hint.head_at) == b"\n"
    if not line.endswith(b"\n") or not at_line:
        raise CorruptCheckpoint(f"invalid log of {where}: no head record at byte {hint.head_at}")
    record = _record(line[:-1])
    what = f"head record (log byte {hint.head_at}) of {where}"
    if record is None:
        unseal_line(line[:-1], what)  # names a checksum mismatch
        raise CorruptCheckpoint(f"invalid {what}: not a head record")
    if (
        not 0 <= record.at <= hint.head_at
        or zlib.crc32(read(record.at, hint.head_at)) != record.crc
    ):
        raise _damage(read, min(max(record.at, 0), hint.head_at), hint.size, where)
    return Committed(hint.size, record.head(what), True)


def _after(read: Read, size: int, base: Committed | None, where: str) -> Committed | None:
    """``base`` (or nothing: from the log's start) and the whole commits after it.

    A commit that is not whole (its head record missing or damaged, or its checksum
    not matching) is a torn commit when nothing follows it, and damage when a whole
    commit does (it was written after that one was on disk).
    """
    start = 0 if base is None else base.size
    data = read(start, size)
    last: _Record | None = None
    end, last_at, broken, pos = start, start, False, 0
    while (nl := data.find(b"\n", pos)) >= 0:
        line, line_at, pos = data[pos:nl], start + pos, nl + 1
        if line[:5] != _HEAD:
            continue
        record = _record(line)
        whole = (
            record is not None
            and start <= record.at <= line_at
            and zlib.crc32(data[record.at - start : line_at - start]) == record.crc
        )
        if not whole or record is None:
            broken = True
            continue
        first = base is None and last is None  # a log begun in layout 3: lines before it
        if broken or (record.at != end and not first):
            raise _damage(read, end, line_at, where)
        last, last_at, end = record, line_at, start + pos
    if last is None:
        return base
    return Committed(end, last.head(f"head record (log byte {last_at}) of {where}"), False)
