"""One queue entry in a worker: drive the run (its kernel takes the run's lease, and gives
it back when the drive ends), settle the entry.

Settling follows the run's outcome:

* at rest (``completed``, ``paused``): acknowledge the entry;
* ``failed``, or the entry cannot be driven (unknown run, corrupt data, a bug):
  record it as a dead letter and acknowledge, in one transaction;
* stopped early (graceful shutdown) or the run is busy elsewhere (``RunBusy`` after the
  worker's ``lease_wait``): hand the entry back (a new entry replaces it, in one
  transaction);
* the lease was lost (``LeaseLost``): nothing; the entry belongs to whoever reclaims it;
* the store is unreachable: nothing; the entry stays pending and is reclaimed later.

An entry that carries the trace context of the request that submitted it
(``QueueEntry.trace``) is driven with that context current: the drive's ``invoke_agent``
span is a child of the submitter's span (linked to the span the run was created under,
when that is another trace). A trace context that does not parse is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Protocol, cast

import attrs

from statekernel._kernel import propagation
from statekernel._records.events import Event
from statekernel._records.run import Run
from statekernel._secrets import logger
from statekernel._storage.queues import QueueEntry, RunQueue
from statekernel.errors import ConflictError, LeaseLost, RunBusy, StatekernelError, StoreError

if TYPE_CHECKING:
    from statekernel._kernel.kernel import Kernel

__all__ = ["Host", "RunTask", "WorkerStats"]

log = logger("statekernel.worker")

CONFLICT_RETRIES = 3
_STOPPED = None
_REST = {"run_completed": "completed", "run_paused": "paused", "run_failed": "failed"}


@attrs.frozen
class Rest:
    """Where a drive left the run: its state at rest, and the failure if it failed."""

    state: str
    detail: str = ""

    @classmethod
    def of(cls, run: Run) -> Rest:
        """The rest position of a run loaded from the store."""
        failure = run.failure
        return cls(run.state, f"{failure.error}: {failure.message}" if failure else "")


@attrs.define
class WorkerStats:
    """What a worker did since it started."""

    taken: int = 0
    reclaimed: int = 0
    completed: int = 0
    paused: int = 0
    failed: int = 0
    errors: int = 0
    requeued: int = 0
    lost: int = 0
    max_in_flight: int = 0
    timers_fired: int = 0
    """Runs whose pause timer or deadline the worker's timer loop fired."""


class Host(Protocol):
    """What a task uses of its worker (``Worker`` is one)."""

    name: str
    holding: dict[str, QueueEntry]
    """The entries the worker works on, by run id."""
    stats: WorkerStats

    @property
    def kernel(self) -> Kernel:
        """The kernel that drives the worker's runs."""
        ...

    @property
    def queue(self) -> RunQueue:
        """The queue the worker takes entries from."""
        ...

    @property
    def stopping(self) -> bool:
        """True once the worker was asked to stop."""
        ...


class RunTask:
    """Handles one entry for ``worker``."""

    def __init__(self, worker: Host, entry: QueueEntry) -> None:
        self.worker = worker
        self.entry = entry
        self.run_id = entry.run_id

    async def handle(self) -> None:
        """Drive, settle; never raises except on cancellation."""
        w, entry = self.worker, self.entry
        try:
            if not self.run_id:
                await self._dead("malformed", f"entry {entry.id} names no run")
            elif w.stopping:
                await self._requeue()
            else:
                await self._driven()
        except StoreError as exc:
            w.stats.errors += 1
            log.warning("run %s: store unreachable, entry left pending: %s", self.run_id, exc)

    async def _driven(self) -> None:
        w = self.worker
        w.holding[self.run_id] = self.entry
        try:
            outcome = await self._outcome()
        except RunBusy:  # another owner drives it: it comes back later
            await self._requeue()
            return
        except LeaseLost:
            self._lost()
            return
        except asyncio.CancelledError:
            with contextlib.suppress(StatekernelError):
                await asyncio.shield(self._settle(_STOPPED))
            raise
        finally:
            if w.holding.get(self.run_id) is self.entry:
                del w.holding[self.run_id]
        await self._settle(outcome)

    async def _outcome(self) -> Rest | Exception | None:
        """The run at rest, None when stopped early, or the error that ended the drive."""
        try:
            return await self._drive()
        except (LeaseLost, RunBusy, StoreError):
            raise
        except Exception as exc:  # a run that cannot be driven: recorded, not retried
            return exc

    async def _drive(self) -> Rest | None:
        for attempt in range(CONFLICT_RETRIES):
            try:
                return await self._drive_once()
            except LeaseLost:
                raise
            except ConflictError:  # a command committed meanwhile: reload and go on
                log.info("run %s: overtaken by another commit (%d)", self.run_id, attempt + 1)
        return _STOPPED  # busy with commands: hand it back for later

    async def _drive_once(self) -> Rest | None:
        """Drive until at rest; when stopping, stop at the first commit after which no
        tool call is in flight and no model call is about to be made."""
        w = self.worker
        in_flight: set[object] = set()
        rest: Rest | None = None
        run = cast("AsyncGenerator[Event, None]", w.kernel.run(self.run_id))
        with propagation.attached(self.entry.trace):  # the drive: under the submitter's span
            async with contextlib.aclosing(run) as events:
                async for event in events:
                    if not event.persisted:
                        continue
                    data = event.data
                    call_id = data.get("call_id") if isinstance(data, dict) else None
                    if event.type == "tool_call_started":
                        in_flight.add(call_id)
                    elif event.type == "tool_call_completed":
                        in_flight.discard(call_id)
                    elif event.type in _REST:
                        rest = _rest(event)
                    if w.stopping and not in_flight and event.type != "model_started":
                        return rest or await self._rest_or_stopped()
        return rest or Rest.of(await w.kernel.get(self.run_id))

    async def _rest_or_stopped(self) -> Rest | None:
        """Where a drive that stops mid-commit leaves the run: the commit whose events are
        being read may have brought it to rest (its ``run_*`` event not read yet)."""
        try:
            run = await self.worker.kernel.get(self.run_id)
        except StatekernelError:  # unknown: handed back, whoever takes it sees the run
            return _STOPPED
        return Rest.of(run) if run.state in _REST.values() else _STOPPED

    async def _settle(self, outcome: Rest | Exception | None) -> None:
        w = self.worker
        if outcome is _STOPPED:
            await self._requeue()
        elif isinstance(outcome, Exception):
            await self._dead("error", f"{type(outcome).__name__}: {outcome}")
        elif outcome.state == "failed":
            await self._dead("failed", outcome.detail or "failed")
        else:
            await w.queue.ack(self.entry)
            if outcome.state == "completed":
                w.stats.completed += 1
            else:
                w.stats.paused += 1

    def _lost(self) -> None:
        self.worker.stats.lost += 1
        log.info("run %s: lease lost, the entry is left to whoever reclaims it", self.run_id)

    async def _requeue(self) -> None:
        await self.worker.queue.requeue(self.entry)
        self.worker.stats.requeued += 1

    async def _dead(self, reason: str, detail: str) -> None:
        w = self.worker
        await w.queue.dead(self.entry, reason, detail, w.name)
        if reason == "failed":
            w.stats.failed += 1
        else:
            w.stats.errors += 1
        log.warning("run %s: %s: %s", self.run_id or "?", reason, detail)


def _rest(event: Event) -> Rest:
    data = event.data if isinstance(event.data, dict) else {}
    detail = f"{data.get('error', '')}: {data.get('message', '')}" if data.get("error") else ""
    return Rest(_REST[event.type], detail)
