"""Folders and files a store creates are its own user's only: folders 0700, files 0600
(whatever the umask lets through of those, never more)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["FILE_MODE", "FOLDER_MODE", "private_folder", "write_private"]

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def private_folder(path: Path) -> None:
    """Create ``path`` and each missing folder above it, every one 0700 (``mkdir``'s
    ``parents=True`` would give the folders above the umask's default, 0755)."""
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=FOLDER_MODE)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (created 0600; a file left there by an older version
    is made 0600 too), not fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
