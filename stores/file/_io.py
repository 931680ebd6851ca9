"""Crash-safe file operations of the file store: lock, append, the head hint, snapshot reads."""

from __future__ import annotations

import base64
import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from statekernel.errors import CorruptCheckpoint, StoreError
from statekernel.stores._format.blobs import blob_text
from statekernel.stores._format.checksum import seal_line, unseal_line
from statekernel.stores._format.dicts import dump_entry, load_entry
from statekernel.stores._format.documents import dump_bytes, load_json
from statekernel.stores._host import oslock as _oslock
from statekernel.stores._host.lease_records import damaged_lease, host_record
from statekernel.stores._host.owners import LeaseRecord
from statekernel.stores._private import (
    FOLDER_MODE,
    new_private_file,
    open_folder,
    open_own_file,
    private_folder,
    refused_file,
    remove_leftover,
    write_private,
)
from statekernel.stores.file._log import (
    LAYOUT_VERSION,
    Committed,
    Hint,
    find_committed,
    hint_bytes,
    parse_hint,
    record_name,
)

__all__ = [
    "LAYOUT_VERSION",
    "Locked",
    "RunFolder",
    "Snapshot",
    "blob_line",
    "entry_line",
    "log_lines",
    "read_lease",
    "write_hint",
    "write_lease",
]

HEAD = "head.json"
LOG = "log.jsonl"
LOCK = "lock"
LEASE = "lease.json"
HEAD_TMP = HEAD + ".tmp"
LEASE_TMP = LEASE + ".tmp"


@attrs.frozen
class Locked:
    """A run's committed head and log length, read under its lock."""

    head: dict[str, Any]
    size: int


def blob_line(key: str, data: bytes) -> bytes:
    """The log record of a blob: ``["b", key, text]``, or ``["z", key, base64]`` when zipped."""
    if data[:2] == b"\x00z":
        return b'["z","%s","%s"]' % (key.encode(), base64.b64encode(data[2:]))
    return dump_bytes(["b", key, blob_text(data)])


def entry_line(revision: int, entry: dict[str, Any]) -> bytes:
    """The log record of a commit log entry: ``["c", revision, base64 of the stored entry]``."""
    return b'["c",%d,"%s"]' % (revision, base64.b64encode(dump_entry(entry)))


def log_lines(records: list[bytes]) -> bytes:
    """Log records as the lines appended to the log, each ending with its checksum."""
    return b"".join([seal_line(r) + b"\n" for r in records])


@attrs.define
class Snapshot:
    """The head and the committed part of the log of one run, read together (its head
    records are checked like every line and otherwise skipped)."""

    head: dict[str, Any]
    log: bytes
    where: str
    _kinds: dict[bytes, list[bytes]] | None = None

    def _lines(self, kind: bytes) -> list[bytes]:
        """The log lines of one kind (``b"m"``, ``b"t"``, ``b"b"``, ``b"z"``, ``b"c"``)."""
        if self._kinds is None:
            kinds: dict[bytes, list[bytes]] = {}
            for number, line in enumerate(self.log.split(b"\n")[:-1], 1):
                body = line[:-9]
                what = f"{record_name(body, number)} of {self.where}"
                body = unseal_line(line, what)
                if body[:2] == b'["' and body[3:5] == b'",':
                    if body[2:3] != b"h":
                        kinds.setdefault(body[2:3], []).append(body)
                else:
                    raise CorruptCheckpoint(f"invalid {what}: not a log record")
            self._kinds = kinds
        return self._kinds.get(kind, [])

    def _parse(self, lines: list[bytes], what: str) -> list[Any]:
        parsed = load_json(b"[" + b",".join(lines) + b"]", f"{what} in {self.where}")
        return parsed  # type: ignore[no-any-return]

    def commits(self, first: int) -> list[tuple[int, Any]]:
        """Commit log entries of revisions ``first`` and later, in order."""
        chosen = [ln for ln in self._lines(b"c") if _revision(ln) >= first]
        what = f"commit log in {self.where}"
        found: list[tuple[int, Any]] = []
        for _, rev, packed in self._parse(chosen, "commit log"):
            try:
                entry = load_entry(base64.b64decode(packed, validate=True), what)
            except (ValueError, TypeError) as exc:
                raise CorruptCheckpoint(f"invalid {what}: {exc}") from exc
            found.append((rev, entry))
        return found

    def parts(self, m_end: int, t_end: int) -> tuple[list[Any], list[Any], dict[str, Any]]:
        """Messages and turns (positions from 0) and the blobs of the run."""
        messages = self._numbered(b"m", m_end, "messages")
        turns = self._numbered(b"t", t_end, "turns")
        blobs: dict[str, Any] = {}
        for _, key, text in self._parse(self._lines(b"b"), "blobs"):
            blobs.setdefault(key, text)
        try:
            for _, key, packed in self._parse(self._lines(b"z"), "blobs"):
                if key not in blobs:
                    blobs[key] = b"\x00z" + base64.b64decode(packed, validate=True)
        except (ValueError, TypeError) as exc:
            raise CorruptCheckpoint(f"invalid blobs in {self.where}: {exc}") from exc
        return messages, turns, blobs

    def _numbered(self, kind: bytes, end: int, what: str) -> list[Any]:
        rows = self._parse(self._lines(kind), what)[:end]
        if [pos for _, pos, _ in rows] != list(range(end)):
            raise CorruptCheckpoint(f"invalid {what} in {self.where}: positions do not match")
        return [doc for _, _, doc in rows]


def _revision(line: bytes) -> int:
    end = line.index(b",", 5)
    return int(line[5:end])


_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
"""How the store opens a file to read it: never through a symbolic link, never
waiting on a FIFO in its place (``O_NONBLOCK`` changes nothing on a regular file)."""


def _opener(dir_fd: int) -> Any:
    return lambda name, flags: os.open(name, flags | _READ, dir_fd=dir_fd)


@attrs.frozen
class RunFolder:
    """The folder of one run (``run_id`` names it in errors, when known).

    The store's folder and the run's are opened without following a symbolic link and
    refused (``StoreError`` naming the folder and what is wrong) when they are another
    user's or writable by their group or by every user; every file of the run is
    opened in its open folder, never through a symbolic link, and a file the store
    writes must be a regular file of its own user with no other hard link
    (``stores._private``). A refusal comes before anything of the commit is written.
    """

    path: Path
    url: str
    run_id: str | None = None

    @property
    def where(self) -> str:
        """The run and its folder, for error messages."""
        if self.run_id is None:
            return str(self.path)
        return f"run {self.run_id!r} in {str(self.path)!r}"

    def _fail(self, what: str, exc: OSError) -> StoreError:
        return StoreError(f"file store {str(self.path)!r}: cannot {what}: {exc}")

    def _error(self, name: str, what: str, exc: OSError) -> StoreError:
        """``exc``, raised opening the file ``name`` of the run, as a ``StoreError``."""
        if exc.errno == errno.ELOOP:
            return refused_file(self.path / name, "is a symbolic link")
        return self._fail(what, exc)

    def _read(self, dir_fd: int, name: str, what: str) -> bytes | None:
        """The bytes of the run's file ``name``, or None when there is none."""
        try:
            with open(name, "rb", opener=_opener(dir_fd)) as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._error(name, what, exc) from exc

    def read_file(self, name: str, what: str) -> bytes | None:
        """The bytes of the run's file ``name`` (``what``: reading it, in errors), or None
        when there is none or no run folder."""
        with self._opened() as dir_fd:
            return None if dir_fd is None else self._read(dir_fd, name, what)

    def _own_file(self, dir_fd: int, name: str, flags: int, what: str) -> int:
        """The run's file ``name`` opened with ``flags`` to write or lock (``open_own_file``)."""
        try:
            return open_own_file(dir_fd, name, flags, self.path / name)
        except OSError as exc:
            raise self._fail(what, exc) from exc

    def _hint(self, dir_fd: int) -> Hint | str | None:
        data = self._read(dir_fd, HEAD, "read the head file")
        return None if data is None else parse_hint(data, str(self.path / HEAD))

    @contextlib.contextmanager
    def _log(self, dir_fd: int) -> Iterator[_Log]:
        try:
            fd = os.open(LOG, _READ, dir_fd=dir_fd)
        except FileNotFoundError:
            yield _Log(None)
            return
        except OSError as exc:
            raise self._error(LOG, "open the log", exc) from exc
        try:
            yield _Log(fd)
        finally:
            os.close(fd)

    def _committed(self, dir_fd: int, log: _Log, *, locked: bool) -> Committed | None:
        """The committed part of the log. A commit past the hint (being written, or
        left by a committer that stopped before its hint) is served only when no
        committer holds the lock, after an fsync: never a commit not yet on disk."""
        try:
            hint = self._hint(dir_fd)  # before the log's size: a commit landing between the
            size = log.size()  # two then only adds bytes past the hint, never hints past them
            found = find_committed(log.read, size, hint, self.where, str(self.path / LOG))
            if found is None or found.settled:
                return found
            if not locked:
                with self._shared_lock(dir_fd):
                    return self._committed(dir_fd, log, locked=True)
            if log.fd is not None:
                os.fsync(log.fd)
            return found
        except OSError as exc:
            raise self._fail("read the log", exc) from exc

    @contextlib.contextmanager
    def _shared_lock(self, dir_fd: int) -> Iterator[None]:
        """The run's lock, shared: no committer is between its append and its hint."""
        try:
            fd = os.open(LOCK, _READ | _oslock.SHARED_ACCESS, dir_fd=dir_fd)
        except FileNotFoundError:
            yield
            return
        except OSError as exc:
            raise self._error(LOCK, "open the lock", exc) from exc
        try:
            _oslock.lock(fd, shared=True)
            yield
        finally:
            _oslock.close(fd)

    def _open_folder(self, *, create: bool) -> int | None:
        """The run's folder, open, after the store's folder and it are found trustworthy;
        None when either is not there (``create``: both are made, 0700)."""
        root = self.path.parent
        try:
            if create:
                private_folder(root)
            root_fd = open_folder(root)
        except (FileNotFoundError, NotADirectoryError) as exc:
            if create:
                raise self._fail("create the run folder", exc) from exc
            return None
        except OSError as exc:
            raise self._fail("create the run folder" if create else "open the store", exc) from exc
        try:
            while True:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(self.path.name, FOLDER_MODE, dir_fd=root_fd)
                try:
                    return open_folder(self.path, dir_fd=root_fd)
                except FileNotFoundError:
                    if not create:
                        return None  # else: deleted meanwhile, made again
                except NotADirectoryError as exc:
                    if create:
                        raise self._fail("create the run folder", exc) from exc
                    return None
        except OSError as exc:
            what = "create the run folder" if create else "open the run folder"
            raise self._fail(what, exc) from exc
        finally:
            os.close(root_fd)

    @contextlib.contextmanager
    def _opened(self, *, create: bool = False) -> Iterator[int | None]:
        dir_fd = self._open_folder(create=create)
        if dir_fd is None:
            yield None
            return
        try:
            yield dir_fd
        finally:
            os.close(dir_fd)

    @contextlib.contextmanager
    def held(self) -> Iterator[int]:
        """The run's folder, open, while its lock is held (so it is there)."""
        with self._opened() as dir_fd:
            if dir_fd is None:
                raise StoreError(f"file store {str(self.path)!r}: the run folder is gone")
            yield dir_fd

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Snapshot | None]:
        """The head and the log it covers, or None when there is no run here."""
        with self._opened() as dir_fd:
            if dir_fd is None:
                yield None
                return
            with self._log(dir_fd) as log:
                found = self._committed(dir_fd, log, locked=False)
                if found is None:
                    yield None
                    return
                try:
                    data = log.read(0, found.size)
                except OSError as exc:
                    raise self._fail("read the log", exc) from exc
            yield Snapshot(found.head, data, self.where)

    def head(self) -> dict[str, Any] | None:
        """The head of the run's last commit (checked, its parts not read), or None
        when there is no run here."""
        with self._opened() as dir_fd:
            if dir_fd is None:
                return None
            with self._log(dir_fd) as log:
                found = self._committed(dir_fd, log, locked=False)
        return None if found is None else found.head

    @contextlib.contextmanager
    def locked(self, *, create: bool) -> Iterator[Locked | None]:
        """Hold the run's lock; yields its committed head, or None when there is no run."""
        while True:
            with self._opened(create=create) as dir_fd:
                if dir_fd is None:
                    yield None
                    return
                fd = self._own_file(dir_fd, LOCK, os.O_RDWR | os.O_CREAT, "open the lock")
                try:
                    _oslock.lock(fd)
                    if not self._still_here(dir_fd):
                        if create:
                            continue
                        yield None
                        return
                    with self._log(dir_fd) as log:
                        found = self._committed(dir_fd, log, locked=True)
                    yield None if found is None else Locked(found.head, found.size)
                    return
                finally:
                    _oslock.close(fd)

    def _still_here(self, dir_fd: int) -> bool:
        """Whether the open folder is still the run's (not renamed aside by a delete)."""
        try:
            found = os.lstat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise self._fail("open the run folder", exc) from exc
        here = os.fstat(dir_fd)
        return (found.st_dev, found.st_ino) == (here.st_dev, here.st_ino)

    def append(self, committed: int, data: bytes, *, first: bool) -> int:
        """Cut the log to its committed length, append ``data`` (a commit ending with its
        head record), fsync: the commit point. The first commit of a run also fsyncs
        the run's folder and the store's (a folder left by a first commit that never
        landed may not be on disk either). Returns the new length.

        Before anything is written, a temp file of the hint left by a committer that
        stopped is removed, and refused (``StoreError``) unless provably the store's
        own; so is a log that is not (a symbolic link, another user's, hard linked)."""
        with self.held() as dir_fd:
            try:
                remove_leftover(dir_fd, HEAD_TMP, self.path / HEAD_TMP)
            except OSError as exc:
                raise self._fail("remove the head file's temp file", exc) from exc
            fd = self._own_file(dir_fd, LOG, os.O_WRONLY | os.O_CREAT, "open the log")
            try:
                size = os.fstat(fd).st_size
                if size < committed:
                    raise CorruptCheckpoint(
                        f"invalid log {str(self.path / LOG)!r}: {size} of {committed}"
                        " committed bytes"
                    )
                if size > committed:
                    os.ftruncate(fd, committed)
                end = _write_all(fd, data, committed)
                try:
                    os.fsync(fd)
                except OSError:
                    with contextlib.suppress(OSError):  # not on disk: not a commit
                        os.ftruncate(fd, committed)
                    raise
                if first:  # the log's name in the run's folder, the folder's in the store's
                    os.fsync(dir_fd)
                    _fsync_dir(self.path.parent)
                return end
            except OSError as exc:
                raise self._fail("append to the log", exc) from exc
            finally:
                os.close(fd)


@attrs.frozen
class _Log:
    """The run's log, open for reading (None: there is none)."""

    fd: int | None

    def size(self) -> int:
        return 0 if self.fd is None else os.fstat(self.fd).st_size

    def read(self, start: int, end: int) -> bytes:
        if self.fd is None or end <= start:
            return b""
        parts: list[bytes] = []
        while start < end:
            part = os.pread(self.fd, end - start, start)
            if not part:
                break
            parts.append(part)
            start += len(part)
        return b"".join(parts)


def write_hint(folder: RunFolder, size: int, head_at: int) -> None:
    """Replace ``head.json`` (a new temp file and rename, not fsynced: a hint, see
    ``_log``), under the run's lock. The commit is on disk already; a hint that cannot
    be written is left stale."""
    with contextlib.suppress(OSError, StoreError), folder.held() as dir_fd:
        fd = new_private_file(dir_fd, HEAD_TMP, folder.path / HEAD_TMP)
        try:
            _write_all(fd, hint_bytes(size, head_at), 0)
        finally:
            os.close(fd)
        os.replace(HEAD_TMP, HEAD, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _write_all(fd: int, data: bytes, offset: int) -> int:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
    return offset


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lease(folder: RunFolder) -> LeaseRecord | None:
    """The run's lease (read under the run's lock), or None when it never had one."""
    path = folder.path / LEASE
    data = folder.read_file(LEASE, "read the lease")
    if data is None:
        return None
    run_id = folder.run_id or folder.path.name  # a folder not named by its run: its name
    where = f"file {str(path)!r}"
    try:
        doc = load_json(data, f"lease file {str(path)!r}")
    except CorruptCheckpoint:
        raise damaged_lease(run_id, where, "it is not JSON") from None
    if not isinstance(doc, list):
        raise damaged_lease(run_id, where, "it is not a list (token, owner, expiry)")
    return host_record(doc, run_id, where)


def write_lease(folder: RunFolder, record: LeaseRecord) -> None:
    """Replace the run's lease (under the run's lock) with a new file renamed over it.
    Not fsynced: a power loss ends every owner on the host, and with them every lease."""
    data = dump_bytes([record.token, record.owner, record.expires])
    try:
        with folder.held() as dir_fd:
            write_private(dir_fd, LEASE_TMP, data, folder.path / LEASE_TMP)
            os.replace(LEASE_TMP, LEASE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        raise StoreError(f"file store {str(folder.path)!r}: cannot write the lease: {exc}") from exc
