"""A commit's parts in one record: the SQL stores (SQLite layout 7, PostgreSQL layout 8)
write the messages, completed turns and blobs a commit adds as one ``parts`` row (the
run's row id, the revision, the positions of its first message and turn, and this
bundle), instead of a row each. A turn's two commits write two part rows where they
wrote six, and a load reads a run's parts in a row per commit.

Each item in a bundle is the record the store wrote before (sealed: it ends with its
own checksum), so a damaged message is still named by its position; the bundle adds
only their sizes, checked to add up to the bundle's length::

    version (1 byte, 1) | messages, turns, blobs (3 x u32)
    | the size of each message and turn (u32 each) | each blob's key and data sizes
    (u16 + u32) | the messages, the turns, then each blob's key (ASCII) and data

Sizes are big-endian. ``struct`` frames it because no record library writes a list of
byte strings with less work: the items are already bytes, and this copies each once.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

from statekernel.errors import CorruptCheckpoint

__all__ = ["Unbundled", "assemble", "bundle", "gather", "unbundle"]

_VERSION = 1
_HEAD = struct.Struct(">BIII")

Unbundled = tuple[list[bytes], list[bytes], list[tuple[str, bytes]]]
"""A bundle's messages, completed turns and (key, data) blobs."""


def bundle(
    messages: Sequence[bytes], turns: Sequence[bytes], blobs: Sequence[tuple[str, bytes]]
) -> bytes:
    """One record holding a commit's new (sealed) messages, turns and blobs."""
    keys = [k.encode("ascii") for k, _ in blobs]
    sizes = [len(d) for d in messages] + [len(d) for d in turns]
    blob_sizes: list[int] = []
    for key, (_, data) in zip(keys, blobs, strict=True):
        blob_sizes += (len(key), len(data))
    head = _HEAD.pack(_VERSION, len(messages), len(turns), len(blobs))
    table = struct.pack(f">{len(sizes)}I{'HI' * len(blobs)}", *sizes, *blob_sizes)
    body: list[bytes] = [head, table, *messages, *turns]
    for key, (_, data) in zip(keys, blobs, strict=True):
        body += (key, data)
    return b"".join(body)


def unbundle(doc: object, what: str) -> Unbundled:
    """The items of a bundle (each still sealed); ``CorruptCheckpoint`` naming ``what``
    when its framing is damaged (a size, a count, its version or its length)."""
    if type(doc) is not bytes:
        if not isinstance(doc, bytes | bytearray | memoryview):
            raise CorruptCheckpoint(f"damaged {what}: stored as {type(doc).__name__}")
        doc = bytes(doc)
    try:
        version, nm, nt, nb = _HEAD.unpack_from(doc)
        if version != _VERSION:
            raise ValueError(f"format version {version}")
        if (nm + nt) * 4 + nb * 6 > len(doc):
            raise ValueError(f"{nm + nt + nb} items cannot fit in {len(doc)} bytes")
        table = struct.Struct(f">{nm + nt}I{'HI' * nb}")
        sizes = table.unpack_from(doc, _HEAD.size)
    except (struct.error, ValueError, MemoryError) as exc:
        raise CorruptCheckpoint(f"damaged {what}: {exc}") from exc
    at = _HEAD.size + table.size
    if at + sum(sizes) != len(doc):
        raise CorruptCheckpoint(f"damaged {what}: its sizes do not add up to its length")
    items: list[bytes] = []
    for size in sizes[: nm + nt]:
        items.append(doc[at : at + size])
        at += size
    blobs: list[tuple[str, bytes]] = []
    for i in range(nm + nt, len(sizes), 2):
        key, size = doc[at : at + sizes[i]], sizes[i + 1]
        at += sizes[i]
        try:
            text = key.decode("ascii")
        except UnicodeDecodeError as exc:
            raise CorruptCheckpoint(f"damaged {what}: a blob key is not ASCII") from exc
        blobs.append((text, doc[at : at + size]))
        at += size
    return items[:nm], items[nm:], blobs


def gather(
    rows: Iterable[Sequence[object]], what: str, messages: int = 0, turns: int = 0
) -> tuple[list[bytes], list[bytes], dict[str, bytes]]:
    """A run's messages, completed turns and blobs from its part rows (revision, first
    message, first turn, bundle), oldest first, after the ``messages`` and ``turns``
    stored before them in rows of their own (older layouts). Each row must start where
    the ones before it end (a row missing or out of place is ``CorruptCheckpoint``);
    the first copy of a blob's key is kept."""
    found: tuple[list[bytes], list[bytes]] = ([], [])
    blobs: dict[str, bytes] = {}
    for revision, first_message, first_turn, doc in rows:
        name = f"parts of revision {revision} of {what}"
        at = (messages + len(found[0]), turns + len(found[1]))
        if (first_message, first_turn) != at:
            raise CorruptCheckpoint(
                f"invalid {what}: the {name} start at message {first_message!r} and turn"
                f" {first_turn!r}, after {at[0]} messages and {at[1]} turns"
            )
        m, t, b = unbundle(doc, name)
        found[0].extend(m)
        found[1].extend(t)
        for key, data in b:
            blobs.setdefault(key, data)
    return found[0], found[1], blobs


def assemble(
    messages: Sequence[Sequence[Any]],
    turns: Sequence[Sequence[Any]],
    blobs: dict[str, bytes],
    rows: Iterable[Sequence[object]],
    ends: tuple[int, int],
    what: str,
) -> tuple[list[bytes], list[bytes], dict[str, bytes]]:
    """A run's messages and completed turns up to ``ends`` and its blobs: those of the
    rows of older layouts first (``messages`` and ``turns``: (position, record) in
    order of position, read up to the first position missing: what is after a gap is
    not where it was written), then those of its part ``rows`` (``gather``)."""
    old_messages, old_turns = _leading(messages), _leading(turns)
    new_messages, new_turns, new_blobs = gather(rows, what, len(old_messages), len(old_turns))
    m_end, t_end = ends
    return (
        (old_messages + new_messages)[:m_end],
        (old_turns + new_turns)[:t_end],
        new_blobs | blobs,
    )


def _leading(docs: Sequence[Sequence[Any]]) -> list[bytes]:
    """The records of (position, record) pairs from position 0 up to the first missing."""
    if docs and docs[-1][0] == len(docs) - 1:  # none missing (positions are unique)
        return [d for _, d in docs]
    found: list[bytes] = []
    for i, (pos, doc) in enumerate(docs):
        if pos != i:
            break
        found.append(doc)
    return found
