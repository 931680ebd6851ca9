"""OS locks on open files, the same on every platform: what the stores on one host take
to prove an owner alive (``owners``, ``holders``) and to order a run's commits (the
file store).

Where Python has ``fcntl`` (Linux, macOS, the BSDs) a lock is ``flock``, exactly as it
always was: it belongs to the open file it was taken on, shared or exclusive, and the OS
releases it when that file is closed or the process dies. Elsewhere (Windows; a POSIX
Python built without ``fcntl``) it is a lock on the file's first byte, through
``msvcrt.locking`` or ``os.lockf``, which the OS also releases when the process dies.
Those have no shared locks between processes, and ``os.lockf``'s belong to the whole
process (closing any open file of the file drops them), so this module keeps what
``flock`` promises on top of them: the locks of this process are counted per file
(shared ones together, an exclusive one alone, each open file its own holder), the OS
lock is taken by the first holder and given back by the last, and a file closed while
another open file of this process still holds the lock is closed only once that lock is
given back. Between processes a shared lock is then an exclusive one: the readers of two
processes take turns.

Every open file locked here, or tested with ``locked_elsewhere``, is closed with
``close``.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time

__all__ = ["BACKEND", "SHARED_ACCESS", "close", "lock", "locked_elsewhere", "try_lock", "unlock"]

_BUSY = frozenset({errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK, errno.EDEADLK})
"""What a byte-range lock's OS call fails with while another process holds the lock."""

try:
    import fcntl
except ImportError:  # Windows, or a Python built without it
    BACKEND = "msvcrt" if sys.platform == "win32" else "lockf"
else:
    BACKEND = "flock"
"""Which OS lock this process takes: ``"flock"``, ``"msvcrt"`` or ``"lockf"``."""

SHARED_ACCESS = os.O_RDWR if BACKEND == "lockf" else os.O_RDONLY
"""How to open a file to lock it shared: ``os.lockf`` locks only a file open for writing."""


# -- the OS's lock on a file's first byte (no fcntl) ----------------------------------------

if sys.platform == "win32":
    import msvcrt

    def _os_try(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            if exc.errno in _BUSY:
                return False
            raise
        return True

    def _os_lock(fd: int) -> None:
        pause = 0.001
        while not _os_try(fd):  # LK_LOCK gives up after ten seconds
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _os_unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

    def _os_held(fd: int) -> bool:
        if not _os_try(fd):
            return True
        _os_unlock(fd)
        return False

else:

    def _os_try(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            os.lockf(fd, os.F_TLOCK, 1)
        except OSError as exc:
            if exc.errno in _BUSY:
                return False
            raise
        return True

    def _os_lock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        os.lockf(fd, os.F_LOCK, 1)

    def _os_unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        os.lockf(fd, os.F_ULOCK, 1)

    def _os_held(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)  # F_TEST needs no write access: a read-only file
        try:
            os.lockf(fd, os.F_TEST, 1)
        except OSError as exc:
            if exc.errno in _BUSY:
                return True
            raise
        return False


class _Locked:
    """The locks this process holds on one file (byte-range backends only)."""

    def __init__(self) -> None:
        self.holders: dict[int, bool] = {}
        """Open file (fd) -> whether it holds the lock shared."""
        self.os_fd: int | None = None
        """The open file the OS lock was taken on (None while it is being taken)."""
        self.parked: list[int] = []
        """Open files closed while the lock was held: closed when it is given back."""

    def joins(self, shared: bool) -> bool:
        """Whether a new holder (``shared`` or not) can hold the lock with these."""
        return shared and self.os_fd is not None and all(self.holders.values())


_files: dict[tuple[int, int], _Locked] = {}
_changed = threading.Condition()


def _reset_in_child() -> None:
    """In a forked child: it holds none of its parent's byte-range locks."""
    global _changed
    _files.clear()
    _changed = threading.Condition()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def _key(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _give_back(key: tuple[int, int], entry: _Locked) -> None:
    """With the last holder gone: release the OS lock and close the parked files."""
    try:
        if entry.os_fd is not None:
            _os_unlock(entry.os_fd)
    finally:
        del _files[key]
        for fd in entry.parked:
            os.close(fd)
        _changed.notify_all()


def _drop(key: tuple[int, int], fd: int) -> None:
    """``fd`` holds the lock on ``key`` no more (under ``_changed``)."""
    entry = _files.get(key)
    if entry is None or entry.holders.pop(fd, None) is None:
        return
    if not entry.holders:
        _give_back(key, entry)


# -- the seam ------------------------------------------------------------------------------


def try_lock(fd: int, *, shared: bool = False) -> bool:
    """Lock the open file ``fd`` without waiting (exclusive unless ``shared``): False when
    another open file holds a lock that excludes it.

    Raises:
        OSError: the OS refused for another reason.
    """
    if BACKEND == "flock":
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    key = _key(fd)
    with _changed:
        entry = _files.get(key)
        if entry is not None:
            if not entry.joins(shared):
                return False
            entry.holders[fd] = shared
            return True
        if not _os_try(fd):
            return False
        entry = _files[key] = _Locked()
        entry.holders[fd], entry.os_fd = shared, fd
        return True


def lock(fd: int, *, shared: bool = False) -> None:
    """Lock the open file ``fd`` (exclusive unless ``shared``), waiting for the holders
    of a lock that excludes it.

    Raises:
        OSError: the OS refused.
    """
    if BACKEND == "flock":
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        return
    key = _key(fd)
    with _changed:
        while True:
            entry = _files.get(key)
            if entry is None:
                break
            if entry.joins(shared):
                entry.holders[fd] = shared
                return
            _changed.wait()
        entry = _files[key] = _Locked()  # taken by this process: the others wait
        entry.holders[fd] = shared
    try:
        _os_lock(fd)  # outside the mutex: another process may hold it a while
    except BaseException:
        with _changed:
            _drop(key, fd)
        raise
    with _changed:
        entry.os_fd = fd
        _changed.notify_all()  # shared takers may join now


def unlock(fd: int) -> None:
    """Give up the lock the open file ``fd`` holds (nothing if it holds none)."""
    if BACKEND == "flock":
        fcntl.flock(fd, fcntl.LOCK_UN)
        return
    key = _key(fd)
    with _changed:
        _drop(key, fd)


def locked_elsewhere(fd: int) -> bool:
    """Whether another open file holds an exclusive lock on ``fd``'s file; takes no lock
    for longer than the test, and works on a file opened read-only.

    Raises:
        OSError: the OS refused the test.
    """
    if BACKEND == "flock":
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    key = _key(fd)
    with _changed:
        entry = _files.get(key)
        if entry is not None:  # this process holds it: it answers for every process
            return not entry.joins(True)
        return _os_held(fd)


def close(fd: int) -> None:
    """Close the open file ``fd``, with the lock it holds (as ``os.close`` does with
    ``flock``); where closing would drop a lock another open file of this process still
    holds, ``fd`` is closed when that lock is given back."""
    if BACKEND == "flock":
        os.close(fd)
        return
    try:
        key = _key(fd)
    except OSError:
        os.close(fd)  # not open (EBADF): as os.close says
        return
    parked = False
    try:
        with _changed:
            _drop(key, fd)
            entry = _files.get(key)
            if entry is not None:
                entry.parked.append(fd)
                parked = True
    finally:
        if not parked:
            os.close(fd)
