"""Who drives a run that is not at rest, as a reader tells it without writing.

A run in ``preparing_turn``, ``calling_model`` or ``dispatching_tools`` is mid-drive:
some process should hold its lease and go on with it. The web view and ``statekernel
runs list`` / ``runs show`` say which: the live owner holding the lease (``driven by
<owner>``), or that the owner is gone (its lease expired, its process is known dead,
or it let go of the lease) and the run stays where that owner left it until someone
takes it over. A run at rest (``init``, ``paused``, ``failed``, ``completed``) has no
owner to show, and is not asked about.

Whether a live owner holds the lease is the store's own answer to a reader
(``ShowsHolders.holder``): nothing is written, no lease is taken or renewed, so a store
opened read-only answers too. A store that cannot tell without writing shows nothing:
a reader never guesses. Who the gone owner was, and how it is known gone, is read
from the lease record as the store keeps it (memory, SQLite and PostgreSQL stores),
also without writing.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from statekernel._storage.holders import ShowsHolders
from statekernel._storage.protocol import CheckpointStore
from statekernel._storage.shielding import shielded
from statekernel.errors import CorruptCheckpoint, RunNotFound, StoreError
from statekernel.stores._host.owners import LeaseRecord
from statekernel.stores.memory._store import MemoryStore
from statekernel.stores.sqlite._ops import read_lease
from statekernel.stores.sqlite._store import SQLiteStore

if TYPE_CHECKING:
    from statekernel.stores.postgres._ops import Tables

__all__ = ["MID_DRIVE", "Owner", "ago", "mid_drive", "owner_of", "owners_of"]

MID_DRIVE = frozenset({"preparing_turn", "calling_model", "dispatching_tools"})
"""The states of a run some process is driving (every other state is at rest)."""

_POSTGRES = "statekernel.stores.postgres._store"


def mid_drive(state: str) -> bool:
    """Whether a run in ``state`` is mid-drive (not at rest: an owner should hold it)."""
    return state in MID_DRIVE


@attrs.frozen
class Owner:
    """Who drives a mid-drive run at ``revision``, as a reader sees it.

    ``alive``: a live owner, ``name``, holds the run's lease. Otherwise the owner is
    gone: ``name`` is the owner that held the lease last (None when the record does not
    say: the lease was given up) and ``why`` how it is known gone.
    """

    run_id: str
    revision: int
    alive: bool
    name: str | None = None
    why: str = ""

    @property
    def text(self) -> str:
        """One line: ``driven by <owner>`` or ``owner gone: <owner> (<why>)``."""
        if self.alive:
            return f"driven by {self.name}"
        who = f": {self.name}" if self.name is not None else ""
        return f"owner gone{who} ({self.why or 'no live owner holds its lease'})"

    @property
    def lost(self) -> str:
        """The line of the run's timeline where its owner was lost ('' while it lives)."""
        if self.alive:
            return ""
        who = f"owner {self.name}" if self.name is not None else "its owner"
        why = self.why or "no live owner holds its lease"
        return f"{who} lost after revision {self.revision} ({why}): nothing drives the run"


async def owner_of(store: CheckpointStore, run_id: str, state: str, revision: int) -> Owner | None:
    """Who drives the run ``run_id``, in ``state`` at ``revision``: None for a run at
    rest, for a store that cannot tell without writing, and when it cannot tell now (a
    run deleted meanwhile, owner locks it cannot read, a damaged lease record)."""
    if not mid_drive(state) or not isinstance(store, ShowsHolders):
        return None
    try:
        holder = await store.holder(run_id)
        if holder is not None:
            return Owner(run_id, revision, True, holder)
        name, why = await _gone(store, run_id)
    except (RunNotFound, StoreError, CorruptCheckpoint):
        return None
    return Owner(run_id, revision, False, name, why)


async def owners_of(
    store: CheckpointStore, runs: Iterable[tuple[str, str, int]]
) -> dict[str, Owner]:
    """``owner_of`` each of ``runs`` (run id, state, revision) that is mid-drive, by
    run id; runs at rest are not looked up."""
    moving = [(run_id, state, revision) for run_id, state, revision in runs if mid_drive(state)]
    found = await asyncio.gather(*(owner_of(store, *run) for run in moving))
    return {owner.run_id: owner for owner in found if owner is not None}


def ago(seconds: float) -> str:
    """``seconds`` in words: ``12 s``, ``5 min``, ``3 h``, ``2 days``."""
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


async def _gone(store: CheckpointStore, run_id: str) -> tuple[str | None, str]:
    """(the owner that held the run's lease last, how it is known gone) from the lease
    record as stored, for a run no live owner holds; (None, '') when the store does not
    say."""
    seen = await _last_lease(store, run_id)
    if seen is None:
        return None, ""
    owner, expired_for = seen
    if owner is None:
        return None, "its last owner let go of its lease"
    if expired_for >= 0:
        return owner, f"lease expired {ago(expired_for)} ago"
    return owner, "its process is gone"


async def _last_lease(store: CheckpointStore, run_id: str) -> tuple[str | None, float] | None:
    """(owner, seconds since its lease expired: negative before) of the run's lease
    record, read without writing; None when the store keeps none a reader can read."""
    record: LeaseRecord | None
    if isinstance(store, MemoryStore):
        entry = store.stored(run_id)
        if entry is None:
            raise RunNotFound(run_id)
        record, now = entry.lease, store._leases.clock()
    elif isinstance(store, SQLiteStore):
        record = await shielded(store._call(read_lease, run_id))
        now = store._leases.clock()
    elif (postgres := sys.modules.get(_POSTGRES)) is not None and isinstance(
        store, postgres.PostgresStore
    ):
        found: tuple[str | None, float] | None = await store._run(_postgres_lease, run_id)
        return found
    else:
        return None
    if record is None:
        return None
    return record.owner, now - record.expires


async def _postgres_lease(conn: Any, t: Tables, run_id: str) -> tuple[str | None, float] | None:
    """The run's lease row in a PostgreSQL store: (owner, seconds since it expired on
    the server's clock)."""
    row = await conn.fetchrow(
        f"SELECT owner, expires, extract(epoch FROM clock_timestamp())::float8"
        f" FROM {t.leases} WHERE run_id = $1",
        run_id.encode("utf-8", "surrogatepass"),
    )
    if row is None:
        return None
    if row[0] is None or row[1] is None:
        return None, 0.0
    return bytes(row[0]).decode("utf-8", "replace"), float(row[2]) - float(row[1])
