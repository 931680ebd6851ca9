"""Leases of the stores that live on one host (memory, file, SQLite).

A run's lease is a record (token, owner, expiry) that the store keeps beside the run
and changes only inside the same lock or transaction as its commits. ``take`` gives
the lease to a new owner with the next token unless a live owner holds it;
``check_fence`` is what a commit checks before it writes.

An owner proves it is alive with an OS lock: while it holds leases in a store, it
holds a lock (``oslock``: ``flock``, or a byte-range lock where Python has no
``fcntl``) on a file of its own in the store's owners folder. The kernel holds
that lock in its process, so the OS releases it the moment the process dies; another
process that finds the file unlocked knows the owner is dead and takes its leases
over at once. An owner of another process whose lock is held is alive, and its run is
never taken over, whatever any clock says: a process whose wall clock is an hour ahead
(an NTP step, a migrated VM) cannot mistake a live owner's lease for an expired one.

Between owners of one process (two kernels on one store, or an owner that acquired and
never renewed) the lock proves nothing, so there the lease lasts until it expires. That
is measured on the monotonic clock, as the owner measures it before each effect
(``statekernel._kernel.tenure``): a wall-clock step never ends a lease the owner still
counts on. The record keeps a wall-clock expiry too (``time.time``), for the doctor. A
store given a ``Clock`` (``statekernel.testing.ManualClock`` in tests, so a lease
expires when a test moves the clock on rather than after a real sleep) measures every
expiry on it instead. Both sides read the same clock.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs

from statekernel._storage.protocol import Lease
from statekernel.errors import LeaseLost, RunBusy, StoreError
from statekernel.stores._host import oslock as _oslock
from statekernel.stores._private import NOFOLLOW, NONBLOCK, private_folder

__all__ = [
    "Clock",
    "HostLeased",
    "HostLeases",
    "LeaseChange",
    "LeaseRecord",
    "OwnerProofs",
    "check_fence",
    "fenced",
    "local_owner",
    "released",
    "renewed",
    "take",
    "taken_from",
]


Clock = Callable[[], float]
"""What lease expiry is measured on, when a store is given one: a call that returns the
current time in seconds since the epoch, like ``time.time``."""


@attrs.frozen
class LeaseRecord:
    """A run's lease as stored: the last token given, its owner (None once released)
    and when it expires (seconds since the epoch)."""

    token: int
    owner: str | None
    expires: float


def take(
    record: LeaseRecord | None,
    run_id: str,
    owner: str,
    ttl: float,
    now: float,
    alive: Callable[[str], bool],
    held: Callable[[LeaseRecord], bool] | None = None,
) -> LeaseRecord:
    """The record giving the lease to ``owner``, or ``RunBusy`` while a live owner holds it.

    An owner of this process holds it while ``held`` says so (unless given: until it
    expires on ``now``'s clock); an owner of another process holds it for as long as
    ``alive`` proves it alive (its OS lock), whatever the expiry time says.
    """
    if record is not None and record.owner is not None:
        holder = record.owner
        if local_owner(holder):
            busy = held(record) if held is not None else record.expires > now
        else:
            busy = alive(holder)
        if busy:
            raise RunBusy(run_id, holder)
    return LeaseRecord((record.token if record is not None else 0) + 1, owner, now + ttl)


def taken_from(record: LeaseRecord | None, owner: str) -> str | None:
    """Whose lease ``owner`` took over by replacing ``record`` (``take`` gave it): its
    holder, unless it was given back (None) or ``owner`` itself."""
    if record is None or record.owner is None or record.owner == owner:
        return None
    return record.owner


_local: collections.Counter[str] = collections.Counter()
"""Leases held by each owner of this process, over every store it opened."""
_local_mutex = threading.Lock()
_steady: dict[str, dict[tuple[str, str], float]] = {}
"""Until when (``time.monotonic``) the leases of each owner of this process last, by run
id and token, as the stores without a clock of their own gave or renewed them."""


def local_owner(owner: str) -> bool:
    """True while ``owner`` is an owner of this process holding a lease in some store."""
    return _local[owner] > 0


def _count(owner: str, change: int) -> None:
    with _local_mutex:
        _local[owner] += change
        if _local[owner] <= 0:
            del _local[owner]
            _steady.pop(owner, None)


def _lasts(owner: str, run_id: str, token: str, until: float) -> None:
    """Note that ``owner``'s lease (``token``) on ``run_id`` lasts until ``until`` at least."""
    with _local_mutex:
        if owner in _local:
            leases = _steady.setdefault(owner, {})
            leases[run_id, token] = max(leases.get((run_id, token), until), until)


def _ended(owner: str, run_id: str, token: str) -> None:
    with _local_mutex:
        _steady.get(owner, {}).pop((run_id, token), None)


def _steady_held(run_id: str, record: LeaseRecord, fallback: bool) -> bool:
    """Whether an owner of this process still holds ``record`` on the monotonic clock
    (``fallback`` when no store without a clock of its own gave it)."""
    with _local_mutex:
        until = _steady.get(record.owner or "", {}).get((run_id, str(record.token)))
    return fallback if until is None else until > time.monotonic()


def _current(record: LeaseRecord | None, lease: Lease) -> bool:
    return record is not None and record.owner == lease.owner and str(record.token) == lease.token


def check_fence(record: LeaseRecord | None, lease: Lease, expected_revision: int) -> None:
    """Raise ``LeaseLost`` unless ``lease`` is the run's current lease."""
    if not _current(record, lease):
        raise LeaseLost(lease.run_id, expected_revision, lease.token)


def renewed(record: LeaseRecord | None, lease: Lease, ttl: float, now: float) -> LeaseRecord:
    """The record with the lease extended, or ``LeaseLost`` if it moved on."""
    if record is None or not _current(record, lease):
        raise LeaseLost(lease.run_id, -1, lease.token)
    return attrs.evolve(record, expires=now + ttl)


def released(record: LeaseRecord | None, lease: Lease) -> LeaseRecord | None:
    """The record with the lease given up (unchanged if it is not current)."""
    if record is None or not _current(record, lease):
        return record
    return LeaseRecord(record.token, None, 0.0)


_all_proofs: weakref.WeakSet[OwnerProofs] = weakref.WeakSet()
"""Every ``OwnerProofs`` of this process (a forked child lets go of their locks)."""


def _forget_in_child() -> None:
    """In a forked child: close the inherited owner locks (the parent keeps holding them,
    and once it dies they are free, whatever children it left) and count no owner."""
    for proofs in list(_all_proofs):
        held, proofs._held = proofs._held, {}
        for fd, _ in held.values():
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
    _local.clear()
    _steady.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class OwnerProofs:
    """OS locks that prove owners alive, in ``folder`` (None: owners of this process only,
    whose leases end by release or expiry; an owner no store of this process counts is
    gone).

    ``hold``/``drop`` count the leases an owner of this process holds in the store and
    keep its lock while there is any; ``alive`` tells whether an owner (of any process)
    still holds its lock.
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._held: dict[str, tuple[int, int]] = {}  # owner -> (fd, leases)
        self._mutex = threading.Lock()
        _all_proofs.add(self)

    def lock_path(self, owner: str) -> Path:
        """The file whose OS lock proves ``owner`` alive."""
        assert self.folder is not None
        digest = hashlib.blake2b(owner.encode("utf-8", "surrogatepass"), digest_size=16)
        return self.folder / f"{digest.hexdigest()}.lock"

    def hold(self, owner: str) -> None:
        """Count one more lease of ``owner``; take its lock with the first one."""
        with self._mutex:
            fd, count = self._held.get(owner, (-1, 0))
            if count == 0 and self.folder is not None:
                fd = self._lock(self.lock_path(owner))
            self._held[owner] = (fd, count + 1)
            _count(owner, 1)

    def drop(self, owner: str) -> None:
        """Count one lease of ``owner`` less; release its lock with the last one."""
        with self._mutex:
            fd, count = self._held.get(owner, (-1, 0))
            if count == 0:
                return
            _count(owner, -1)
            if count > 1:
                self._held[owner] = (fd, count - 1)
                return
            self._held.pop(owner, None)
            if fd >= 0:
                self._unlock(owner, fd)

    def _unlock(self, owner: str, fd: int) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.lock_path(owner))
        _oslock.close(fd)
        if not self._held and self.folder is not None:
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only when empty: other owners' files keep it

    def alive(self, owner: str) -> bool:
        """False once ``owner``'s process is proven dead (its lock is free or gone)."""
        if owner in self._held or local_owner(owner):
            return True
        if self.folder is None:
            return False  # owners of this process only, and this one holds nothing
        path = self.lock_path(owner)
        try:
            fd = os.open(path, os.O_RDWR | NOFOLLOW | NONBLOCK)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"cannot check the owner lock {str(path)!r}: {exc}") from exc
        try:
            if not _oslock.try_lock(fd):
                return True
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                return False
            if not same:  # the owner made a new file meanwhile: ask that one
                return self.alive(owner)
            with contextlib.suppress(OSError):
                os.unlink(path)  # under the lock: never a newer file of a live owner
            return False
        finally:
            _oslock.close(fd)

    def _lock(self, path: Path) -> int:
        try:
            while True:
                private_folder(path.parent)
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW | NONBLOCK, 0o600)
                except FileNotFoundError:
                    continue  # another process removed the empty folder meanwhile
                _oslock.lock(fd)
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        return fd
                _oslock.close(fd)  # a checker removed the file before we locked it: again
        except OSError as exc:
            raise StoreError(f"cannot take the owner lock {str(path)!r}: {exc}") from exc

    def close(self) -> None:
        """Release every lock (the store closes)."""
        with self._mutex:
            held, self._held = self._held, {}
            for owner, (fd, count) in held.items():
                _count(owner, -count)
                if fd >= 0:
                    self._unlock(owner, fd)


LeaseChange = Callable[[LeaseRecord | None], LeaseRecord | None]
"""A change of a run's lease record: the record as stored -> the record to store."""


class HostLeases:
    """``acquire``, ``renew`` and ``release`` of a store on one host.

    ``apply(run_id, change)`` is the store's own atomic step: read the run's lease
    record, store ``change(record)`` and return it, all under the lock or transaction
    its commits take; it raises ``RunNotFound`` when there is no such run. Owners
    prove they are alive with ``OwnerProofs`` in ``folder``. Leases of owners of this
    process expire on the monotonic clock (the record keeps a ``time.time`` expiry),
    or on ``clock`` when one is given.
    """

    def __init__(
        self,
        folder: Path | None,
        apply: Callable[[str, LeaseChange], Awaitable[LeaseRecord | None]],
        *,
        clock: Clock | None = None,
    ) -> None:
        self.proofs = OwnerProofs(folder)
        self.clock: Clock = time.time if clock is None else clock
        self._steady = clock is None
        self._apply = apply

    def _held(self, run_id: str) -> Callable[[LeaseRecord], bool] | None:
        if not self._steady:
            return None  # expiry on the given clock
        return lambda record: _steady_held(run_id, record, record.expires > self.clock())

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        """Take the run's lease; a holder whose process died is taken over at once."""
        lease = await self.create(run_id, owner, ttl, functools.partial(self._apply, run_id))
        if lease is None:
            raise AssertionError("acquiring a lease wrote no lease record")
        return lease

    async def create(
        self,
        run_id: str,
        owner: str,
        ttl: float,
        write: Callable[[LeaseChange], Awaitable[LeaseRecord | None]],
    ) -> Lease | None:
        """Take the run's lease through ``write``, the store's atomic step that stores
        the change of the run's lease record (``acquire``: alone; a store's
        ``create_leased``: with the commit that creates the run). None when ``write``
        stored no lease for this owner (a creation whose id kept a held lease record)."""
        began = time.monotonic()
        self.proofs.hold(owner)
        held, alive = self._held(run_id), self.proofs.alive
        found: list[LeaseRecord | None] = [None]  # the record the change that wrote saw

        def change(old: LeaseRecord | None) -> LeaseRecord:
            new = take(old, run_id, owner, ttl, self.clock(), alive, held)
            found[0] = old
            return new

        try:
            record = await write(change)
        except BaseException:
            self.proofs.drop(owner)
            raise
        if record is None:
            self.proofs.drop(owner)
            return None
        if self._steady:
            _lasts(owner, run_id, str(record.token), began + ttl)
        return Lease(run_id, owner, str(record.token), taken_from=taken_from(found[0], owner))

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        """Extend the lease (``LeaseLost`` if it moved on)."""
        began = time.monotonic()
        await self._apply(lease.run_id, lambda old: renewed(old, lease, ttl, self.clock()))
        if self._steady:
            _lasts(lease.owner, lease.run_id, lease.token, began + ttl)

    async def release(self, lease: Lease) -> None:
        """Give the lease up and, with the owner's last lease here, its owner lock."""
        try:
            await self._apply(lease.run_id, lambda old: released(old, lease))
        finally:
            self.let_go(lease)

    def let_go(self, lease: Lease) -> None:
        """What ``release`` does in this process, for a lease given up in the store with a
        commit (``ReleasesWithCommit``): with the owner's last lease, its owner lock."""
        _ended(lease.owner, lease.run_id, lease.token)
        self.proofs.drop(lease.owner)

    async def fence(self, run_id: str) -> int:
        """The largest fencing token given for the run (0: none yet)."""
        record = await self._apply(run_id, lambda old: old)
        return 0 if record is None else record.token

    async def keep_fence(self, run_id: str, at_least: int) -> None:
        """Make every later token of the run larger than ``at_least``."""
        await self._apply(run_id, lambda old: fenced(old, at_least))

    def close(self) -> None:
        """Release every owner lock of this process (the store closes)."""
        self.proofs.close()


def fenced(record: LeaseRecord | None, at_least: int) -> LeaseRecord:
    """``record`` with a token no smaller than ``at_least`` (a holder of a smaller one
    has lost its lease: its commits are refused)."""
    if record is None:
        return LeaseRecord(at_least, None, 0.0)
    return record if record.token >= at_least else attrs.evolve(record, token=at_least)


class HostLeased:
    """A store's ``acquire``, ``renew`` and ``release``, kept by its ``HostLeases``
    (``self._leases``). A store that cannot write overrides ``_refuse_leases``."""

    _leases: HostLeases

    def _refuse_leases(self) -> None:
        """Raise when this store gives no leases (it cannot write)."""

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        """Take the run's lease; a holder of another process whose owner lock is free
        (the process died) is taken over at once, one whose lock is held never; between
        owners of one process a lease ends by release or expiry."""
        self._refuse_leases()
        return await self._leases.acquire(run_id, owner, ttl=ttl)

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        """Extend the lease (``LeaseLost`` if it moved on)."""
        await self._leases.renew(lease, ttl=ttl)

    async def release(self, lease: Lease) -> None:
        """Give the lease up and, with the owner's last lease here, its owner lock."""
        await self._leases.release(lease)

    async def fence(self, run_id: str) -> int:
        """The largest fencing token given for the run (``KeepsFences``)."""
        return await self._leases.fence(run_id)

    async def keep_fence(self, run_id: str, at_least: int) -> None:
        """Make every later token of the run larger than ``at_least`` (``KeepsFences``)."""
        self._refuse_leases()
        await self._leases.keep_fence(run_id, at_least)
