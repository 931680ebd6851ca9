"""``Worker``: drive the runs of a store's run queue, many at once on one event loop.

Any store with run queues (``RunQueues``: Redis, PostgreSQL) serves: the worker only
uses the queue operations of ``statekernel._storage.queues``.

Ownership
    A worker owns runs as any kernel does (one ownership system): its kernel takes each
    run's lease with the store's ``acquire`` before the first step, renews it in the
    kernel's one renewal loop and releases it when the drive ends. Every commit carries
    the lease's fencing token, checked by the store's commit script together with the
    revision: a worker that lost its lease (it stalled, or the network dropped) can never
    commit again for that run, and starts no model or tool call once it may have lost it.
    A child run that a run's ``delegate`` tool starts takes its own lease the same way,
    in whatever process drives it.
Reclaim
    While it holds a lease the worker also refreshes the run's queue entry (on Redis,
    ``XCLAIM`` with ``JUSTID`` resets its idle time; on PostgreSQL, its claim time moves
    to the server's ``now()``). An entry idle longer than the lease's time to live
    therefore belongs to a worker that stopped renewing: the others take it over, wait
    for the lease to expire, and resume the run from its last commit. An entry delivered
    more than ``max_deliveries`` times goes to the dead letters instead (a run that
    keeps killing its workers).
Backpressure
    At most ``concurrency`` entries are in hand; the worker reads only as many as it
    has free slots.
Timers
    With ``timers=True`` (``statekernel worker --timers``) the worker also reads the
    store's paused runs every ``timer_every`` seconds and fires what is due on them (a
    pause timer, a passed deadline: ``statekernel._kernel.timers``), each under the
    run's lease in one commit; a run that goes on from there is handed to its queue.
    Any number of workers may do so: a timer fires once.
Metrics
    How long each entry waited from its submission to its first delivery
    (``statekernel.queue.wait``) and, with each refresh, how many entries wait
    (``statekernel.queue.depth``): ``statekernel._kernel.metrics``.
Shutdown
    ``stop()`` (the command installs it on SIGTERM and SIGINT): take no new entries,
    let each run reach a commit after which no tool call is in flight and no model
    call is pending, release its lease and hand its entry back to the queue. After
    ``grace`` seconds the rest are cancelled (nothing half-done is committed) and
    handed back too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from statekernel._kernel import metrics
from statekernel._kernel.due import due_runs, fire_due
from statekernel._kernel.kernel import Kernel
from statekernel._records.arguments import (
    check_worker_options,
    flag,
    optional_text,
    seconds,
    text,
)
from statekernel._secrets import logger
from statekernel._storage.protocol import CheckpointStore
from statekernel._storage.queues import QueueEntry, RunQueue, RunQueues
from statekernel._workers.task import RunTask, WorkerStats
from statekernel.errors import (
    ConfigError,
    InvalidArgument,
    RunBusy,
    StatekernelError,
    StoreError,
)

__all__ = ["AgentSpec", "Worker", "WorkerStats"]

log = logger("statekernel.worker")

AgentSpec = Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None
"""``Kernel`` keyword arguments (tools, providers, hooks, middleware, dispatch,
max_turns), or a function returning them."""


def _default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    """Consumes a run queue of a store and drives its runs durably.

    ``store``: a store with run queues (``RunQueues``), or its URL: ``redis://``,
    ``rediss://``, ``postgresql://`` (None: the configured store).
    ``agent``: the ``Kernel`` keyword arguments the runs need (tools, providers,
    hooks, ...), or a function returning them. ``concurrency``: runs in hand at most.
    ``lease_ttl``: seconds a lease lives without renewal, and how long a crashed
    worker's runs wait before others reclaim them. ``grace``: seconds ``stop()`` lets
    runs reach a clean stopping point. ``timers``: also fire the pause timers and
    deadlines of the store's paused runs, looking every ``timer_every`` seconds (see
    the module). ``health_port``: serve ``/livez``, ``/readyz`` and ``/queue`` over
    HTTP on ``health_host`` (loopback by default; 0: a free port, in ``health_port``
    once serving; needs the ``ui`` extra). ``serve()`` runs until ``stop()``.
    """

    queue: RunQueue
    kernel: Kernel

    def __init__(
        self,
        store: CheckpointStore | str | None = None,
        *,
        queue: str = "default",
        concurrency: int = 100,
        agent: AgentSpec = None,
        lease_ttl: float = 30.0,
        grace: float = 30.0,
        block: float = 1.0,
        max_deliveries: int = 10,
        name: str | None = None,
        timers: bool = False,
        timer_every: float = 1.0,
        health_port: int | None = None,
        health_host: str = "127.0.0.1",
    ) -> None:
        concurrency, lease_ttl, grace, block, max_deliveries = check_worker_options(
            concurrency, lease_ttl, grace, block, max_deliveries
        )
        self.timers = flag("timers", timers)
        self.timer_every = seconds("timer_every", timer_every)
        if health_port is not None and (
            type(health_port) is not int or not 0 <= health_port <= 65535
        ):
            raise InvalidArgument(f"health_port must be None or 0 to 65535, got {health_port!r}")
        self.health_port = health_port
        self.health_host = text("health_host", health_host)
        self.ready = False
        """True while the worker takes work: its last read of the queue succeeded."""
        self.problem: str | None = None
        """Why it is not ready, when a read of the queue failed."""
        self.health_listening = asyncio.Event()
        """Set once the health endpoint listens (on ``health_port``)."""
        text("queue", queue)
        optional_text("name", name, empty=True)
        self.store_spec = store
        self.queue_name = queue
        self.concurrency = concurrency
        self.agent = agent
        self.lease_ttl = lease_ttl
        self.lease_wait = lease_ttl / 3
        self.grace = grace
        self.block = block
        self.max_deliveries = max_deliveries
        self.name = name or _default_name()
        self.stats = WorkerStats()
        self.holding: dict[str, QueueEntry] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._wake = asyncio.Event()
        self._cursor = "0-0"
        self._served = False
        self._ended = False

    # -- control -----------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        """True from ``serve()`` until it returns (what ``/livez`` answers)."""
        return self._served and not self._ended

    def stop(self, *, now: bool = False) -> None:
        """Stop taking work and wind down (``now``: cancel runs without waiting)."""
        self._stop.set()
        self.ready = False
        if now:
            self._hurry.set()
        self._wake.set()

    # -- serving -------------------------------------------------------------------

    async def serve(self) -> WorkerStats:
        """Take and drive runs until ``stop()``; returns what was done. Serves once.

        Returns:
            The worker's counts (``stats``) when it has stopped.

        Raises:
            InvalidArgument: this worker has served already, or an ``agent`` option
                has the wrong type or value (as ``Kernel`` refuses it).
            ConfigError: the store URL is unknown or malformed, the store has no run
                queues, the ``agent`` options name ``store``, ``lease_ttl`` or
                ``busy_timeout`` (the worker sets them), or its tools or hooks are
                refused by ``Kernel`` (two tools of one name, a misspelt hook).
            StoreError: the store failed while the queue was prepared (failures while
                serving are logged and retried).
        """
        if self._served:
            raise InvalidArgument("a Worker serves once: make a new one")
        self._served = True
        store, owned = _open(self.store_spec)
        try:
            if not isinstance(store, RunQueues):
                from statekernel.stores._open import queue_schemes

                raise ConfigError(
                    f"a worker needs a store with run queues ({queue_schemes()}),"
                    f" not {type(store).__name__}"
                )
            self.queue = store.run_queue(self.queue_name)
            try:
                self.kernel = Kernel(
                    store,
                    lease_ttl=self.lease_ttl,
                    busy_timeout=self.lease_wait,
                    **self._kernel_options(),
                )
                try:
                    await self._serve_with_health()
                finally:
                    self._ended, self.ready = True, False
                    await self.kernel.aclose()
            finally:
                await self.queue.aclose()
        finally:
            if owned:
                await store.aclose()
        return self.stats

    def _kernel_options(self) -> dict[str, Any]:
        options = dict(self.agent() if callable(self.agent) else self.agent or {})
        for name in ("store", "lease_ttl", "busy_timeout"):
            if name in options:
                raise ConfigError(
                    f"the worker's agent options must not name {name!r}: the worker sets it"
                )
        return options

    async def _serve_with_health(self) -> None:
        """``_serve``, with the health endpoint while it runs (with ``health_port``)."""
        if self.health_port is None:
            await self._serve()
            return
        from statekernel._workers.health import HealthServer

        async with HealthServer(self, self.health_host, self.health_port) as health:
            self.health_port = health.port
            self.health_listening.set()
            log.info("worker %s: health endpoint on http://%s", self.name, health.where)
            await self._serve()

    async def _serve(self) -> None:
        await self.queue.prepare()
        log.info("worker %s: queue %r, %d at once", self.name, self.queue_name, self.concurrency)
        refresher = asyncio.create_task(self._refresh_loop())
        timers = asyncio.create_task(self._timer_loop()) if self.timers else None
        try:
            await self._take_loop()
        except BaseException:  # cancelled, or a bug: hand the runs back at once
            self.stop(now=True)
            raise
        finally:
            self.stop()
            await self._drain()
            for loop_task in (refresher, timers):
                if loop_task is not None:
                    loop_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await loop_task
            with contextlib.suppress(StoreError):
                await self.queue.leave(self.name)
        log.info("worker %s stopped: %s", self.name, self.stats)

    async def _take_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_claim = 0.0
        while not self.stopping:
            free = self.concurrency - len(self._tasks)
            if free <= 0:
                await self._sleep(None)
                continue
            try:
                entries: list[QueueEntry] = []
                if loop.time() >= next_claim:
                    entries = await self._reclaim(free)
                    next_claim = loop.time() + min(self.lease_ttl / 2, 5.0)
                if not entries:
                    entries = await self.queue.read(self.name, free, round(self.block * 1000))
                self.ready, self.problem = not self.stopping, None
            except StoreError as exc:
                self.ready, self.problem = False, str(exc)
                log.warning("worker %s: %s", self.name, exc)
                await self._sleep(1.0)
                continue
            for entry in entries:
                self._spawn(entry)

    async def _reclaim(self, free: int) -> list[QueueEntry]:
        idle_ms = round(self.lease_ttl * 1000)
        self._cursor, entries = await self.queue.reclaim(self.name, free, idle_ms, self._cursor)
        taken = []
        for entry in entries:
            if entry.deliveries > self.max_deliveries:
                detail = f"delivered {entry.deliveries} times without being settled"
                await self.queue.dead(entry, "deliveries", detail, self.name)
                self.stats.errors += 1
                log.warning("run %s: %s", entry.run_id, detail)
            else:
                taken.append(entry)
        self.stats.reclaimed += len(taken)
        return taken

    def _spawn(self, entry: QueueEntry) -> None:
        metrics.delivered(self.queue_name, entry)
        task = asyncio.create_task(RunTask(self, entry).handle())
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        self.stats.taken += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, len(self._tasks))

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("worker %s: entry handler failed", self.name, exc_info=task.exception())

    async def _sleep(self, seconds: float | None) -> None:
        """Until a run finishes, ``stop()`` is called or ``seconds`` pass."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while self._tasks and not self._hurry.is_set() and loop.time() < deadline:
            await self._sleep(deadline - loop.time())
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _timer_loop(self) -> None:
        while not self.stopping:
            try:
                async for run_id in due_runs(self.kernel.store):
                    if self.stopping:
                        break
                    await self._fire(run_id)
            except StatekernelError as exc:  # the store failed, a damaged listing
                log.warning("worker %s: reading due runs: %s", self.name, exc)
            await self._stopped_within(self.timer_every)

    async def _fire(self, run_id: str) -> None:
        """Fire what is due on ``run_id``; a run that goes on is handed to the queue."""
        try:
            run = await fire_due(self.kernel, run_id)
            if run is not None:
                self.stats.timers_fired += 1
                if not run.is_terminal:
                    await self._hand_on(run_id)
        except RunBusy:
            return  # its owner fires it when it touches it, or this loop does next time
        except StatekernelError as exc:  # deleted meanwhile, damaged, the store failed
            log.warning("worker %s: firing the timer of run %s: %s", self.name, run_id, exc)

    async def _hand_on(self, run_id: str) -> None:
        """Submit a run whose timer fired and that goes on; a store that fails is tried
        again (with nobody else to drive it, the run would wait for the next command)."""
        for delay in (0.1, 0.5, 2.0, 5.0, None):
            try:
                await self.kernel.submit(run_id, queue=self.queue_name)
                return
            except StoreError:
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    async def _stopped_within(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                held = [e.id for run_id, e in self.holding.items() if self.kernel.holds(run_id)]
                await self.queue.refresh(self.name, held)  # a lost lease's entry goes idle
                if held:  # a round trip to the store (at full concurrency, the only one)
                    self.ready, self.problem = not self.stopping, None
            except Exception as exc:  # entries go idle: peers reclaim them once leases end
                self.ready, self.problem = False, f"refreshing its entries: {exc}"
                log.warning("worker %s: refreshing its entries: %s", self.name, exc)
                continue
            try:
                await metrics.sample_depth(self.queue)
            except Exception as exc:  # a metric, not the worker's readiness
                log.warning("worker %s: sampling its queue's depth: %s", self.name, exc)


def _open(store: CheckpointStore | str | None) -> tuple[CheckpointStore, bool]:
    from statekernel.stores import open_store

    if store is None:
        from statekernel._storage.config import default_store_url

        return open_store(default_store_url()), True
    if isinstance(store, str):
        return open_store(store), True
    return store, False
