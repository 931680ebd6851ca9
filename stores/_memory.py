"""``memory://``: an in-process store for tests and throwaway runs."""

from __future__ import annotations

import asyncio
from datetime import datetime

import attrs

from statekernel._events import Event
from statekernel._run import Run, StateId
from statekernel._storage import Checkpoint, RunPage
from statekernel.errors import ConflictError, RunNotFound
from statekernel.stores._listing import page_of, summary_of

__all__ = ["MemoryStore"]


@attrs.define
class _Entry:
    heads: list[Run]
    events: list[Event]


class MemoryStore:
    """Keeps every revision of every run in memory (records are immutable and shared).

    Stores opened with the same ``memory://NAME`` URL in one process share their data.
    """

    _named: dict[str, dict[str, _Entry]] = {}  # noqa: RUF012

    def __init__(self, name: str = "") -> None:
        self.url = f"memory://{name}"
        self._runs: dict[str, _Entry] = self._named.setdefault(name, {}) if name else {}
        self._lock = asyncio.Lock()

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        """The run at its head, or at ``revision``."""
        entry = self._runs.get(run_id)
        if entry is None:
            raise RunNotFound(run_id)
        if revision is None:
            return entry.heads[-1]
        if not 0 <= revision < len(entry.heads):
            raise RunNotFound(run_id, f"no revision {revision}")
        return entry.heads[revision]

    async def commit(self, checkpoint: Checkpoint) -> None:
        """Append the new head and events if the head is the expected revision."""
        run = checkpoint.run
        entry = self._runs.get(run.run_id)
        actual = None if entry is None else entry.heads[-1].revision
        if actual != (checkpoint.expected_revision if checkpoint.run.revision > 0 else None):
            raise ConflictError(run.run_id, checkpoint.expected_revision, actual)
        if entry is None:
            entry = self._runs[run.run_id] = _Entry([], [])
        entry.heads.append(run)
        entry.events.extend(checkpoint.events)

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
        heads = [e.heads[-1] for e in self._runs.values()]
        summaries = [summary_of(r) for r in heads]
        return page_of(summaries, state=state, updated_after=updated_after, limit=limit, cursor=cursor)

    async def delete(self, run_id: str) -> bool:
        """Forget a run entirely."""
        return self._runs.pop(run_id, None) is not None

    async def aclose(self) -> None:
        """Nothing to release."""
