"""Checksums of stored records: intact records come back as written, a damaged one is named."""

from __future__ import annotations

import pytest

from statekernel.errors import CorruptCheckpoint
from statekernel.stores._format.checksum import seal, unseal_blobs, unseal_each


def _flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def test_unseal_each_gives_back_what_was_sealed() -> None:
    records = [b"", b"a", b"message two", b"\x00\x01\x02\x03\x04"]
    assert unseal_each([seal(r) for r in records], "message of run 'r'") == records


@pytest.mark.parametrize("at", [0, 3, -1])
def test_unseal_each_names_the_damaged_record(at: int) -> None:
    sealed = [seal(b"message %d" % i) for i in range(5)]
    sealed[3] = _flipped(sealed[3], at)
    with pytest.raises(CorruptCheckpoint, match=r"damaged message 13 of run 'r': checksum"):
        unseal_each(sealed, "message of run 'r'", first=10)


@pytest.mark.parametrize("bad", [b"", b"abc", "text", bytearray(b"xyzw")])
def test_unseal_each_refuses_what_cannot_hold_a_checksum(bad: object) -> None:
    sealed: list[object] = [seal(b"ok"), bad]
    with pytest.raises(CorruptCheckpoint, match="message 1 of run 'r'"):
        unseal_each(sealed, "message of run 'r'")  # type: ignore[arg-type]


def test_unseal_blobs_names_the_damaged_blob() -> None:
    blobs = {"k1": seal(b"one"), "k2": _flipped(seal(b"two"), 1)}
    with pytest.raises(CorruptCheckpoint, match="damaged blob k2 of run 'r'"):
        unseal_blobs(blobs, "run 'r'")
    assert unseal_blobs({"k1": seal(b"one")}, "run 'r'") == {"k1": b"one"}
