"""Checksums of stored records: each record a store writes carries the CRC32 of its bytes.

Binary records (SQLite rows, Redis values, the memory store's values) end with the
four bytes of the CRC32 of what precedes them, big-endian (``seal``). Records of
text files (the file store's log lines and head) end with a space and the CRC32 as
eight hex digits (``seal_line``). A record whose checksum does not match raises
``CorruptCheckpoint`` naming it, so a flipped byte is never served as data.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

from statekernel.errors import CorruptCheckpoint

__all__ = ["seal", "seal_line", "unseal", "unseal_blobs", "unseal_each", "unseal_line"]

_SIZE = 4


def seal(data: bytes) -> bytes:
    """``data`` followed by its CRC32 (four bytes, big-endian)."""
    return data + zlib.crc32(data).to_bytes(_SIZE, "big")


def unseal(data: bytes, what: str) -> bytes:
    """The bytes ``seal`` was given; ``CorruptCheckpoint`` naming ``what`` if damaged."""
    if type(data) is not bytes:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise CorruptCheckpoint(f"damaged {what}: stored as {type(data).__name__}")
        data = bytes(data)
    body = memoryview(data)[:-_SIZE]
    if len(data) < _SIZE or zlib.crc32(body).to_bytes(_SIZE, "big") != data[-_SIZE:]:
        raise CorruptCheckpoint(f"damaged {what}: checksum mismatch")
    return data[:-_SIZE]


def _intact(data: object) -> bytes | None:
    """The body of a sealed record whose checksum holds, else None (``unseal`` then
    says what is wrong): the short path of a load, which checks thousands of them."""
    if type(data) is bytes and len(data) >= _SIZE:
        body = data[:-_SIZE]
        if zlib.crc32(body).to_bytes(_SIZE, "big") == data[-_SIZE:]:
            return body
    return None


def unseal_each(records: Iterable[bytes], what: str, first: int = 0) -> list[bytes]:
    """``unseal`` of numbered records (``what`` names their kind: "message 3 of ...")."""
    out: list[bytes] = []
    for i, data in enumerate(records):
        body = _intact(data)
        if body is None:
            kind, _, owner = what.partition(" of ")
            body = unseal(data, f"{kind} {first + i} of {owner}")
        out.append(body)
    return out


def unseal_blobs(blobs: Mapping[str, bytes], what: str) -> dict[str, bytes]:
    """``unseal`` of a run's blobs by key (``what`` names the run)."""
    out: dict[str, bytes] = {}
    for key, data in blobs.items():
        body = _intact(data)
        out[key] = body if body is not None else unseal(data, f"blob {key} of {what}")
    return out


def seal_line(data: bytes) -> bytes:
    """A text record: ``data``, a space and its CRC32 as eight hex digits."""
    return b"%s %08x" % (data, zlib.crc32(data))


def unseal_line(line: bytes, what: str) -> bytes:
    """The bytes ``seal_line`` was given; ``CorruptCheckpoint`` naming ``what`` if damaged."""
    body = line[:-9]
    try:
        ok = line[-9:-8] == b" " and int(line[-8:], 16) == zlib.crc32(body)
    except ValueError:
        ok = False
    if not ok:
        raise CorruptCheckpoint(f"damaged {what}: checksum mismatch")
    return body
