"""What ``statekernel doctor`` finds and the probe each kind of store gets.

A ``Probe`` names a store's runs from its own storage (so a run whose head is damaged
is still found, and named when its key or folder says its id), reads each run's lease
as stored, and checks the store's settings: SQLite's journal mode, synchronous level
and integrity, Redis's persistence and eviction, Postgres's synchronous_commit and
fsync, the file store's permissions. Runs
are read through a store that cannot write (``probe.store``): a SQLite database is
opened read-only, a Redis store is never listed through ``list_runs`` (a listing
repairs the run index), and owner locks are only tested, never taken over or removed."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, Protocol

import attrs

from statekernel._storage.protocol import CheckpointStore
from statekernel.errors import (
    StoreError,
)
from statekernel.stores._host import oslock as _oslock
from statekernel.stores._host.owners import OwnerProofs

__all__ = [
    "DAMAGED",
    "OK",
    "SHOWN",
    "WARNING",
    "Finding",
    "LeaseView",
    "Probe",
    "RunRef",
    "Status",
    "host_lease",
    "owner_alive",
    "permissions",
]

Status = Literal["ok", "warning", "damaged"]
OK: Status = "ok"
WARNING: Status = "warning"
DAMAGED: Status = "damaged"

SHOWN = 5
"""How many paths a permissions finding names before it counts the rest."""


@attrs.frozen
class Finding:
    """One result of the doctor: which ``check``, on what ``subject`` (a run id, a
    path, a store URL), its ``status`` and a one-line ``detail``."""

    check: str
    subject: str
    status: Status
    detail: str


@attrs.frozen
class RunRef:
    """A run found in a store's storage: its id (None when nothing names it) and the
    subject to report it under; ``problem`` when it cannot be checked further."""

    run_id: str | None
    subject: str
    problem: Finding | None = None


@attrs.frozen
class LeaseView:
    """A run's lease as stored: the last fencing token, its owner (None: free), seconds
    until it expires (negative: expired; None: unknown) and whether the owner's
    process is known alive (True), known dead (False) or neither (None)."""

    token: str | None
    owner: str | None
    expires_in: float | None = None
    alive: bool | None = None


class Probe(Protocol):
    """The store-specific part of the doctor."""

    subject: str
    """How findings about the store name it (a path or a redacted URL)."""

    store: CheckpointStore | None
    """A store that reads the runs without writing anything (None: nothing to read)."""

    local_errors: bool
    """Whether a ``StoreError`` reading one run concerns that run alone (a file that
    cannot be read) rather than the whole store (a lost connection)."""

    async def settings(self) -> list[Finding]:
        """Findings about the store as a whole; runs before anything else is read."""
        ...

    async def runs(self) -> list[RunRef]:
        """Every run the storage holds, sorted by subject."""
        ...

    async def lease(self, run_id: str) -> LeaseView | None:
        """The run's lease (None: it never had one)."""
        ...

    async def cross_checks(self) -> list[Finding]:
        """Findings that compare the runs found by ``runs`` with the rest of the store."""
        ...

    async def aclose(self) -> None:
        """Close what the probe opened."""
        ...


# -- shared pieces -----------------------------------------------------------------


def permissions(paths: Iterable[Path], check: str, subject: str) -> Finding:
    """Whether any of ``paths`` is group- or world-writable, or unreadable to us."""
    problems: list[str] = []
    seen = 0
    for path in paths:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            continue
        seen += 1
        folder = stat.S_ISDIR(info.st_mode)
        if info.st_mode & stat.S_IWOTH:
            problems.append(f"{path} is world-writable ({stat.filemode(info.st_mode)})")
        elif info.st_mode & stat.S_IWGRP:
            problems.append(f"{path} is group-writable ({stat.filemode(info.st_mode)})")
        if not os.access(path, os.R_OK | (os.X_OK if folder else 0)):
            problems.append(f"{path} is not readable")
    if not problems:
        what = "1 file or folder" if seen == 1 else f"{seen} files and folders"
        detail = f"{what}: none group- or world-writable, all readable"
        return Finding(check, subject, OK, detail)
    shown = "; ".join(problems[:SHOWN])
    more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    return Finding(check, subject, WARNING, shown + more)


def owner_alive(folder: Path, owner: str) -> bool:
    """Whether the process of ``owner`` holds its owner lock in ``folder`` (tested with
    a shared lock released at once; unlike the stores' own test, nothing is removed)."""
    path = OwnerProofs(folder).lock_path(owner)
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise StoreError(f"cannot test the owner lock {str(path)!r}: {exc}") from exc
    try:
        return _oslock.locked_elsewhere(fd)
    except OSError as exc:
        raise StoreError(f"cannot test the owner lock {str(path)!r}: {exc}") from exc
    finally:
        _oslock.close(fd)


def host_lease(
    record: tuple[int, str | None, float] | None, folder: Path | None
) -> LeaseView | None:
    """A lease record of a store on one host as a ``LeaseView``."""
    if record is None:
        return None
    token, owner, expires = record
    if owner is None:
        return LeaseView(str(token), None)
    alive = owner_alive(folder, owner) if folder is not None else None
    return LeaseView(str(token), owner, expires - time.time(), alive)
