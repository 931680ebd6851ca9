"""A run's cancel request in the file store (``CancelsRuns``): the file ``cancel`` in the
run's folder, written and removed under the run's lock, so every commit (which holds
that lock) sees it.

Written durably (a new file fsynced, renamed over, the folder fsynced): a request is
committed before the caller is told so. Removed by the commit that carries it out,
after that commit's log is fsynced; a crash between leaves the request beside a run
that is failed already, which no request can be kept for (``check_cancellable``), so
the next commit drops it as what it is, a leftover.
"""

from __future__ import annotations

import os

from statekernel.errors import StoreError
from statekernel.stores._format.cancels import AT_REST, cancel_requested
from statekernel.stores._private import write_private
from statekernel.stores.file._io import RunFolder

__all__ = ["CANCEL", "check_cancel", "drop_cancel", "read_cancel", "write_cancel"]

CANCEL = "cancel"
_CANCEL_TMP = CANCEL + ".tmp"


def read_cancel(folder: RunFolder) -> bytes | None:
    """The run's kept cancel request as stored, or None."""
    return folder.read_file(CANCEL, "read the cancel request")


def write_cancel(folder: RunFolder, data: bytes) -> None:
    """Keep ``data`` as the run's cancel request, durably (under the run's lock)."""
    try:
        with folder.held() as dir_fd:
            write_private(dir_fd, _CANCEL_TMP, data, folder.path / _CANCEL_TMP)
            fd = os.open(_CANCEL_TMP, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(_CANCEL_TMP, CANCEL, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
    except OSError as exc:
        raise StoreError(f"{folder.where}: cannot keep the cancel request: {exc}") from exc


def drop_cancel(folder: RunFolder) -> None:
    """Remove the run's cancel request (under the run's lock), durably."""
    try:
        with folder.held() as dir_fd:
            try:
                os.unlink(CANCEL, dir_fd=dir_fd)
            except FileNotFoundError:
                return
            os.fsync(dir_fd)
    except OSError as exc:
        raise StoreError(f"{folder.where}: cannot remove the cancel request: {exc}") from exc


def check_cancel(folder: RunFolder, run_id: str, state: object, cancels: bool) -> bool:
    """Whether a commit to the run (in ``state``, as its head says) removes a kept request
    once it lands; ``CancelRequested`` when the request refuses it (it does not
    ``cancel``). A request beside a run at rest is a leftover: it is removed."""
    kept = read_cancel(folder)
    if kept is None:
        return False
    if not cancels and state not in AT_REST:
        raise cancel_requested(run_id, kept, folder.where)
    return True
