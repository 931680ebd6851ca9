"""``memory://``: an in-process store for tests and throwaway runs."""

from __future__ import annotations

import weakref
from datetime import datetime

import attrs

from statekernel._events import Event
from statekernel._messages import Message
from statekernel._run import Run, StateId, Turn
from statekernel._storage import Checkpoint, Lease, RunPage
from statekernel.errors import ConflictError, RunNotFound
from statekernel.stores._common import check_revision, checked_revision
from statekernel.stores._listing import page_of, summary_of
from statekernel.stores._owners import HostLeases, LeaseChange, LeaseRecord, check_fence

__all__ = ["MemoryStore"]


@attrs.define
class _Head:
    run: Run  # without messages and turns
    message_start: int
    message_count: int
    turn_count: int


@attrs.define
class _Entry:
    heads: list[_Head]
    messages: list[Message]
    turns: list[Turn]
    events: list[Event]
    lease: LeaseRecord | None = None


class _Runs(dict[str, _Entry]):
    """The runs of one memory store, by id (a class of its own so it can be weakly held)."""


_named: weakref.WeakValueDictionary[str, _Runs] = weakref.WeakValueDictionary()
"""The runs of each ``memory://NAME`` while some store of that name holds them."""


class MemoryStore:
    """Keeps every revision of every run in memory, laid out like the durable stores.

    Heads are kept per revision without their transcript; messages and completed
    turns live once in append-only lists the heads point into, so memory grows
    with the change, not with the number of revisions times the transcript.
    Stores opened with the same ``memory://NAME`` URL in one process share data
    while any of them is alive; once the last one is gone, so is the data.
    """

    settles_on_cancel = True
    """A commit runs without awaiting, so a cancelled caller leaves nothing in flight."""

    def __init__(self, name: str = "") -> None:
        self.url = f"memory://{name}"
        self._runs = _named.setdefault(name, _Runs()) if name else _Runs()
        self._leases = HostLeases(None, self._apply)

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its head, or at ``revision``."""
        checked_revision(run_id, revision)
        entry = self._runs.get(run_id)
        if entry is None:
            raise RunNotFound(run_id)
        head = entry.heads[check_revision(run_id, revision, len(entry.heads) - 1)]
        start = head.message_start
        return attrs.evolve(
            head.run,
            messages=tuple(entry.messages[start : start + head.message_count]),
            turns=tuple(entry.turns[: head.turn_count]),
        )

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Append the new head, parts and events if the head is the expected revision
        (and ``lease`` is the run's current lease)."""
        run = checkpoint.run
        entry = self._runs.get(run.run_id)
        if lease is not None:
            check_fence(None if entry is None else entry.lease, lease, checkpoint.expected_revision)
        actual = None if entry is None else entry.heads[-1].run.revision
        expected = checkpoint.expected_revision if run.revision > 0 else None
        if actual != expected or (entry is None and run.revision != 0):
            raise ConflictError(run.run_id, checkpoint.expected_revision, actual)
        if entry is None:
            entry = self._runs[run.run_id] = _Entry([], [], [], [])
            start = 0
        else:
            start = entry.heads[-1].message_start
        if checkpoint.transcript_replaced:
            start = len(entry.messages)
            entry.messages.extend(run.messages)
        elif checkpoint.new_messages:
            entry.messages.extend(run.messages[len(run.messages) - checkpoint.new_messages :])
        if checkpoint.new_turns:
            entry.turns.extend(run.turns[len(run.turns) - checkpoint.new_turns :])
        bare = attrs.evolve(run, messages=(), turns=())
        entry.heads.append(_Head(bare, start, len(run.messages), len(run.turns)))
        entry.events.extend(checkpoint.events)

    def _entry(self, run_id: str) -> _Entry:
        entry = self._runs.get(run_id)
        if entry is None:
            raise RunNotFound(run_id)
        return entry

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        """Take the run's lease (owners in one process: a lease ends by release or expiry)."""
        return await self._leases.acquire(run_id, owner, ttl=ttl)

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        """Extend the lease."""
        await self._leases.renew(lease, ttl=ttl)

    async def release(self, lease: Lease) -> None:
        """Give the lease up."""
        await self._leases.release(lease)

    async def _apply(self, run_id: str, change: LeaseChange) -> LeaseRecord | None:
        entry = self._entry(run_id)
        entry.lease = change(entry.lease)
        return entry.lease

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Persisted events after ``after_revision``."""
        entry = self._runs.get(run_id)
        if entry is None:
            raise RunNotFound(run_id)
        found = [e for e in entry.events if e.revision > after_revision]
        return found if limit is None else found[:limit]

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> RunPage:
        """Runs, newest update first."""
        summaries = [
            attrs.evolve(summary_of(h.run), turns=h.turn_count + (h.run.current_turn is not None))
            for h in (e.heads[-1] for e in self._runs.values())
        ]
        return page_of(
            summaries, state=state, updated_after=updated_after, limit=limit, cursor=cursor
        )

    async def delete(self, run_id: str) -> bool:
        """Forget a run entirely."""
        return self._runs.pop(run_id, None) is not None

    async def aclose(self) -> None:
        """Nothing to release."""
