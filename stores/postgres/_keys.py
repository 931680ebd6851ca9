"""Advisory lock keys: 64-bit numbers for the locks the Postgres store takes.

Advisory locks are shared by every client of a database, so each key is a hash of what
it locks, the store's schema and a name of its kind: stores in different schemas, and
other applications' locks, do not meet.
"""

from __future__ import annotations

import hashlib

__all__ = ["lock_key", "lock_parts"]


def lock_key(kind: str, schema: str, name: str = "") -> int:
    """The signed 64-bit key of the advisory lock ``kind`` on ``name`` in ``schema``."""
    text = f"statekernel\0{kind}\0{schema}\0{name}".encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock_parts(key: int) -> tuple[int, int]:
    """(classid, objid) under which ``pg_locks`` shows the advisory lock of ``key``."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF
