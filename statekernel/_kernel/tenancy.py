"""Who drives which run in a kernel: its drivers, the leases they hold, and their renewal.

A drive (``Kernel.run``, ``step``) and a command (``send``, ``resume``...) first take the
run's lease (``acquire``: waiting up to ``busy_timeout`` for another live owner, then
``RunBusy``). The kernel keeps one ``RunDriver`` per run it drives (``drivers``); a
command of the same kernel commits between two commits of that driver instead of taking
the lease again (``fresh``). One task renews every lease the kernel holds, every third
of their ttl, and gives back those whose release failed. A lease taken over from another
owner (``Lease.taken_from``) is counted by the drive or command that holds it first
(``statekernel.takeovers``, ``telemetry.record_takeover``). ``close`` lets every run go:
tool calls stopped, results in hand committed, leases given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable

from statekernel._kernel import telemetry
from statekernel._kernel.commit import landed
from statekernel._kernel.delegate import run_tree
from statekernel._kernel.drive import RunDriver, cancel_soon, carry_out_cancel
from statekernel._kernel.driving import Agent
from statekernel._kernel.tenure import Tenure
from statekernel._kernel.timers import settle_due
from statekernel._records.events import Event
from statekernel._records.run import Run
from statekernel._secrets import logger
from statekernel._storage.protocol import (
    Checkpoint,
    CheckpointStore,
    CreatesLeased,
    Lease,
)
from statekernel._storage.shielding import shielded
from statekernel.errors import (
    CancelRequested,
    ConfigError,
    RunBusy,
    RunHasChildren,
    RunNotFound,
    StatekernelError,
    StoreError,
)

__all__ = ["Tenancy"]

_log = logger(__name__)


class Tenancy:
    """The runs a kernel holds: a driver and a lease for each, renewed in the background."""

    def __init__(
        self,
        kernel: Agent,
        store: CheckpointStore,
        owner: str,
        lease_ttl: float,
        busy_timeout: float,
        clock: Callable[[], float],
    ) -> None:
        self.kernel = kernel
        """What the drivers read (tools, hooks, models...)."""
        self.store = store
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.busy_timeout = busy_timeout
        self.clock = clock
        self.drivers: dict[str, RunDriver] = {}
        """The driver of each run a drive of the kernel holds (or waits for)."""
        self.closed = False
        self._unreleased: list[Lease] = []
        self._renewer: asyncio.Task[None] | None = None

    async def close(self) -> None:
        """Stop background tool calls (waiting until each has ended), commit the results
        in hand and give every lease back."""
        self.closed = True
        drivers, self.drivers = list(self.drivers.values()), {}
        for driver in drivers:
            if driver.seats.driving:
                driver.lose()  # a drive of another task has it: it must stop committing
            await driver.stop_tasks()
            await self._commit_held(driver)
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        for driver in drivers:
            await self._release(driver)
        await self._release_again()  # a lease that cannot be given back now expires
        self._unreleased = []

    async def create(self, checkpoint: Checkpoint) -> Tenure | None:
        """Commit a new run (revision 0) with its lease taken in the same step, where the
        store can (``CreatesLeased``); the lease held. None when the store cannot, or when
        its attempt failed without creating the run: the caller creates it the usual way.

        Where the run was created without its lease (its id kept a lease record an owner
        may hold) or a store failure leaves it unknown whether the lease came with it,
        the lease is taken as a drive takes it (waiting for a holder up to
        ``busy_timeout``). A store failure is settled from the head, as a commit's is: the
        run is there and is this very one, another run has the id (``ConflictError``),
        or nothing landed (None)."""
        store, run = self.store, checkpoint.run
        if not isinstance(store, CreatesLeased):
            return None
        began = self.clock()
        task = asyncio.ensure_future(
            store.create_leased(checkpoint, self.owner, ttl=self.lease_ttl)
        )
        try:
            lease = await shielded(task)
        except asyncio.CancelledError:  # created meanwhile: the run stays, its lease goes back
            if not task.cancelled() and task.exception() is None:
                taken = task.result()
                if taken is not None:
                    await self.release_lease(taken)
            raise
        except StoreError:
            created = await landed(store, checkpoint)  # settled as a commit is
            if created is None:
                raise  # the store cannot tell now whether the run was created
            if not created:
                return None
            lease = None
        if lease is None:
            return await self.acquire(run.run_id, share=False)
        return Tenure(store, lease, self.lease_ttl, began, self.clock)

    @contextlib.asynccontextmanager
    async def driver(
        self, run_id: str, created: Run | None = None, tenure: Tenure | None = None
    ) -> AsyncIterator[RunDriver]:
        """This kernel's driver of the run for one drive (``run``, ``step``), holding the
        run's lease (taken, or shared with a drive of this kernel that holds it already);
        the lease goes back once no drive of this kernel needs the driver.

        ``created``: the run as this kernel just committed it (revision 0); the driver
        starts from it instead of loading the head (the drive's first commit, made on
        revision 0, is refused if anyone committed in between). ``tenure``: its lease,
        taken with it (``create``)."""
        driver, fresh = await self._claim(run_id, created, tenure)
        try:
            async with driver.seats.taken() as waited:
                try:
                    if not fresh or waited:  # a driver just built from the head needs no reload
                        await driver.reset(await self.store.load(run_id))
                    yield driver
                finally:
                    last = not driver.seats.awaited  # no other task waits for this driver
                    if last and not driver.busy and self.drivers.get(run_id) is driver:
                        del self.drivers[run_id]
        finally:
            if driver.idle and self.drivers.get(run_id) is not driver:
                await self._release(driver)

    async def _claim(
        self, run_id: str, created: Run | None, taken: Tenure | None
    ) -> tuple[RunDriver, bool]:
        """This kernel's driver of the run, holding the run's lease (``taken``, or taken
        now); True if just built (from ``created``, else from the head).

        Waits up to ``busy_timeout`` while another owner holds the lease.
        """
        tenure = taken if taken is not None else await self.acquire(run_id, share=True)
        if tenure is None:
            return self.drivers[run_id], False
        try:
            loaded = created if created is not None else await self.store.load(run_id)
        except BaseException:
            await self.release_lease(tenure.lease)
            raise
        driver = RunDriver(self.kernel, loaded, tenure)
        driver.lets_go_at_rest = True  # the driver of this kernel's drives (run, step)
        self.drivers[run_id] = driver
        self._keep_renewing()
        return driver, True

    async def acquire(
        self, run_id: str, *, share: bool, wait: float | None = None
    ) -> Tenure | None:
        """The run's lease for this kernel (None: a driver of this kernel holds it and
        ``share`` allows using that driver), after waiting for another owner if need be
        (up to ``wait`` seconds, default ``busy_timeout``).

        A drive that gave the lease up with the commit that brought the run to rest may
        still be suspended at a ``yield`` of that commit's events, its caller acting on
        the run (``resume`` at ``run_paused``): the lease taken is then handed to that
        drive's driver, which goes on from whatever the command commits, as it would
        have had it kept the lease."""
        limit = self.busy_timeout if wait is None else wait
        loop = asyncio.get_running_loop()
        started = loop.time()
        delay = 0.01
        told = False
        while True:
            driver = self.drivers.get(run_id)
            if share and driver is not None and not driver.lost:
                return None
            try:
                tenure = await self._acquire_once(run_id)
            except RunBusy as busy:
                waited = loop.time() - started
                if waited + delay > limit:
                    raise RunBusy(run_id, busy.owner, waited) from None
                if not told:  # said once, so a wait is never silent
                    told = True
                    _log.warning(
                        "run %s is held by %s; waiting up to %.0f s for it",
                        run_id,
                        busy.owner,
                        limit,
                        extra={"run_id": run_id},
                    )
            else:
                live = self.drivers.get(run_id)
                if share and live is not None and live.released and live.seats.driving:
                    await self._rearm(live, tenure)
                    return None
                return tenure
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    async def _rearm(self, driver: RunDriver, tenure: Tenure) -> None:
        """Hand ``tenure`` to ``driver``, which gave its lease up with a commit while its
        drive goes on, at the run's head (another owner may have committed meanwhile)."""
        try:
            head = await self.store.load(driver.run.run_id)
            await driver.rearm(tenure, head)
        except BaseException:
            await self.release_lease(tenure.lease)
            raise
        telemetry.record_takeover(head, tenure.takeover())
        self._keep_renewing()

    async def _acquire_once(self, run_id: str) -> Tenure:
        """One attempt at the run's lease; a lease given to a cancelled caller goes back."""
        began = self.clock()
        task = asyncio.ensure_future(self.store.acquire(run_id, self.owner, ttl=self.lease_ttl))
        try:
            lease = await shielded(task)
            return Tenure(self.store, lease, self.lease_ttl, began, self.clock)
        except asyncio.CancelledError:  # the acquire has ended (shielded): did it take the lease?
            if not task.cancelled() and task.exception() is None:
                await self.release_lease(task.result())
            raise

    async def _commit_held(self, driver: RunDriver) -> None:
        """Commit the results a driver still holds before it lets the run go (else the
        next owner would find those calls uncertain); a store that fails leaves them so."""
        if driver.seats.driving:
            return  # a drive of another task still has it: that drive commits them
        with contextlib.suppress(StatekernelError):
            await driver.commit_held()

    async def _release(self, driver: RunDriver) -> None:
        lease = driver.lease
        driver.lose()  # a drive still using it (aclose meanwhile) commits nothing more
        if lease is not None:
            await self.release_lease(lease)

    async def release_lease(self, lease: Lease) -> None:
        """Give ``lease`` back; one the store cannot take back now is given back again
        by the renewal loop and by ``close`` (until then it expires)."""
        try:
            await self.store.release(lease)
        except RunNotFound:
            return  # the run is gone, and its lease with it
        except StatekernelError:  # tried again by the renewal loop and by aclose
            self._unreleased.append(lease)
            if not self.closed:
                self._keep_renewing()

    async def _release_again(self) -> None:
        """Give back the leases whose release failed (a run another process waits for)."""
        leases, self._unreleased = self._unreleased, []
        for lease in leases:
            await self.release_lease(lease)

    def _drives(self, run_id: str, driver: RunDriver) -> bool:
        """True while ``driver`` is this kernel's driver of the run."""
        return self.drivers.get(run_id) is driver

    def holds(self, run_id: str) -> bool:
        """True while a drive of this kernel holds the run's lease (and has not lost it)."""
        driver = self.drivers.get(run_id)
        return driver is not None and not driver.lost

    def _keep_renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.ensure_future(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Renew the leases of the runs this kernel drives, every third of their ttl."""
        while self.drivers or self._unreleased:
            await asyncio.sleep(self.lease_ttl / 3)
            await self._release_again()
            for driver in list(self.drivers.values()):
                with contextlib.suppress(StatekernelError):  # unreachable now: next round
                    await driver.renew_lease()
                    await self._look_for_cancel(driver)

    async def _look_for_cancel(self, driver: RunDriver) -> None:
        """Tell ``driver`` of a cancel request the store keeps for its run (``CancelsRuns``):
        a drive waiting for a long call stops within a third of the lease's ttl."""
        request = await driver.committer.kept_cancel(driver.run.run_id)
        if request is not None:
            cancel_soon(driver, request)

    @contextlib.asynccontextmanager
    async def fresh(
        self, run_id: str, *, settled: list[Event] | None = None
    ) -> AsyncIterator[RunDriver]:
        """A one-off driver at the run's last commit, for commands (send, resume, ...).

        Where a driver of this kernel holds the run, the command commits under its lease
        between two of its commits (it holds the driver's ``commit_lock``), and the
        driver goes on from the command's commit (``adopt``): it never conflicts, and
        its calls run on. A command never waits for a ``run`` generator, which may be
        suspended at a ``yield`` in the caller's own loop, only for a commit in flight.
        Otherwise the command takes a lease of its own, after waiting for another owner,
        and gives it back at the end; what is due on the run is done first
        (``settle_due``: its events go to ``settled``).
        """
        while True:
            tenure = await self.acquire(run_id, share=True)
            if tenure is not None:
                break
            live = self.drivers[run_id]
            if live.seats.commanding():  # a hook of this very command
                raise RunBusy(run_id, self.owner)
            current = functools.partial(self._drives, run_id, live)
            async with live.command(current) as driver:
                if driver is None:
                    continue  # the drive let the run go meanwhile: take it afresh
                yield driver  # the drive goes on from whatever of the command landed
                return
        try:
            driver = RunDriver(self.kernel, await self.store.load(run_id), tenure)
            telemetry.record_takeover(driver.run, tenure.takeover())
            done = await settle_due(driver)  # a passed deadline, a due pause timer: first
            if settled is not None:
                settled.extend(done)
            try:
                yield driver
            except CancelRequested:  # the command was refused: the request is carried out
                with contextlib.suppress(StatekernelError):  # else by the next who holds it
                    await carry_out_cancel(driver)
                raise
        finally:
            await self.release_lease(tenure.lease)

    async def delete_tree(
        self,
        run_id: str,
        children: bool,
        wait: float,
        approve: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> list[str]:
        """Delete the run ``run_id`` (with its child runs: ``children``, else
        ``RunHasChildren``) as ``Kernel.delete`` does, each run under its lease, waiting
        ``wait`` seconds for a run someone holds. ``approve`` is
        given the ids of the whole tree (the run first) once every run of it is held, so
        the tree it sees is the one deleted (no child run can start meanwhile); it
        raises to delete nothing."""
        held: dict[str, Tenure] = {}
        try:
            while True:  # every run of the tree under its lease, parents before children
                tree = await run_tree(self.store, run_id)
                descendants = [run.run_id for _, run in tree[1:]]
                if descendants and not children:
                    raise RunHasChildren(run_id, descendants)
                missing = [run for _, run in tree if run.run_id not in held]
                if not missing:
                    break
                for run in missing:  # as read before its lease: a dead owner's last commit
                    with contextlib.suppress(RunNotFound):  # deleted meanwhile
                        tenure = await self.acquire(run.run_id, share=False, wait=wait)
                        assert tenure is not None
                        held[run.run_id] = tenure
                        telemetry.record_takeover(run, tenure.takeover())
                if run_id not in held:
                    raise RunNotFound(run_id)
            if approve is not None:
                answer = approve([run.run_id for _, run in tree])
                if not inspect.isawaitable(answer):
                    raise ConfigError(
                        f"approve returned {answer!r}, which cannot be awaited: it must be an"
                        " async function; nothing was deleted"
                    )
                await answer
            deleted: list[str] = []
            for _, run in reversed(tree):
                await held[run.run_id].ensure(self.kernel.lease_margin)  # still ours (LeaseLost)
                if await self.store.delete(run.run_id):
                    deleted.append(run.run_id)
            return deleted
        finally:
            for tenure in held.values():
                await self.release_lease(tenure.lease)
