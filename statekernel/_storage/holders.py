"""Who holds a run's lease, as a reader asks it: without writing anything.

A reader (``statekernel runs events --follow``, a view without an agent) may want to
know whether some process still drives a run that has committed nothing for a while.
Taking the lease to find out would be a write, refused by a store opened read-only,
and would keep the run from its owner for as long as the probe held it. A store that
can tell without writing declares ``ShowsHolders``; a reader of any other store
cannot tell, and says so (``driven``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from statekernel._storage.protocol import CheckpointStore

__all__ = ["ShowsHolders", "driven"]


@runtime_checkable
class ShowsHolders(Protocol):
    """What a store may offer beyond ``CheckpointStore``: the live owner holding a run's
    lease, read without writing (no lease is taken, nothing is marked or cleared), so
    that a store opened read-only answers too."""

    async def holder(self, run_id: str) -> str | None:
        """The owner holding the run's lease while it lives; None when no live owner
        holds it (an ``acquire`` now would take the run at once).

        Raises:
            RunNotFound: no run has this id.
        """
        ...


async def driven(store: CheckpointStore, run_id: str) -> bool | None:
    """Whether a live owner holds the run's lease (None: ``store`` cannot tell without
    writing: it does not declare ``ShowsHolders``).

    Raises:
        RunNotFound: no run has this id.
    """
    if not isinstance(store, ShowsHolders):
        return None
    return await store.holder(run_id) is not None
