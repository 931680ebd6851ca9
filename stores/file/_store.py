"""``file:///path/dir``: one folder per run, append-only JSON lines, one fsync a commit.

A run's folder (0700) holds ``log.jsonl``: messages, turns, blobs and commit log
entries, one JSON array per line, each commit ending with its head record (the
head, where the commit began and the checksum of its lines); a commit is appended
and fsynced, and that fsync is its commit point. Bytes after the last whole commit
are a torn commit that never happened: ignored, and cut off by the next commit.
``head.json`` is a hint replaced after the fsync (temp file and rename, not
fsynced): the length of the log it covers and where its last head record is, for
listings and to tell a torn commit from committed data lost (``stores.file._log``).
The head of a commit made under a lease keeps the run's largest fencing token a commit
carried (``"$f"``), so a lost or deleted ``lease.json`` never restarts the run's tokens.
A ``lock`` file taken with ``flock`` serializes committers across processes;
readers take it shared only to read a commit past the hint. The first commit of a
run also fsyncs the run's folder and the folder above it.

The store refuses (``StoreError`` naming the path and what is wrong, before anything
is written) a store folder or run folder that is a symbolic link, another user's, or
writable by its group or by every user, and any file of a run that is a symbolic
link; a file it writes must be a regular file of its own user with no other hard
link, and the temp files it renames into place are created anew (``stores._private``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs

from statekernel._records.events import Event
from statekernel._records.run import Cancellation, Run, StateId
from statekernel._records.tags import check_tag_filter
from statekernel._storage.closing import Closing
from statekernel._storage.protocol import Checkpoint, DamagedRun, Lease, RunPage, RunSummary
from statekernel.errors import ConfigError, CorruptCheckpoint, RunBusy, RunNotFound, StoreError
from statekernel.stores._common import (
    check_head,
    check_revision,
    checked_events,
    checked_listing,
    checked_revision,
    checked_run_id,
    created_run,
)
from statekernel.stores._format.cancels import (
    AT_REST,
    check_cancellable,
    decode_cancel,
    encode_cancel,
)
from statekernel.stores._format.codec import (
    check_log,
    decode_events,
    decode_run,
    encode_commit,
    head_summary,
    iter_history,
    log_ends,
    replay,
    snapshot_of,
)
from statekernel.stores._host.lease_records import damaged_lease, kept_record
from statekernel.stores._host.owners import (
    Clock,
    HostLeased,
    HostLeases,
    LeaseChange,
    LeaseRecord,
    check_fence,
    fenced,
)
from statekernel.stores._listing import page_of
from statekernel.stores._private import folder_refusal, open_folder
from statekernel.stores.file._cancels import (
    check_cancel,
    drop_cancel,
    read_cancel,
    write_cancel,
)
from statekernel.stores.file._io import (
    Locked,
    RunFolder,
    blob_line,
    entry_line,
    log_lines,
    read_lease,
    write_hint,
    write_lease,
)
from statekernel.stores.file._log import head_record

__all__ = ["FileStore"]

_PLAIN = re.compile(r"[a-z0-9_-][a-z0-9._-]{0,99}")


def folder_name(run_id: str) -> str:
    """A safe folder name for a run id (lowercase ids as is, others hashed after a ``~``)."""
    if _PLAIN.fullmatch(run_id):
        return run_id
    return (
        "~" + hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()
    )


class FileStore(HostLeased, Closing):
    """Runs as folders of append-only files under one directory.

    Leases of owners of this process expire on the monotonic clock, or on ``clock``
    (seconds since the epoch) when given one, such as ``statekernel.testing.ManualClock``.
    """

    def __init__(self, url: str, *, clock: Clock | None = None) -> None:
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path or parts.query:
            raise ConfigError(f"bad file store URL {url!r}: expected file:///path/to/dir")
        self.url = url
        self.root = Path(unquote(parts.path))
        self._leases = HostLeases(self.root / ".owners", self._apply, clock=clock)

    def __repr__(self) -> str:
        return f"FileStore({self.url!r})"

    def folder(self, run_id: str) -> Path:
        """The folder that holds (or would hold) the run's records: ``root`` and the run
        id as is when it is plain lowercase, else a ``~`` and a hash of it."""
        checked_run_id(run_id)
        return self.root / folder_name(run_id)

    def _folder(self, run_id: str) -> RunFolder:
        return RunFolder(self.folder(run_id), self.url, run_id)

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its head, or at ``revision``."""
        checked_revision(run_id, revision)
        return await asyncio.to_thread(self._load, run_id, revision)

    def _load(self, run_id: str, revision: int | None) -> Run:
        folder = self._folder(run_id)
        with folder.snapshot() as snap:
            if snap is None:
                raise RunNotFound(run_id)
            head = _own_head(snap.head, run_id, folder)
            wanted = check_revision(run_id, revision, head["revision"])
            if wanted != head["revision"]:
                entries = [(r, e) for r, e in snap.commits(snapshot_of(wanted)) if r <= wanted]
                head = replay(entries, wanted, what=f"history of {folder.where}")
            m_end, t_end = log_ends(head)
            messages, turns, blobs = snap.parts(m_end, t_end)
            return decode_run(head, messages, turns, blobs, what=folder.where)

    async def history(self, run_id: str) -> AsyncIterator[tuple[Run, list[Event]]]:
        """Every revision with the events of its commit, oldest first (for copying runs)."""
        items = await asyncio.to_thread(lambda: list(self._history(run_id)))
        for item in items:
            yield item

    def _history(self, run_id: str) -> Iterator[tuple[Run, list[Event]]]:
        folder = self._folder(run_id)
        with folder.snapshot() as snap:
            if snap is None:
                raise RunNotFound(run_id)
            head = _own_head(snap.head, run_id, folder)
            m_end, t_end = log_ends(head)
            entries = snap.commits(0)
            messages, turns, blobs = snap.parts(m_end, t_end)
        what = f"history of {folder.where}"
        last = head["revision"]
        yield from iter_history(entries, messages, turns, blobs, run_id, last=last, what=what)

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Append the parts and the head record and fsync, then replace the hint, under
        the run's lock (which also guards its lease)."""
        await asyncio.to_thread(self._commit, checkpoint, lease)

    async def _apply(self, run_id: str, change: LeaseChange) -> LeaseRecord | None:
        return await asyncio.to_thread(self._lease, run_id, change)

    def _lease(self, run_id: str, change: LeaseChange) -> LeaseRecord | None:
        folder = self._folder(run_id)
        with folder.locked(create=False) as state:
            if state is None:
                raise RunNotFound(run_id)
            old = read_lease(folder)
            fence = _fence_of(state.head, run_id, folder)
            floor = old if old is not None and old.token >= fence else fenced(old, fence)
            new = change(floor)
            if new is not None and new != floor:
                write_lease(folder, new)
            return new

    async def create_leased(
        self, checkpoint: Checkpoint, owner: str, *, ttl: float
    ) -> Lease | None:
        """``commit`` of a new run that takes its lease under the same lock of the run
        (``CreatesLeased``); the lease file is written right after the run's log, so a
        failure between them leaves the run without its lease."""
        self._refuse_leases()
        created_run(checkpoint)
        await asyncio.to_thread(self._check_root)

        async def write(change: LeaseChange) -> LeaseRecord | None:
            return await asyncio.to_thread(self._commit, checkpoint, None, change)

        return await self._leases.create(checkpoint.run.run_id, owner, ttl, write)

    def _commit(
        self, cp: Checkpoint, lease: Lease | None, take: LeaseChange | None = None
    ) -> LeaseRecord | None:
        """Land ``cp``; with ``take`` (a new run), its lease record becomes ``take`` of the
        record found (none, or one a deleted run left) and is returned."""
        run = cp.run
        folder = self._folder(run.run_id)
        with folder.locked(create=run.revision == 0) as state:
            if lease is not None:
                check_fence(_fence_record(folder, state, cp), lease, cp.expected_revision)
            prior = None if state is None else _own_head(state.head, run.run_id, folder)
            check_head(cp, None if prior is None else prior["revision"])
            drop = prior is not None and check_cancel(
                folder, run.run_id, prior["state"], cp.cancels
            )
            taken = None if take is None else _take_kept(folder, take)
            enc = encode_commit(cp, prior)
            fence = 0 if state is None else _fence_of(state.head, run.run_id, folder)
            if lease is not None:
                fence = max(fence, int(lease.token))
            if taken is not None:
                fence = max(fence, taken.token)
            head = enc.head if fence == 0 else {**enc.head, FENCE: fence}
            lines = [blob_line(k, v) for k, v in enc.blobs.items()]
            lines += _numbered("m", enc.first_message, enc.messages)
            lines += _numbered("t", enc.first_turn, enc.turns)
            lines.append(entry_line(run.revision, enc.entry))
            at = 0 if state is None else state.size
            body = log_lines(lines)
            record = head_record(at, body, head)
            size = folder.append(at, body + record, first=state is None)
            write_hint(folder, size, size - len(record))
            if drop:
                drop_cancel(folder)
            if taken is not None:
                write_lease(folder, taken)
            return taken

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Persisted events of the revisions after ``after_revision``."""
        after_revision, limit = checked_events(run_id, after_revision, limit)
        return await asyncio.to_thread(self._events, run_id, after_revision, limit)

    def _events(self, run_id: str, after: int, limit: int | None) -> list[Event]:
        folder = self._folder(run_id)
        with folder.snapshot() as snap:
            if snap is None:
                raise RunNotFound(run_id)
            head = _own_head(snap.head, run_id, folder)
            what = f"events of {folder.where}"
            entries = snap.commits(after + 1)
            check_log(entries, max(after + 1, 0), head["revision"], what)
            found = decode_events(entries, run_id, what=what)
        return found if limit is None else found[:limit]

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        """Runs, newest update first (reads every run's head)."""
        limit = checked_listing(state, updated_after, limit, cursor)
        wanted = check_tag_filter(tags)
        damaged: list[DamagedRun] = []
        summaries = await asyncio.to_thread(lambda: list(self._summaries(damaged)))
        page = page_of(
            summaries,
            state=state,
            updated_after=updated_after,
            limit=limit,
            cursor=cursor,
            tags=wanted,
        )
        return attrs.evolve(page, damaged=tuple(damaged))

    def _summaries(self, damaged: list[DamagedRun]) -> Iterator[RunSummary]:
        try:
            root_fd = open_folder(self.root)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"file store {str(self.root)!r}: {exc}") from exc
        try:
            names = sorted(os.listdir(root_fd))
        except OSError as exc:
            raise StoreError(f"file store {str(self.root)!r}: {exc}") from exc
        finally:
            os.close(root_fd)
        for name in names:
            if name.startswith("."):
                continue
            folder = RunFolder(self.root / name, self.url)
            refusal = folder_refusal(folder.path)
            if refusal is not None:  # a folder the store will not read: named, not followed
                damaged.append(DamagedRun(name, str(refusal)))
                continue
            try:
                head = folder.head()
                if head is not None:
                    yield head_summary(head, what=f"head in {folder.path}")
            except CorruptCheckpoint as exc:
                damaged.append(DamagedRun(name, str(exc)))  # a hashed id: its folder

    async def request_cancel(self, run_id: str, request: Cancellation) -> Cancellation | None:
        """Keep ``request`` unless a request is kept already (``CancelsRuns``), under the
        run's lock."""
        checked_run_id(run_id)
        data = encode_cancel(request)
        kept = await asyncio.to_thread(self._request_cancel, run_id, data)
        return None if kept is None else decode_cancel(kept, run_id, self.url)

    def _request_cancel(self, run_id: str, data: bytes) -> bytes | None:
        folder = self._folder(run_id)
        with folder.locked(create=False) as state:
            if state is None:
                raise RunNotFound(run_id)
            head = _own_head(state.head, run_id, folder)
            kept = read_cancel(folder)
            if kept is not None and head.get("state") not in AT_REST:
                return kept
            check_cancellable(run_id, str(head.get("state")))
            write_cancel(folder, data)
            return None

    async def cancel_request(self, run_id: str) -> Cancellation | None:
        """The run's kept cancel request (``CancelsRuns``)."""
        checked_run_id(run_id)
        folder = self._folder(run_id)
        kept = await asyncio.to_thread(read_cancel, folder)
        return None if kept is None else decode_cancel(kept, run_id, folder.where)

    async def delete(self, run_id: str) -> bool:
        """Remove the run's folder (renamed aside under its lock, then deleted)."""
        checked_run_id(run_id)
        return await asyncio.to_thread(self._delete, run_id)

    def _delete(self, run_id: str) -> bool:
        folder = self._folder(run_id)
        grave = self.root / f".deleted-{uuid.uuid4().hex}"
        with folder.locked(create=False) as state:
            if state is None:
                return False
            try:
                os.rename(folder.path, grave)
            except OSError as exc:
                raise StoreError(f"cannot delete {str(folder.path)!r}: {exc}") from exc
        shutil.rmtree(grave, ignore_errors=True)
        return True

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        """Take the run's lease (see ``HostLeased.acquire``), once the store's folder is
        found trustworthy: nothing is written under a folder the store refuses."""
        await asyncio.to_thread(self._check_root)
        return await super().acquire(run_id, owner, ttl=ttl)

    def _check_root(self) -> None:
        """Raise ``StoreError`` when the store's folder is one it refuses (a symbolic
        link, another user's, writable by its group or every user)."""
        try:
            os.close(open_folder(self.root))
        except (FileNotFoundError, NotADirectoryError):
            return  # no run here: the lease's own step says so
        except OSError as exc:
            raise StoreError(f"file store {str(self.root)!r}: {exc}") from exc

    async def aclose(self) -> None:
        """Release the owner locks of this process (nothing else stays open)."""
        self._leases.close()


FENCE = "$f"
"""The key of a stored head that keeps the run's largest fencing token a commit carried
(layout 5): read apart from the head, so a lease file lost or deleted by hand never
restarts the run's tokens."""


def _own_head(head: Any, run_id: str, folder: RunFolder) -> dict[str, Any]:
    """The run's stored head, without the fence it keeps (``_fence_of``)."""
    if (
        not isinstance(head, dict)
        or head.get("run_id") != run_id
        or type(head.get("revision")) is not int
    ):
        named = head.get("run_id") if isinstance(head, dict) else None
        raise CorruptCheckpoint(
            f"invalid head in {folder.path}: not a head of run {run_id!r} (it names {named!r})"
        )
    if FENCE in head:
        return {k: v for k, v in head.items() if k != FENCE}
    return head


def _fence_of(head: Any, run_id: str, folder: RunFolder) -> int:
    """The largest fencing token a commit of the run carried (0: none), from its head."""
    fence = head.get(FENCE, 0) if isinstance(head, dict) else 0
    if type(fence) is not int or fence < 0:
        raise damaged_lease(run_id, folder.where, f"its head keeps the fence {fence!r}")
    return fence


def _fence_record(folder: RunFolder, state: Locked | None, cp: Checkpoint) -> LeaseRecord | None:
    """The run's lease record for a commit fenced by a lease on it: missing while the
    run is at the revision the commit expects, it is damage."""
    record = read_lease(folder)
    if record is None and state is not None:
        stored = _own_head(state.head, cp.run.run_id, folder)["revision"]
        current = stored == cp.expected_revision
        return kept_record(None, cp.run.run_id, folder.where, expected=current)
    return record


def _numbered(kind: str, first: int, docs: tuple[bytes, ...]) -> list[bytes]:
    prefix = f'["{kind}",'.encode()
    return [b"%s%d,%s]" % (prefix, first + i, d) for i, d in enumerate(docs)]


def _take_kept(folder: RunFolder, take: LeaseChange) -> LeaseRecord | None:
    """``take`` of the lease file a deleted run of that id left (or of none); None when
    its owner may still hold it (the run is created without its lease)."""
    try:
        return take(read_lease(folder))
    except RunBusy:
        return None
