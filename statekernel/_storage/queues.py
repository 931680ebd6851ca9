"""Run queues: what a worker needs of a store that keeps queues next to its runs.

A queue holds entries, each naming a run to drive. A worker *reads* new entries (each
delivered to one consumer, the worker's name), keeps *refreshing* the ones it works
on, and settles each one: *ack* (the run is at rest), *requeue* (handed back, at the
end of the queue) or *dead* (recorded as a dead letter, then acknowledged). An entry
whose consumer stopped refreshing it for longer than a lease lives is *reclaimed* by
another worker, with its delivery count increased, so a run that keeps killing its
workers ends as a dead letter instead of going round forever.

Two stores implement it: Redis (a stream and a consumer group per queue) and
PostgreSQL (a table read with ``FOR UPDATE SKIP LOCKED``, woken by ``LISTEN/NOTIFY``).
The same ``Worker`` serves either.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from statekernel._records.run import TraceParent
from statekernel.errors import InvalidArgument

__all__ = [
    "DeadLetter",
    "ListsQueues",
    "QueueDepth",
    "QueueEntry",
    "QueuedRun",
    "RunQueue",
    "RunQueues",
    "checked_queue_name",
    "queue_key",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def checked_queue_name(name: object) -> str:
    """``name`` if it is a valid queue name, else ``InvalidArgument`` naming it."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"invalid queue name {name!r}: 1-128 letters, digits, '.', '_', ':', '-'"
        )
    return name


_KEY_TEXT = re.compile(r"[^\x00-\x1f\x7f\ud800-\udfff]+")


def queue_key(key: object, key_limit: object) -> int:
    """``key_limit`` for an entry submitted with ``key`` (None, or 1 to 200 characters, no
    control characters), checked: an int from 1 on (``InvalidArgument`` otherwise)."""
    if key is not None and (
        type(key) is not str or not key or len(key) > 200 or not _KEY_TEXT.fullmatch(key)
    ):
        raise InvalidArgument(
            f"key must be None or 1 to 200 printable characters, got {key!r}"[:300]
        )
    if type(key_limit) is not int or key_limit < 1:
        raise InvalidArgument(f"key_limit must be an int >= 1, got {key_limit!r}")
    return key_limit


@attrs.frozen
class QueueEntry:
    """One queue entry: the run to drive, when it was submitted (ms since the epoch),
    how often it was delivered, its ``key`` (with at most ``key_limit`` entries of
    that key in flight on the queue at once), if it was submitted with one, and the
    W3C trace context of the span current where it was submitted (``trace``: the
    worker's drive of the run is a child of that span), if there was one."""

    id: str
    run_id: str
    submitted_ms: int = 0
    deliveries: int = 1
    key: str | None = None
    key_limit: int = 1
    trace: TraceParent | None = None


@attrs.frozen
class DeadLetter:
    """A run a worker gave up on: the entry, why (``failed``, ``deliveries``,
    ``malformed``, ``error``), the detail, which worker and when (ms since the epoch)."""

    run_id: str
    entry: str
    reason: str
    detail: str
    worker: str
    at_ms: int


@attrs.frozen
class QueuedRun:
    """An entry as an operator sees it: its id, the run, when it was submitted (ms since
    the epoch), how often it was delivered, its ``state`` (``waiting``: ready to be
    taken, or waiting for its key's turn; ``delayed``: not due yet; ``taken``: delivered
    to a worker and not settled), the worker that holds it (when taken) and its key."""

    id: str
    run_id: str
    submitted_ms: int
    deliveries: int
    state: str
    consumer: str | None = None
    key: str | None = None


@attrs.frozen
class QueueDepth:
    """How much a queue holds: entries not delivered yet (``waiting``, the delayed ones
    with them), delivered and not settled (``taken``), dead letters kept (``dead``), and
    when the oldest entry that could be taken now was submitted (``oldest_ms``, ms since
    the epoch; None when there is none)."""

    name: str
    waiting: int
    taken: int
    dead: int
    oldest_ms: int | None = None


@runtime_checkable
class RunQueue(Protocol):
    """One named queue of a store, as a worker uses it."""

    name: str

    async def prepare(self) -> None:
        """Create what the queue needs before it is read (idempotent)."""
        ...

    async def submit(
        self,
        run_id: str,
        submitted_ms: int | None = None,
        *,
        delay_ms: int = 0,
        key: str | None = None,
        key_limit: int = 1,
        trace: TraceParent | None = None,
    ) -> str:
        """Append an entry for ``run_id``, taken no sooner than ``delay_ms`` from now and,
        with a ``key``, only while fewer than ``key_limit`` entries of that key are in
        flight (taken and not settled); the entry id. ``trace``: the trace context the
        entry carries to the worker that drives it (``QueueEntry.trace``).

        Returns:
            The id of the new entry.
        """
        ...

    async def read(self, consumer: str, count: int, block_ms: int) -> list[QueueEntry]:
        """Up to ``count`` new entries for ``consumer``, waiting up to ``block_ms`` for
        the first one.

        Returns:
            The entries delivered to ``consumer`` (none when ``block_ms`` passed first).
        """
        ...

    async def reclaim(
        self, consumer: str, count: int, min_idle_ms: int, cursor: str = "0-0"
    ) -> tuple[str, list[QueueEntry]]:
        """Take over up to ``count`` entries not refreshed for ``min_idle_ms``; the
        cursor to pass next time and the entries with their delivery counts.

        Returns:
            The cursor to pass next time, and the entries now delivered to
                ``consumer`` (their ``deliveries`` counted up).
        """
        ...

    async def refresh(self, consumer: str, ids: Sequence[str]) -> None:
        """Mark entries of ``consumer`` as worked on (not reclaimable for a while)."""
        ...

    async def ack(self, entry: QueueEntry) -> None:
        """Acknowledge and remove an entry: its run is at rest."""
        ...

    async def requeue(self, entry: QueueEntry) -> str:
        """Replace an entry by a new one at the end of the queue, atomically (with the
        entry's key and trace context); its id.

        Returns:
            The id of the new entry.
        """
        ...

    async def dead(self, entry: QueueEntry, reason: str, detail: str, worker: str) -> None:
        """Record a dead letter and acknowledge the entry, atomically."""
        ...

    async def pending(self, consumer: str | None = None) -> int:
        """Entries delivered and not yet settled (of ``consumer``, or of anyone).

        Returns:
            How many there are.
        """
        ...

    async def waiting(self) -> int:
        """Entries not delivered yet.

        Returns:
            How many there are.
        """
        ...

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead letters, oldest first.

        Returns:
            At most ``limit`` dead letters, the newest ones, oldest first.
        """
        ...

    async def depth(self) -> QueueDepth:
        """How many entries wait, are taken and are dead letters, and the oldest wait.

        Returns:
            The queue's depth.
        """
        ...

    async def entries(self, limit: int = 100) -> list[QueuedRun]:
        """The entries not settled (waiting, delayed, taken), oldest first.

        Returns:
            At most ``limit`` entries.
        """
        ...

    async def revive(self, run_id: str | None = None) -> int:
        """Put the runs of the dead letters (of ``run_id``, or all) back on the queue, one
        new entry per run (with the trace context of its entry), and remove those dead
        letters, atomically.

        Returns:
            How many runs were put back (0: no such dead letter).
        """
        ...

    async def drop(self, run_id: str) -> int:
        """Remove the entries of ``run_id`` that are not taken (waiting, delayed) and its
        dead letters; a taken entry is left to its worker.

        Returns:
            How many entries and dead letters were removed.
        """
        ...

    async def leave(self, consumer: str) -> None:
        """``consumer`` stops reading (what the store keeps of it may go)."""
        ...

    async def aclose(self) -> None:
        """Give back what the queue holds (a connection that listens for entries)."""
        ...


@runtime_checkable
class RunQueues(Protocol):
    """What a store may offer beyond ``CheckpointStore``: run queues next to its runs,
    from which workers (``statekernel worker``) take runs to drive
    (``statekernel.stores.RedisStore``, ``statekernel.stores.PostgresStore``)."""

    async def submit(
        self,
        run_id: str,
        queue: str = "default",
        *,
        delay_ms: int = 0,
        key: str | None = None,
        key_limit: int = 1,
        trace: TraceParent | None = None,
    ) -> str:
        """Enqueue the existing run on ``queue``, for workers to take no sooner than
        ``delay_ms`` from now and, with a ``key``, only while fewer than ``key_limit``
        entries of that key are in flight; the entry id. ``trace``: the trace context
        the entry carries (``QueueEntry.trace``). ``RunNotFound`` if the run does not
        exist, ``InvalidArgument`` for a bad queue name.

        Returns:
            The id of the queue entry.

        Raises:
            RunNotFound: no run has this id.
            InvalidArgument: ``queue`` is not a valid queue name.
            StoreError: the storage failed.
        """
        ...

    def run_queue(self, name: str) -> RunQueue:
        """The queue ``name`` (``InvalidArgument`` for a bad name).

        Returns:
            The queue (its ``prepare`` creates what it needs in the store).

        Raises:
            InvalidArgument: ``name`` is not a valid queue name.
        """
        ...


@runtime_checkable
class ListsQueues(RunQueues, Protocol):
    """A store with run queues that also lists them, for operators (``statekernel
    queues``, the web view's queue pages). A worker needs only ``RunQueues``."""

    async def queue_names(self) -> list[str]:
        """The names of the queues that hold entries or dead letters, sorted.

        Returns:
            The queue names.

        Raises:
            StoreError: the storage failed.
        """
        ...
