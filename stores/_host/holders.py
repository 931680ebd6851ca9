"""Who holds a run's lease in a store on one host (memory, SQLite), read without
writing (``ShowsHolders``).

``take`` (``owners``) decides whether a taker gets a run: an owner of this process
holds it until its lease expires, an owner of another process for as long as its OS
lock is held. ``holder_of`` gives the same answer to a reader and changes nothing: it
opens the owner's lock file read-only, tests its lock without keeping one
(``oslock.locked_elsewhere``), and leaves the file of a dead owner where it is (the
next taker removes it), so a store opened read-only, in a folder its reader cannot
write, answers too.
"""

from __future__ import annotations

import os

from statekernel.errors import StoreError
from statekernel.stores._host import oslock as _oslock
from statekernel.stores._host.owners import LeaseRecord, OwnerProofs, local_owner
from statekernel.stores._private import NOFOLLOW

__all__ = ["holder_of", "lock_held"]


def holder_of(record: LeaseRecord | None, now: float, proofs: OwnerProofs) -> str | None:
    """The owner that holds ``record`` (the run's lease as stored) at ``now`` on the
    store's lease clock, or None when a taker would get the run."""
    if record is None or record.owner is None:
        return None
    owner = record.owner
    if local_owner(owner):
        return owner if record.expires > now else None
    return owner if lock_held(proofs, owner) else None


def lock_held(proofs: OwnerProofs, owner: str) -> bool:
    """Whether ``owner``'s OS lock in ``proofs``'s folder is held (its process lives);
    nothing is written, created or removed."""
    if proofs.folder is None:
        return False  # owners of this process only: none of them is ``owner``
    path = proofs.lock_path(owner)
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreError(f"cannot check the owner lock {str(path)!r}: {exc}") from exc
    try:
        if _oslock.locked_elsewhere(fd):
            return True
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False
        return False if same else lock_held(proofs, owner)  # a new file: ask that one
    finally:
        _oslock.close(fd)
