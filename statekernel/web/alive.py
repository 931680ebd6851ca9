"""Who drives the runs the pages show: a line of the runs list and a run's header say
whether a live owner drives a run that is not at rest, or its owner is gone (and the
run's timeline where it was lost). Read without writing (``statekernel.stores._alive``):
the view never takes a lease to find out, and says nothing where the store cannot tell.
"""

from __future__ import annotations

import attrs

from statekernel import Run
from statekernel._front.reach import Owner, owner_of, owners_of
from statekernel.stores import CheckpointStore
from statekernel.web.views import ListRow

__all__ = ["run_owner", "with_owners"]


async def with_owners(store: CheckpointStore, rows: list[ListRow]) -> list[ListRow]:
    """``rows`` with who drives each one that is mid-drive (the others, paused,
    completed, damaged and so on, are not looked up)."""
    asked = [(r.run_id, r.state, r.revision) for r in rows if isinstance(r.revision, int)]
    owners = await owners_of(store, asked)
    return [_with(row, owners.get(row.run_id)) for row in rows]


def _with(row: ListRow, owner: Owner | None) -> ListRow:
    if owner is None:
        return row
    return attrs.evolve(row, owner=owner.text, owner_gone=not owner.alive)


async def run_owner(store: CheckpointStore, run: Run) -> Owner | None:
    """Who drives ``run`` (a run's head): None at rest, or where the store cannot tell."""
    return await owner_of(store, run.run_id, run.state, run.revision)
