"""Access to the stored records of a run in a store's own storage, to damage them on purpose.

``check_store(factory, raw=...)`` uses it to check that a damaged record or a missing
commit log entry raises ``CorruptCheckpoint`` instead of being served as data. A
store that is not built in supplies its own ``RawRecords``. Records are named by
``RecordKey``: ``("head", 0)``, ``("entry", revision)``, ``("message", position)``,
``("turn", position)``, ``("blob", key)``; their bytes are as stored (checksum
included). The built-in ones also read and write a record as the document it holds
(``decode``/``encode``: a head, a commit log entry, a message or a turn as the
converter made it), which the check of persisting migrations uses to write a run in
an older shape. Those of the persistent stores also write what a store keeps outside
its checksummed records (``RawCopies``: copies of head fields it indexes or compares
on, the run's lease record), for the check that damage there is seen too.
"""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import zlib
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import CorruptCheckpoint
from statekernel.stores import FileStore, MemoryStore, RedisStore, SQLiteStore, StoredRun
from statekernel.stores._format.checksum import seal, seal_line, unseal, unseal_line
from statekernel.stores._format.dicts import dump_entry, load_entry
from statekernel.stores._format.documents import dump_bytes, load_json

__all__ = [
    "FileRecords",
    "MemoryRecords",
    "RawCopies",
    "RawDocuments",
    "RawRecords",
    "RecordKey",
    "RedisRecords",
    "SQLiteRecords",
]

RecordKey = tuple[str, int | str]
"""The name of a stored record: its kind and its revision, position or blob key."""


class RawRecords(Protocol):
    """Reads and replaces the stored records of a run, below the store's own checks."""

    async def read(self, store: CheckpointStore, run_id: str) -> dict[RecordKey, bytes]:
        """Every stored record of the run, by name, as stored.

        Returns:
            Every record of the run, by name (kind and revision, position or key), as
                stored.
        """
        ...

    async def write(
        self, store: CheckpointStore, run_id: str, key: RecordKey, data: bytes | None
    ) -> None:
        """Replace the record ``key`` with ``data`` as it is, or remove it (None).

        Removing an entry leaves the rest of the run as a store would find it after
        losing that entry (what says how much is stored is adjusted to match).
        """
        ...


@runtime_checkable
class RawDocuments(RawRecords, Protocol):
    """``RawRecords`` that also turn a record's bytes into its document and back."""

    def decode(self, key: RecordKey, data: bytes) -> Any:
        """The document a head, entry, message or turn record holds.

        Returns:
            The record's JSON document.

        Raises:
            CorruptCheckpoint: ``data`` is not a record of that kind (its checksum fails
                or it does not parse).
        """
        ...

    def encode(self, key: RecordKey, doc: Any, like: bytes) -> bytes:
        """``doc`` as the record ``key`` stores it (``like``: the record's bytes now).

        Returns:
            The record's bytes, as the store writes them (checksum included).
        """
        ...


@runtime_checkable
class RawCopies(Protocol):
    """Writes what a store keeps of a run outside its checksummed records.

    ``copies`` names what it can write: ``"run_id"``, ``"revision"`` and ``"state"``
    (copies of head fields the store keeps beside the head, to look up, index or
    compare on) and ``"lease"``
    (the run's lease record). ``lease_kept``: whether the store keeps a run's lease
    record once a lease was taken (so a missing one is damage), rather than letting it
    expire (Redis).
    """

    copies: tuple[str, ...]
    lease_kept: bool

    async def write_copy(
        self, store: CheckpointStore, run_id: str, name: str, value: bytes | None
    ) -> None:
        """Replace the copy ``name`` with ``value`` (as the store keeps it: bytes as they
        are, or the text they decode to as Latin-1 where it keeps text or numbers, so any
        bytes make some value), or remove it (None)."""
        ...


class _Binary:
    """Records stored as checksummed JSON (commit log entries deflated)."""

    def decode(self, key: RecordKey, data: bytes) -> Any:
        """The record's document.

        Returns:
            The record's JSON document.

        Raises:
            CorruptCheckpoint: ``data`` is not a record of that kind (its checksum fails
                or it does not parse).
        """
        what = key[0]
        if what == "entry":
            return load_entry(unseal(data, what), what)
        return load_json(unseal(data, what), what)

    def encode(self, key: RecordKey, doc: Any, like: bytes) -> bytes:
        """``doc`` as the record's bytes.

        Returns:
            The record's bytes, as the store writes them (checksum included).
        """
        return seal(dump_entry(doc) if key[0] == "entry" else dump_bytes(doc))


class MemoryRecords(_Binary):
    """``RawRecords`` of ``memory://`` stores."""

    async def read(self, store: CheckpointStore, run_id: str) -> dict[RecordKey, bytes]:
        """The run's records.

        Returns:
            Every record of the run, by name (kind and revision, position or key), as
                stored.
        """
        found = _memory(store, run_id)
        records: dict[RecordKey, bytes] = {("head", 0): found.head}
        records.update({("entry", i): e for i, e in enumerate(found.entries)})
        records.update({("message", i): m for i, m in enumerate(found.messages)})
        records.update({("turn", i): t for i, t in enumerate(found.turns)})
        records.update({("blob", k): b for k, b in found.blobs.items()})
        return records

    async def write(
        self, store: CheckpointStore, run_id: str, key: RecordKey, data: bytes | None
    ) -> None:
        """Replace or remove one record."""
        found = _memory(store, run_id)
        kind, name = key
        if kind == "head":
            assert data is not None, "the head cannot be removed"
            found.head, found.last = data, None
        elif kind == "blob":
            assert isinstance(name, str)
            if data is None:
                found.blobs.pop(name, None)
            else:
                found.blobs[name] = data
        else:
            assert isinstance(name, int)
            items = {"entry": found.entries, "message": found.messages, "turn": found.turns}[kind]
            if data is None:
                del items[name]
            else:
                items[name] = data


def _memory(store: CheckpointStore, run_id: str) -> StoredRun:
    assert isinstance(store, MemoryStore), f"{store!r} is not a memory store"
    found = store.stored(run_id)
    assert found is not None, f"no run {run_id!r}"
    return found


class SQLiteRecords(_Binary):
    """``RawRecords`` of ``sqlite://`` stores (through a connection of their own); a
    write makes the store forget what it remembers of the run's head."""

    _TABLES: ClassVar[dict[str, tuple[str, str, str]]] = {
        "entry": ("commits", "revision", "entry"),
        "message": ("messages", "pos", "doc"),
        "turn": ("turns", "pos", "doc"),
        "blob": ("blobs", "key", "data"),
    }

    async def read(self, store: CheckpointStore, run_id: str) -> dict[RecordKey, bytes]:
        """The run's records.

        Returns:
            Every record of the run, by name (kind and revision, position or key), as
                stored.
        """
        return await asyncio.to_thread(self._read, _sqlite_path(store), run_id)

    def _read(self, path: str, run_id: str) -> dict[RecordKey, bytes]:
        with _connect(path) as conn:
            rid, head = conn.execute(
                "SELECT id, head FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            records: dict[RecordKey, bytes] = {("head", 0): head}
            for kind, (table, column, value) in self._TABLES.items():
                rows = conn.execute(f"SELECT {column}, {value} FROM {table} WHERE rid = ?", (rid,))
                records.update({(kind, name): data for name, data in rows})
            return records

    async def write(
        self, store: CheckpointStore, run_id: str, key: RecordKey, data: bytes | None
    ) -> None:
        """Replace or remove one record."""
        await asyncio.to_thread(self._write, _sqlite_path(store), run_id, key, data)
        assert isinstance(store, SQLiteStore)
        store.forget(run_id)

    def _write(self, path: str, run_id: str, key: RecordKey, data: bytes | None) -> None:
        kind, name = key
        with _connect(path) as conn:
            if kind == "head":
                conn.execute("UPDATE runs SET head = ? WHERE run_id = ?", (data, run_id))
                return
            (rid,) = conn.execute("SELECT id FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            table, column, value = self._TABLES[kind]
            if data is None:
                conn.execute(f"DELETE FROM {table} WHERE rid = ? AND {column} = ?", (rid, name))
            else:
                conn.execute(
                    f"UPDATE {table} SET {value} = ? WHERE rid = ? AND {column} = ?",
                    (data, rid, name),
                )

    copies: tuple[str, ...] = ("run_id", "revision", "state", "lease")
    lease_kept: bool = True

    async def write_copy(
        self, store: CheckpointStore, run_id: str, name: str, value: bytes | None
    ) -> None:
        """Set a column of the run's ``runs`` row, or its ``leases`` row's token (a
        removed lease: the row deleted)."""
        await asyncio.to_thread(self._write_copy, _sqlite_path(store), run_id, name, value)
        assert isinstance(store, SQLiteStore)
        store.forget(run_id)

    def _write_copy(self, path: str, run_id: str, name: str, value: bytes | None) -> None:
        text = None if value is None else value.decode("latin-1")  # any bytes: some text
        with _connect(path) as conn:
            if name == "lease" and text is None:
                conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))
            elif name == "lease":
                conn.execute("UPDATE leases SET token = ? WHERE run_id = ?", (text, run_id))
            else:
                column = {"run_id": "run_id", "revision": "revision", "state": "state"}[name]
                conn.execute(f"UPDATE runs SET {column} = ? WHERE run_id = ?", (text, run_id))


def _sqlite_path(store: CheckpointStore) -> str:
    assert isinstance(store, SQLiteStore), f"{store!r} is not a SQLite store"
    return store.path


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=10)
    conn.isolation_level = None
    return conn


class FileRecords:
    """``RawRecords`` of ``file://`` stores: lines of the run's log (its last head
    record is the head; the earlier ones are not records of their own)."""

    _KINDS: ClassVar[dict[bytes, str]] = {
        b"c": "entry",
        b"m": "message",
        b"t": "turn",
        b"b": "blob",
        b"z": "blob",
    }

    async def read(self, store: CheckpointStore, run_id: str) -> dict[RecordKey, bytes]:
        """The run's records.

        Returns:
            Every record of the run, by name (kind and revision, position or key), as
                stored.
        """
        records: dict[RecordKey, bytes] = {}
        for key, line in self._lines(_folder(store, run_id)):
            if key[0] != "head" or key[1] == 0:
                records[key] = line
        return records

    def decode(self, key: RecordKey, data: bytes) -> Any:
        """The record's document (a log line holds it third, a head record fourth; an
        entry and a head compressed, in base64).

        Returns:
            The record's JSON document.

        Raises:
            CorruptCheckpoint: ``data`` is not a record of that kind (its checksum fails
                or it does not parse).
        """
        kind = key[0]
        line = load_json(unseal_line(data, kind), kind)
        if kind == "head":
            return load_entry(base64.b64decode(line[3]), kind)
        if kind == "entry":
            return load_entry(base64.b64decode(line[2]), kind)
        return line[2]

    def encode(self, key: RecordKey, doc: Any, like: bytes) -> bytes:
        """``doc`` in the record's line in place of what it holds.

        Returns:
            The record's bytes, as the store writes them (checksum included).
        """
        kind = key[0]
        outer = load_json(unseal_line(like, kind), kind)
        if kind == "head":
            outer[3] = base64.b64encode(dump_entry(doc)).decode()
        elif kind == "entry":
            outer[2] = base64.b64encode(dump_entry(doc)).decode()
        else:
            outer[2] = doc
        return seal_line(dump_bytes(outer))

    def _lines(self, folder: Path) -> list[tuple[RecordKey, bytes]]:
        """Every line with its record key; head records are ``("head", n)``, the last
        one ``("head", 0)``."""
        found: list[tuple[RecordKey, bytes]] = []
        lines = (folder / "log.jsonl").read_bytes().split(b"\n")[:-1]
        heads = sum(1 for line in lines if line.startswith(b'["h",'))
        for line in lines:
            if line.startswith(b'["h",'):
                heads -= 1
                found.append((("head", heads), line))
                continue
            kind, name = load_json(line[:-9], "log line")[:2]
            found.append(((self._KINDS[kind.encode()], name), line))
        return found

    async def write(
        self, store: CheckpointStore, run_id: str, key: RecordKey, data: bytes | None
    ) -> None:
        """Replace or remove one record; the commits are sealed again over their new
        lines (a head record that is not intact is left as it is) and the hint covers
        the new log."""
        folder = _folder(store, run_id)
        lines = [data if k == key else line for k, line in self._lines(folder)]
        log = bytearray()
        at = 0
        head_at = 0
        for line in lines:
            if line is None:
                continue
            if line.startswith(b'["h",'):
                head_at = len(log)
                try:
                    record = load_json(unseal_line(line, "head record"), "head record")
                except CorruptCheckpoint:
                    record = None
                if isinstance(record, list) and len(record) == 4:
                    record[1], record[2] = at, f"{zlib.crc32(log[at:]):08x}"
                    line = seal_line(dump_bytes(record))
                log += line + b"\n"
                at = len(log)
            else:
                log += line + b"\n"
        (folder / "log.jsonl").write_bytes(bytes(log))
        hint = {"v": 4, "sz": len(log), "h": head_at}
        (folder / "head.json").write_bytes(seal_line(dump_bytes(hint)))

    copies: tuple[str, ...] = ("lease",)
    lease_kept: bool = True

    async def write_copy(
        self, store: CheckpointStore, run_id: str, name: str, value: bytes | None
    ) -> None:
        """Replace or remove the run's ``lease.json``."""
        assert name == "lease", f"a file store keeps no copy {name!r}"
        path = _folder(store, run_id) / "lease.json"
        if value is None:
            path.unlink()
        else:
            path.write_bytes(value)


def _folder(store: CheckpointStore, run_id: str) -> Path:
    assert isinstance(store, FileStore), f"{store!r} is not a file store"
    return store.folder(run_id)


class RedisRecords(_Binary):
    """``RawRecords`` of ``redis://`` stores; a write makes the store forget what it
    remembers of the run's head."""

    _LISTS: ClassVar[dict[str, str]] = {"entry": "c", "message": "m", "turn": "t"}

    async def read(self, store: CheckpointStore, run_id: str) -> dict[RecordKey, bytes]:
        """The run's records.

        Returns:
            Every record of the run, by name (kind and revision, position or key), as
                stored.
        """
        assert isinstance(store, RedisStore), f"{store!r} is not a Redis store"
        client: Any = store.client
        records: dict[RecordKey, bytes] = {
            ("head", 0): await client.hget(store.run_key(run_id, "head"), "doc")
        }
        for kind, name in self._LISTS.items():
            items = await client.lrange(store.run_key(run_id, name), 0, -1)
            records.update({(kind, i): item for i, item in enumerate(items)})
        blobs = await client.hgetall(store.run_key(run_id, "b"))
        records.update({("blob", k.decode()): v for k, v in blobs.items()})
        return records

    async def write(
        self, store: CheckpointStore, run_id: str, key: RecordKey, data: bytes | None
    ) -> None:
        """Replace or remove one record (a removed list item moves the later ones up)."""
        assert isinstance(store, RedisStore), f"{store!r} is not a Redis store"
        store.forget(run_id)
        client: Any = store.client
        kind, name = key
        if kind == "head":
            await client.hset(store.run_key(run_id, "head"), "doc", data)
        elif kind == "blob":
            blobs = store.run_key(run_id, "b")
            if data is None:
                await client.hdel(blobs, str(name))
            else:
                await client.hset(blobs, str(name), data)
        else:
            assert isinstance(name, int)
            items = store.run_key(run_id, self._LISTS[kind])
            if data is None:
                await client.lset(items, name, b"\x00removed")
                await client.lrem(items, 1, b"\x00removed")
            else:
                await client.lset(items, name, data)

    copies: tuple[str, ...] = ("revision", "lease")
    lease_kept: bool = False

    async def write_copy(
        self, store: CheckpointStore, run_id: str, name: str, value: bytes | None
    ) -> None:
        """Set the head's revision field ``r``, or the run's lease key (its time to live
        kept; None: the key deleted)."""
        assert isinstance(store, RedisStore), f"{store!r} is not a Redis store"
        store.forget(run_id)
        client: Any = store.client
        if name == "revision":
            await client.hset(store.run_key(run_id, "head"), "r", value)
        elif value is None:
            await client.delete(store.run_key(run_id, "lease"))
        else:
            await client.set(store.run_key(run_id, "lease"), value, keepttl=True)
