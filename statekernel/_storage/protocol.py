"""The checkpoint store protocol: what the kernel needs from any store.

A commit is atomic and guarded by compare-and-set on the revision: the new head,
the parts that are new since the previous revision (messages, completed turns)
and the events of the transition land together or not at all.

One owner per run: a drive first takes the run's lease (``acquire``), which gives it
a fencing token larger than every token given for the run before. Every commit of
the drive carries the lease, and the store checks the token in the same atomic step
as the revision, so an owner that lost its lease can never commit again. A lease
held by a live owner is not given to anyone else; a dead owner's lease is taken
over as soon as the store can prove the death (an OS lock the owner's process held,
on one host) or once it expires (``ttl`` seconds after it was last renewed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs

from statekernel._records.events import Event
from statekernel._records.run import Cancellation, PauseInfo, Run, StateId
from statekernel._storage.closing import Closing
from statekernel._storage.queues import RunQueues

__all__ = [
    "BoundsEffects",
    "CancelsRuns",
    "Checkpoint",
    "CheckpointStore",
    "CreatesLeased",
    "DamagedRun",
    "FindsRunIds",
    "KeepsFences",
    "Lease",
    "ReleasesWithCommit",
    "RevisionHistory",
    "RunPage",
    "RunQueues",
    "RunSummary",
    "SettlesOnCancel",
    "StoreWrapper",
    "effect_window",
    "settles_on_cancel",
]


@attrs.frozen
class Checkpoint:
    """One commit: the new head ``run`` and what is new since ``run.revision - 1``.

    ``new_messages`` counts the messages at the end of ``run.messages`` that the
    previous revision did not have; when ``transcript_replaced`` is True the whole
    transcript was rewritten (by a hook or an edit) and every message is new.
    ``new_turns`` counts the turns at the end of ``run.turns`` that are new.
    A checkpoint at revision 0 creates the run and must not find one.
    """

    run: Run
    events: tuple[Event, ...] = ()
    new_messages: int = 0
    new_turns: int = 0
    transcript_replaced: bool = False
    cancels: bool = False
    """The commit that carries out the run's cancel request (``CancelsRuns``): it lands
    despite the request, and the request goes with it."""

    @property
    def expected_revision(self) -> int:
        """The revision the store must hold for this commit to land (-1: no run yet)."""
        return self.run.revision - 1

    @classmethod
    def appended(cls, previous: Run, run: Run, events: Sequence[Event] = ()) -> Checkpoint:
        """The checkpoint from ``previous`` to ``run`` when ``run`` only appended.

        Lifecycle transitions never rewrite the transcript or completed turns, so
        the kernel uses this O(1) form; ``between`` checks instead of assuming.

        Returns:
            The checkpoint, counting the messages and turns ``run`` has beyond
                ``previous`` as new.
        """
        return cls(
            run,
            tuple(events),
            new_messages=len(run.messages) - len(previous.messages),
            new_turns=len(run.turns) - len(previous.turns),
        )

    @classmethod
    def between(cls, previous: Run | None, run: Run, events: Sequence[Event] = ()) -> Checkpoint:
        """The checkpoint that moves a store from ``previous`` to ``run``.

        The transcript counts as appended when ``previous.messages`` is a prefix of
        ``run.messages`` by identity (revisions share their message objects).

        Returns:
            The checkpoint; with ``previous`` None (a new run), or a transcript that was
                not only appended to, one with ``transcript_replaced`` set.
        """
        if previous is None:
            return cls(run, tuple(events), len(run.messages), len(run.turns), True)
        old, new = previous.messages, run.messages
        appended = len(new) >= len(old) and (not old or new[len(old) - 1] is old[-1])
        if appended and len(old) > 1 and new.shares_prefix(old) < len(old):
            appended = all(a is b for a, b in zip(old, new, strict=False))
        return cls(
            run,
            tuple(events),
            new_messages=len(new) - len(old) if appended else len(new),
            new_turns=len(run.turns) - len(previous.turns),
            transcript_replaced=not appended,
        )


@attrs.frozen
class Lease:
    """A held lease on a run: its owner and the fencing token commits carry.

    ``token`` starts with a number that is larger for every later lease of the run
    (``generation``); a store may add more after a ``/``. ``taken_from``: the owner
    whose lease the ``acquire`` that gave this one took over (it had expired, or that
    owner was proven dead); None when the lease was free (given back, or never taken),
    when it was ``owner``'s own, or when the store does not tell. It is no part of the
    lease's identity: two leases that differ only in it are equal."""

    run_id: str
    owner: str
    token: str
    taken_from: str | None = attrs.field(default=None, eq=False, kw_only=True)

    @property
    def generation(self) -> int:
        """The number at the head of the token: every later lease of the run has a larger one."""
        return int(self.token.partition("/")[0])


@attrs.frozen
class RunSummary:
    """A line of a run listing; ``pause`` says why a paused run waits and for what (and
    its timer); ``deadline`` is the run's (``start(deadline=|timeout=)``), ``tags`` its tags."""

    run_id: str
    state: StateId
    revision: int
    model: str
    turns: int
    created_at: datetime
    updated_at: datetime
    pause: PauseInfo | None = None
    deadline: datetime | None = None
    tags: Mapping[str, str] = attrs.field(factory=dict)
    """The run's tags (``Run.tags``)."""

    @classmethod
    def of(cls, run: Run) -> RunSummary:
        """The listing line of ``run``.

        Returns:
            The summary of ``run`` at its revision.
        """
        return cls(
            run.run_id,
            run.state,
            run.revision,
            run.model,
            run.turn_count,
            run.created_at,
            run.updated_at,
            run.pause,
            run.deadline,
            run.tags,
        )


@attrs.frozen
class DamagedRun:
    """A run a listing left out because its stored head cannot be read, and why."""

    run_id: str
    problem: str


@attrs.frozen
class RunPage:
    """One page of a run listing; pass ``next_cursor`` back to get the next page.

    ``damaged``: runs of this page's range whose head cannot be read (left out of
    ``runs``, named here so one damaged run never hides the others).
    """

    runs: tuple[RunSummary, ...]
    next_cursor: str | None = None
    damaged: tuple[DamagedRun, ...] = ()


@runtime_checkable
class CheckpointStore(Protocol):
    """Durable storage of runs: heads, append-only parts and events.

    Implementations: ``memory://``, ``file://``, ``sqlite://``, ``redis://``
    (see ``statekernel.stores.open_store``). All methods are coroutines and
    raise only ``statekernel.errors`` exceptions.
    """

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its latest revision, or at ``revision``; raises ``RunNotFound``.

        Returns:
            The run, whole (transcript and completed turns included).

        Raises:
            RunNotFound: no run has this id, or it has no revision ``revision``.
            InvalidArgument: ``run_id`` or ``revision`` is of the wrong type or value.
            CorruptCheckpoint: a stored record of the run cannot be read or fails its
                checksum.
            StoreError: the storage failed.
        """
        ...

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Commit a checkpoint atomically if the head is ``checkpoint.expected_revision``.

        Raises ``ConflictError`` when the head moved (or, at revision 0, when the run
        exists). With ``lease``, the commit lands only while the lease is the run's
        current one (checked in the same atomic step), else ``LeaseLost``.

        Raises:
            ConflictError: the head is not at ``checkpoint.expected_revision`` (at
                revision 0: the run exists already); nothing was written.
            LeaseLost: ``lease`` is no longer the run's current lease; nothing was
                written.
            CorruptCheckpoint: the stored records of the run do not match its head.
            StoreError: the storage failed.
        """
        ...

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        """Take the run's lease for ``owner`` with a new, larger fencing token.

        Raises ``RunBusy`` naming the holder while another live owner holds it (a lease
        that expired, or whose owner is proven dead, is taken over).

        A store should say in the lease's ``taken_from`` whose lease it took over: the
        owner that held it when it expired or was found dead (None when the lease was
        free, given back, never taken, or ``owner``'s own). The kernel counts takeovers
        by it (``statekernel.takeovers``); a store that leaves it None works all the
        same, its takeovers uncounted.

        Returns:
            The new lease, for the commits of ``owner`` to carry.

        Raises:
            RunBusy: another live owner holds the lease.
            RunNotFound: no run has this id.
            StoreError: the storage failed.
        """
        ...

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        """Extend the lease to ``ttl`` seconds from now; ``LeaseLost`` if it moved on.

        Raises:
            LeaseLost: ``lease`` is no longer the run's current lease.
            StoreError: the storage failed.
        """
        ...

    async def release(self, lease: Lease) -> None:
        """Give the lease up (nothing if it already moved on)."""
        ...

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Persisted events of revisions greater than ``after_revision``, in ``seq`` order.

        Returns:
            The events, at most ``limit`` of them (all with ``limit`` None).

        Raises:
            RunNotFound: no run has this id.
            InvalidArgument: ``after_revision`` or ``limit`` is of the wrong type or value.
            CorruptCheckpoint: a stored commit of the run cannot be read.
            StoreError: the storage failed.
        """
        ...

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        """Runs, newest update first, optionally filtered by state, update time and tags
        (``tags``: the runs carrying every pair given; None or empty: no filter).

        Returns:
            One page of at most ``limit`` runs; its ``next_cursor`` (None on the last
                page) gets the next. Runs whose head cannot be read are named in
                ``damaged`` instead of failing the listing.

        Raises:
            InvalidArgument: ``state`` is not a state id, ``updated_after`` not a
                datetime, ``limit`` not an int of at least 0, or ``cursor`` not a str;
                ``InvalidTag`` for a pair of ``tags`` that breaks the rules of tags.
            StoreError: ``cursor`` is not one a listing gave, or the storage failed.
        """
        ...

    async def delete(self, run_id: str) -> bool:
        """Remove a run with all its revisions, parts and events; False if there was none.

        Returns:
            True if the run was there and is gone, False if there was none.

        Raises:
            InvalidArgument: ``run_id`` is not a run id.
            StoreError: the storage failed.
        """
        ...

    async def aclose(self) -> None:
        """Release connections and files."""
        ...


@runtime_checkable
class SettlesOnCancel(Protocol):
    """What a store may declare beyond ``CheckpointStore``: ``settles_on_cancel = True``
    when a commit whose await is cancelled has landed whole or not at all by the time
    the cancellation propagates (nothing of it keeps running). The kernel then awaits
    its commits directly instead of shielding each in a task of its own.
    ``check_store`` checks the claim."""

    settles_on_cancel: bool


@runtime_checkable
class RevisionHistory(Protocol):
    """What a store may offer beyond ``CheckpointStore``: every revision of a run, oldest
    first, each with the events of its commit, read in one pass (``migrate`` uses it;
    without it, it loads each revision). ``check_store`` compares it with ``load`` and
    ``events``."""

    def history(self, run_id: str) -> AsyncIterator[tuple[Run, list[Event]]]:
        """Every revision of the run with its commit's events; ``RunNotFound`` if none.

        Yields:
            Each revision of the run, oldest first, with the events of its commit.

        Raises:
            RunNotFound: no run has this id.
            CorruptCheckpoint: a stored record of the run cannot be read.
        """
        ...


@runtime_checkable
class KeepsFences(Protocol):
    """What a store may offer beyond ``CheckpointStore``: a run's fence, the largest
    fencing token given for it, kept whatever happens to its lease record, so that
    ``migrate`` carries it and a run's tokens only grow from store to store."""

    async def fence(self, run_id: str) -> int:
        """The largest fencing token given for the run (0: none yet).

        Raises:
            RunNotFound: no run has this id.
        """
        ...

    async def keep_fence(self, run_id: str, at_least: int) -> None:
        """Make every later fencing token of the run larger than ``at_least``.

        Raises:
            RunNotFound: no run has this id.
        """
        ...


@runtime_checkable
class FindsRunIds(Protocol):
    """What a store may offer beyond ``CheckpointStore``: the ids of the runs whose id
    starts with a prefix, in one query (a run's child runs are named after it: finding
    them costs one query, not one load per tool call of the run)."""

    async def run_ids(self, prefix: str, *, limit: int) -> list[str]:
        """The ids of at most ``limit`` runs whose id starts with ``prefix``, sorted."""
        ...


@runtime_checkable
class ReleasesWithCommit(Protocol):
    """What a store may offer beyond ``CheckpointStore``: a commit fenced by a lease that
    gives the lease up in the same atomic step. The kernel commits a run's coming to rest
    so when nothing of the drive is left running: the lease goes back without a round
    trip of its own."""

    async def commit_and_release(self, checkpoint: Checkpoint, *, lease: Lease) -> None:
        """``commit(checkpoint, lease=lease)``, and ``release(lease)`` with it when it lands.

        Raises:
            ConflictError: as ``commit`` (nothing written, the lease still held).
            LeaseLost: as ``commit``.
            StoreError: the storage failed; the commit, and the release with it, may
                have landed or not (the head says).
        """
        ...


@runtime_checkable
class CreatesLeased(Protocol):
    """What a store may offer beyond ``CheckpointStore``: the commit that creates a run
    takes its lease in the same atomic step (``Kernel.start_and_run``), so the drive
    holds the run from its first commit, without a round trip of its own for the lease."""

    async def create_leased(
        self, checkpoint: Checkpoint, owner: str, *, ttl: float
    ) -> Lease | None:
        """``commit(checkpoint)`` of a new run (revision 0), and with it
        ``acquire(run_id, owner, ttl=ttl)``.

        Returns:
            The lease; None when the run was created without it, because its id kept a
                lease record that an owner may still hold (a run deleted while held): the
                caller takes it with ``acquire``, which waits for that owner as usual.

        Raises:
            ConflictError: a run has the id already (nothing written, no lease taken).
            StoreError: the storage failed; the run may have been created or not (the
                head says), and if it was, its lease may be held by ``owner`` until it
                expires.
        """
        ...


@runtime_checkable
class CancelsRuns(Protocol):
    """What a store may offer beyond ``CheckpointStore``: a cancel request kept beside a
    run's lease (``Kernel.cancel``), written by anyone without the lease.

    While a request is kept, every commit to the run is refused with
    ``CancelRequested``, in the same atomic step that checks its revision and fencing
    token, except the one that carries the request out (``Checkpoint.cancels``), which
    removes it. So no intent lands after the request is kept, whoever drives the run,
    and no call committed after it ever starts. Deleting the run removes its request."""

    async def request_cancel(self, run_id: str, request: Cancellation) -> Cancellation | None:
        """Keep ``request`` for the run unless a request is kept already.

        Returns:
            None when ``request`` is kept now; the request kept before it otherwise
                (which stays, unchanged).

        Raises:
            RunNotFound: no run has the id.
            InvalidTransition: the run is completed or failed (nothing kept).
            StoreError: the storage failed; the request may have been kept or not.
        """
        ...

    async def cancel_request(self, run_id: str) -> Cancellation | None:
        """The run's kept cancel request, or None (also when no run has the id)."""
        ...


@runtime_checkable
class BoundsEffects(Protocol):
    """What a store may declare beyond ``CheckpointStore``: ``effect_window``, seconds
    after the start of the last acquisition or renewal of a lease that succeeded within
    which its owner may start a model or tool call (None: only the lease's TTL bounds
    it). A store whose takers may take a run before its lease expires (once they find
    the owner's liveness proof gone for a while) sets it; the kernel renews before an
    effect when its last renewal is older."""

    effect_window: float | None


def effect_window(store: CheckpointStore) -> float | None:
    """The ``effect_window`` ``store`` declares (``BoundsEffects``), or None."""
    window = store.effect_window if isinstance(store, BoundsEffects) else None
    return window if isinstance(window, (int, float)) and window > 0 else None


def settles_on_cancel(store: CheckpointStore) -> bool:
    """True when ``store`` declares that a cancelled commit has settled (``SettlesOnCancel``)."""
    return isinstance(store, SettlesOnCancel) and store.settles_on_cancel is True


class StoreWrapper(Closing):
    """A ``CheckpointStore`` that forwards every call to ``inner``.

    Subclass it to change one thing (fault injection, fencing, timing) and leave
    the rest as the wrapped store does it.
    """

    def __init__(self, inner: CheckpointStore) -> None:
        self.inner = inner

    @property
    def effect_window(self) -> float | None:
        """The wrapped store's (``BoundsEffects``)."""
        return effect_window(self.inner)

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """Forwarded."""
        return await self.inner.load(run_id, revision=revision)

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        """Forwarded."""
        await self.inner.commit(checkpoint, lease=lease)

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        """Forwarded."""
        return await self.inner.acquire(run_id, owner, ttl=ttl)

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        """Forwarded."""
        await self.inner.renew(lease, ttl=ttl)

    async def release(self, lease: Lease) -> None:
        """Forwarded."""
        await self.inner.release(lease)

    async def events(
        self, run_id: str, *, after_revision: int = -1, limit: int | None = None
    ) -> list[Event]:
        """Forwarded."""
        return await self.inner.events(run_id, after_revision=after_revision, limit=limit)

    async def list_runs(
        self,
        *,
        state: StateId | None = None,
        updated_after: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> RunPage:
        """Forwarded (``tags`` only when given, for an inner store that predates them)."""
        if tags:
            return await self.inner.list_runs(
                state=state, updated_after=updated_after, limit=limit, cursor=cursor, tags=tags
            )
        return await self.inner.list_runs(
            state=state, updated_after=updated_after, limit=limit, cursor=cursor
        )

    async def delete(self, run_id: str) -> bool:
        """Forwarded."""
        return await self.inner.delete(run_id)

    async def aclose(self) -> None:
        """Forwarded."""
        await self.inner.aclose()
