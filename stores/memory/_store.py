"""``memory://``: an in-process store for tests and throwaway runs, in the stored format.

A run is kept as the persistent stores keep it (``statekernel.stores._format.codec``): a head
document, the commit log (one entry per revision, with the commit's events), the
message and turn logs and the blobs, each as checksummed bytes (``stores._format.checksum``).
So every test that uses ``memory://`` goes through the one stored format, and a
load gives a run decoded from bytes, sharing nothing with the committed objects.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from statekernel._records.events import Event
from statekernel._records.run import Cancellation, Run, StateId
from statekernel._records.tags import check_tag_filter
from statekernel._storage.closing import Closing
from statekernel._storage.protocol import Checkpoint, DamagedRun, Lease, RunPage, RunSummary
from statekernel.errors import ConflictError, CorruptCheckpoint, RunBusy, RunNotFound
from statekernel.stores._common import (
    check_revision,
    checked_events,
    checked_listing,
    checked_revision,
    checked_run_id,
    created_run,
)
from statekernel.stores._format.cancels import (
    cancel_requested,
    check_cancellable,
    decode_cancel,
    encode_cancel,
)
from statekernel.stores._format.checksum import seal, unseal, unseal_blobs, unseal_each
from statekernel.stores._format.codec import (
    check_log,
    check_parts,
    check_run_id,
    decode_events,
    decode_run,
    encode_commit,
    head_summary,
    log_ends,
    replay,
    snapshot_of,
)
from statekernel.stores._format.dicts import dump_entry, load_entry
from statekernel.stores._format.documents import dump_bytes, load_json
from statekernel.stores._host.holders import holder_of
from statekernel.stores._host.owners import (
    Clock,
    HostLeased,
    HostLeases,
    LeaseChange,
    LeaseRecord,
    check_fence,
)
from statekernel.stores._listing import page_of

__all__ = ["MemoryStore", "StoredRun"]


@attrs.define
class StoredRun:
    """The stored records of one run, as bytes that end with their checksum.

    ``entries[r]`` is the commit log entry of revision ``r``; ``messages`` and
    ``turns`` are the message and turn logs; ``blobs`` maps keys to blob bytes.
    """

    revision: int
    head: bytes
    entries: list[bytes]
    messages: list[bytes]
    turns: list[bytes]
    blobs: dict[str, bytes]
    lease: LeaseRecord | None = None
    cancel: bytes | None = None
    """The run's cancel request (``CancelsRuns``), as kept."""
    last: tuple[dict[str, Any], frozenset[str]] | None = None
    """The head document of ``revision`` and the blobs it references, as last written."""


class _Runs(dict[str, StoredRun]):
    """The runs of one memory store, by id (a class of its own so it can be weakly held)."""


_named: weakref.WeakValueDictionary[str, _Runs] = weakref.WeakValueDictionary()
"""The runs of each ``memory://NAME`` while some store of that name holds them."""


class MemoryStore(HostLeased, Closing):
    """Keeps every revision of every run in memory, in the stored format.

    Messages and completed turns are stored once in append-only logs the heads
    point into, so memory grows with the change, not with the number of revisions
    times the transcript. Stores opened with the same ``memory://NAME`` URL in one
    process share data while any of them is alive; once the last one is gone, so
    is the data. Leases expire on the monotonic clock, or on ``clock`` (seconds since
    the epoch) when given one, such as ``statekernel.testing.ManualClock``.
    """

    settles_on_cancel = True
    """A commit runs without awaiting, so a cancelled caller leaves nothing in flight."""

    def __init__(self, name: str = "", *, clock: Clock | None = None) -> None:
        self.url = f"memory://{name}"
        self._runs = _named.setdefault(name, _Runs()) if name else _Runs()
        self._leases = HostLeases(None, self._apply, clock=clock)

    def __repr__(self) -> str:
        return f"MemoryStore({self.url!r})"

    def stored(self, run_id: str) -> StoredRun | None:
        """The stored records of a run (for inspection, and for tests that damage them)."""
        return self._runs.get(run_id)

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its head, or at ``revision``."""
        checked_revision(run_id, revision)
        entry = self._entry(run_id)
        what = f"run {run_id!r} in {self.url}"
        head = _head(entry.head, what)
        check_run_id(head, run_id, what)
        wanted = check_revision(run_id, revision, entry.revision)
        if wanted != entry.revision:
            first = snapshot_of(wanted)
            docs = _entries(entry.entries[first : wanted + 1], first, what)
            head = replay(docs, wanted, what=what)
        m_end, t_end = log_ends(head)
        check_parts((m_end, t_end), len(entry.messages), len(entry.turns), what)
        messages = unseal_each(entry.messages[:m_end], f"message of {what}")  # parsed as decoded
        turns = unseal_each(entry.turns[:t_end], f"completed turn of {what}")
        blobs = unseal_blobs(entry.blobs, what)
        return decode_run(head, messages, turns, blobs, what=what)

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Append the new head, parts and events if the head is the expected revision
        (and ``lease`` is the run's current lease)."""
        run = checkpoint.run
        entry = self._runs.get(run.run_id)
        if lease is not None:
            check_fence(None if entry is None else entry.lease, lease, checkpoint.expected_revision)
        actual = None if entry is None else entry.revision
        expected = checkpoint.expected_revision if run.revision > 0 else None
        if actual != expected or (entry is None and run.revision != 0):
            raise ConflictError(run.run_id, checkpoint.expected_revision, actual)
        if entry is not None and entry.cancel is not None and not checkpoint.cancels:
            raise cancel_requested(run.run_id, entry.cancel, self.url)
        if entry is None:
            enc = encode_commit(checkpoint, None)
        else:
            what = f"run {run.run_id!r} in {self.url}"
            prior, refs = entry.last or (_head(entry.head, what), None)
            enc = encode_commit(checkpoint, prior, refs)
            if enc.first_message != len(entry.messages) or enc.first_turn != len(entry.turns):
                raise CorruptCheckpoint(f"invalid {what}: logs do not match its head")
        head = seal(dump_bytes(enc.head))
        if entry is None:
            entry = self._runs[run.run_id] = StoredRun(run.revision, head, [], [], [], {})
        entry.revision, entry.head, entry.last = run.revision, head, (enc.head, enc.refs)
        if checkpoint.cancels:
            entry.cancel = None
        entry.entries.append(seal(dump_entry(enc.entry)))
        entry.messages += [seal(m) for m in enc.messages]
        entry.turns += [seal(t) for t in enc.turns]
        for key, data in enc.blobs.items():
            entry.blobs.setdefault(key, seal(data))

    async def create_leased(
        self, checkpoint: Checkpoint, owner: str, *, ttl: float
    ) -> Lease | None:
        """``commit`` of a new run that takes its lease right after it landed, with
        nothing awaited in between (``CreatesLeased``). Through ``commit``, as
        ``commit_and_release``; should an override of it let another owner take the
        lease meanwhile, the run is created without it (None)."""
        created_run(checkpoint)
        run_id = checkpoint.run.run_id

        async def write(change: LeaseChange) -> LeaseRecord | None:
            await self.commit(checkpoint)
            entry = self._entry(run_id)
            try:
                entry.lease = change(entry.lease)
            except RunBusy:
                return None
            return entry.lease

        return await self._leases.create(run_id, owner, ttl, write)

    async def commit_and_release(self, checkpoint: Checkpoint, *, lease: Lease) -> None:
        """``commit``, then ``release``, with nothing in between (``ReleasesWithCommit``):
        neither awaits anything. Through ``commit``, so a subclass that overrides it (to
        record or damage commits) sees this one too."""
        await self.commit(checkpoint, lease=lease)
        await self._leases.release(lease)

    async def request_cancel(self, run_id: str, request: Cancellation) -> Cancellation | None:
        """Keep ``request`` unless a request is kept already (``CancelsRuns``)."""
        checked_run_id(run_id)
        entry = self._entry(run_id)
        if entry.cancel is not None:
            return decode_cancel(entry.cancel, run_id, self.url)
        data = encode_cancel(request)
        head = head_summary(_head(entry.head, f"run {run_id!r} in {self.url}"), what=self.url)
        check_cancellable(run_id, head.state)
        entry.cancel = data
        return None

    async def cancel_request(self, run_id: str) -> Cancellation | None:
        """The run's kept cancel request (``CancelsRuns``)."""
        checked_run_id(run_id)
        entry = self._runs.get(run_id)
        if entry is None or entry.cancel is None:
            return None
        return decode_cancel(entry.cancel, run_id, self.url)

    def _entry(self, run_id: str) -> StoredRun:
        entry = self._runs.get(run_id)
        if entry is None:
            raise RunNotFound(run_id)
        return entry

    async def _apply(self, run_id: str, change: LeaseChange) -> LeaseRecord | None:
        entry = self._entry(run_id)
        entry.lease = change(entry.lease)
        return entry.lease

    async def holder(self, run_id: str) -> str | None:
        """The live owner holding the run's lease, or None (``ShowsHolders``)."""
        checked_run_id(run_id)
        record = self._entry(run_id).lease
        return holder_of(record, self._leases.clock(), self._leases.proofs)

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Persisted events after ``after_revision``."""
        after_revision, limit = checked_events(run_id, after_revision, limit)
        entry = self._entry(run_id)
        what = f"events of run {run_id!r} in {self.url}"
        first = max(after_revision + 1, 0)
        found: list[Event] = []
        while first < len(entry.entries) and (limit is None or len(found) < limit):
            docs = _entries(entry.entries[first : first + 256], first, what)
            check_log(docs, first, None, what)
            found += decode_events(docs, run_id, what=what)
            first += len(docs)
        if limit is None or len(found) < limit:
            check_log([], first, entry.revision, what)
        return found if limit is None else found[:limit]

    async def run_ids(self, prefix: str, *, limit: int) -> list[str]:
        """The ids of at most ``limit`` runs starting with ``prefix`` (``FindsRunIds``)."""
        return sorted(r for r in self._runs if r.startswith(prefix))[: max(limit, 0)]

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        """Runs, newest update first."""
        limit = checked_listing(state, updated_after, limit, cursor)
        wanted = check_tag_filter(tags)
        what = f"run head in {self.url}"
        summaries: list[RunSummary] = []
        damaged: list[DamagedRun] = []
        for run_id, entry in self._runs.items():
            try:
                summaries.append(head_summary(_head(entry.head, what), what=what))
            except CorruptCheckpoint as exc:
                damaged.append(DamagedRun(run_id, str(exc)))
        page = page_of(
            summaries,
            state=state,
            updated_after=updated_after,
            limit=limit,
            cursor=cursor,
            tags=wanted,
        )
        return attrs.evolve(page, damaged=tuple(damaged))

    async def delete(self, run_id: str) -> bool:
        """Forget a run entirely."""
        checked_run_id(run_id)
        return self._runs.pop(run_id, None) is not None

    async def aclose(self) -> None:
        """Nothing to release."""


def _head(data: bytes, what: str) -> dict[str, Any]:
    head = load_json(unseal(data, f"head of {what}"), what)
    if not isinstance(head, dict):
        raise CorruptCheckpoint(f"invalid {what}: the head is not an object")
    return head


def _entries(items: list[bytes], first: int, what: str) -> list[tuple[int, Any]]:
    """Commit log entries (of revisions ``first``...) as documents, checksums checked."""
    return [
        (
            first + i,
            load_entry(unseal(e, f"commit log entry of revision {first + i} of {what}"), what),
        )
        for i, e in enumerate(items)
    ]
