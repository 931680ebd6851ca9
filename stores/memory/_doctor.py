"""The doctor's probe of the memory store: nothing outlives the process that holds it."""

from __future__ import annotations

from statekernel._storage.protocol import CheckpointStore
from statekernel.stores._doctor_probe import WARNING, Finding, LeaseView, RunRef

__all__ = ["MemoryProbe"]


class MemoryProbe:
    """``memory://``: nothing outlives the process that holds the store."""

    local_errors = False

    def __init__(self, url: str) -> None:
        self.subject = url
        self.store: CheckpointStore | None = None

    async def settings(self) -> list[Finding]:
        """The one thing to say: a memory store is not durable."""
        detail = (
            "not durable: memory:// keeps runs only inside the process that holds the "
            "store, so this process sees none and nothing survives a restart"
        )
        return [Finding("durability", self.subject, WARNING, detail)]

    async def runs(self) -> list[RunRef]:
        """None: another process's memory cannot be read."""
        return []

    async def lease(self, run_id: str) -> LeaseView | None:
        """None."""
        return None

    async def cross_checks(self) -> list[Finding]:
        """None."""
        return []

    async def aclose(self) -> None:
        """Nothing to close."""
