"""Retention: which old runs ``Kernel.prune`` deletes, found page by page.

A run is pruned with its child runs (delegations) when it is a root (no parent, or a
parent that is gone), is in one of the states asked for and was last updated before
the cutoff. Each tree is deleted by ``Kernel.delete`` under every run's lease: a tree
that someone holds is skipped, never waited for or cut off. The listing is read one
page (``batch`` runs) at a time, and each page's runs are deleted before the next is
read, so memory and each store call stay bounded however many runs there are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import attrs

from statekernel._kernel.delegate import run_tree
from statekernel._records.arguments import count, flag
from statekernel._records.run import STATE_IDS, StateId, utcnow
from statekernel.errors import InvalidArgument, RunBusy, RunNotFound

if TYPE_CHECKING:
    from statekernel._storage.protocol import CheckpointStore

__all__ = ["PruneResult", "cutoff_of", "prune_runs", "states_of"]

DEFAULT_STATES: tuple[StateId, ...] = ("completed", "failed")


@attrs.frozen
class PruneResult:
    """What ``Kernel.prune`` did: ``deleted`` (every run id deleted, child runs included;
    with ``dry_run``, those it would delete), ``held`` (the runs skipped because someone
    held them or one of their child runs), and the ``cutoff`` it used."""

    deleted: tuple[str, ...]
    held: tuple[str, ...]
    cutoff: datetime
    dry_run: bool = False


def cutoff_of(older_than: Any, now: datetime | None = None) -> datetime:
    """The cutoff of ``older_than``: a ``timedelta`` of at least 0 before now, or an
    aware ``datetime``; ``InvalidArgument`` otherwise."""
    if isinstance(older_than, timedelta):
        if older_than < timedelta(0):
            raise InvalidArgument(f"older_than must not be negative, got {older_than}")
        return (now or utcnow()) - older_than
    if isinstance(older_than, datetime):
        if older_than.tzinfo is None:
            raise InvalidArgument("older_than must be an aware datetime (with a timezone)")
        return older_than
    raise InvalidArgument(
        f"older_than must be a timedelta or a datetime, got {type(older_than).__name__}"
    )


def states_of(states: Any) -> tuple[StateId, ...]:
    """The states asked for, each a known state id, without repeats."""
    if isinstance(states, str) or not isinstance(states, Iterable):
        raise InvalidArgument(f"states must be a list of state ids, got {states!r}")
    found: list[StateId] = []
    for state in states:
        if state not in STATE_IDS:
            raise InvalidArgument(f"unknown state {state!r} (states: {', '.join(STATE_IDS)})")
        if state not in found:
            found.append(state)
    if not found:
        raise InvalidArgument("states must name at least one state")
    return tuple(found)


Delete = Callable[[str], Awaitable[list[str]]]


async def prune_runs(
    store: CheckpointStore,
    delete: Delete,
    *,
    older_than: Any,
    states: Any = DEFAULT_STATES,
    dry_run: bool = False,
    batch: int = 100,
) -> PruneResult:
    """Delete (``delete(root_id)``, which deletes a tree or raises ``RunBusy``) every
    tree whose root is in ``states`` and last updated before the cutoff."""
    cutoff = cutoff_of(older_than)
    wanted = states_of(states)
    flag("dry_run", dry_run)
    count("batch", batch, minimum=1)
    deleted: list[str] = []
    gone: set[str] = set()
    held: list[str] = []
    for state in wanted:
        cursor: str | None = None
        while True:
            page = await store.list_runs(state=state, limit=batch, cursor=cursor)
            for row in page.runs:
                if row.updated_at >= cutoff or row.run_id in gone:
                    continue
                done, busy = await _prune_one(store, delete, row.run_id, dry_run)
                deleted.extend(done)
                gone.update(done)
                held.extend(busy)
            cursor = page.next_cursor
            if cursor is None:
                break
    return PruneResult(tuple(deleted), tuple(held), cutoff, dry_run)


async def _prune_one(
    store: CheckpointStore, delete: Delete, run_id: str, dry_run: bool
) -> tuple[list[str], list[str]]:
    """The ids deleted (or to delete) of the tree of ``run_id`` if it is a root, and
    the ids held."""
    try:
        run = await store.load(run_id)
        if run.parent_run_id is not None and await _exists(store, run.parent_run_id):
            return [], []  # goes with its parent
        if dry_run:
            return [r.run_id for _, r in reversed(await run_tree(store, run_id))], []
        return await delete(run_id), []
    except RunNotFound:
        return [], []  # deleted meanwhile
    except RunBusy:
        return [], [run_id]


async def _exists(store: CheckpointStore, run_id: str) -> bool:
    try:
        await store.load(run_id)
    except RunNotFound:
        return False
    return True
