"""Folders and files a store creates are its own user's only: folders 0700, files 0600
(whatever the umask lets through of those, never more).

A store also refuses, with ``StoreError`` naming the path and what is wrong, what it
cannot trust: a folder that is a symbolic link, belongs to another user or is writable
by its group or by every user (``open_folder``, and ``private_folder`` of the folder it
is asked for), and a file that is a symbolic link, not a regular file, another user's
or linked to from elsewhere (``open_own_file``). No file is opened through a symbolic
link, and a file the store writes from scratch is created anew (``write_private``),
never truncated.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from statekernel.errors import StoreError

__all__ = [
    "FILE_MODE",
    "FOLDER_MODE",
    "NOFOLLOW",
    "NONBLOCK",
    "folder_refusal",
    "new_private_file",
    "open_folder",
    "open_own_file",
    "private_folder",
    "refused_file",
    "refused_folder",
    "remove_leftover",
    "write_private",
]

FOLDER_MODE = 0o700
FILE_MODE = 0o600

NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
"""``os.O_NOFOLLOW``: where the OS has none (Windows), 0 (the module imports there)."""
NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
"""``os.O_NONBLOCK``: where the OS has none (Windows), 0."""

_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | NONBLOCK
"""Never through a symbolic link, and never waiting on a FIFO planted in a file's place
(on a regular file ``O_NONBLOCK`` changes nothing)."""


def _not_yours(info: os.stat_result) -> str | None:
    """Why a file or folder is not this process's user's alone to write, or None."""
    uid = os.geteuid()
    if info.st_uid != uid:
        return f"belongs to uid {info.st_uid}, not to uid {uid} that this process runs as"
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by every user (mode {mode:04o})"
    return None


def _folder_problem(info: os.stat_result) -> str | None:
    """Why a folder (as ``lstat`` sees it) cannot be trusted, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    return _not_yours(info)


def _file_problem(info: os.stat_result) -> str | None:
    """Why a file (as ``lstat`` sees it) is not one the store may write, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_nlink != 1:
        return f"has {info.st_nlink} hard links (another name elsewhere shares it)"
    uid = os.geteuid()
    if info.st_uid != uid:
        return f"belongs to uid {info.st_uid}, not to uid {uid} that this process runs as"
    return None


def refused_folder(path: Path, problem: str) -> StoreError:
    """The error of a folder the store will not use."""
    return StoreError(
        f"refused folder {str(path)!r}: it {problem}; a store uses only real folders"
        " (not symbolic links) of its own user that no other user can write"
    )


def refused_file(path: Path, problem: str) -> StoreError:
    """The error of a file the store will not open or write."""
    return StoreError(
        f"refused file {str(path)!r}: it {problem}; a store opens no file through a"
        " symbolic link and writes only regular files of its own user with no other hard link"
    )


def _is_link(name: str | Path, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def folder_refusal(path: Path) -> StoreError | None:
    """The error of refusing the entry at ``path`` as a folder when it is a symbolic
    link, or a folder another user owns or could write; else None (also when nothing
    or something other than a folder is there)."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(info.st_mode):
        return refused_folder(path, "is a symbolic link")
    problem = _not_yours(info) if stat.S_ISDIR(info.st_mode) else None
    return None if problem is None else refused_folder(path, problem)


def private_folder(path: Path) -> None:
    """Create ``path`` and each missing folder above it, every one 0700 (``mkdir``'s
    ``parents=True`` would give the folders above the umask's default, 0755).

    ``path`` itself, made now or found, must be a folder this process can trust (not a
    symbolic link, its own user's, not writable by its group or every user): else
    ``StoreError`` naming it. The folders above it are not checked (``/tmp`` is
    every user's)."""
    missing: list[Path] = []
    folder = path
    while not folder.is_dir():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):
            made.mkdir(mode=FOLDER_MODE)
    problem = _folder_problem(os.lstat(path))
    if problem is not None:
        raise refused_folder(path, problem)


def open_folder(path: Path, *, dir_fd: int | None = None) -> int:
    """``path`` opened as a folder (``O_RDONLY``), without following a symbolic link;
    with ``dir_fd``, its last part is opened in that folder (``path`` names it in
    errors).

    Raises:
        StoreError: it is a symbolic link, another user's, or writable by its group
            or by every user.
        FileNotFoundError: there is nothing there.
        NotADirectoryError: it is not a folder.
    """
    name: str | Path = path if dir_fd is None else path.name
    try:
        fd = os.open(name, _FOLDER_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(name, dir_fd):
            raise refused_folder(path, "is a symbolic link") from None
        raise
    try:
        problem = _not_yours(os.fstat(fd))
        if problem is not None:
            raise refused_folder(path, problem)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_own_file(dir_fd: int, name: str, flags: int, path: Path) -> int:
    """The file ``name`` in the folder ``dir_fd``, opened with ``flags`` (and
    ``O_CREAT``'s mode 0600) without following a symbolic link; ``path`` names it in
    errors. A file that is there must be a regular file of this process's user with no
    other hard link.

    Raises:
        StoreError: it is a symbolic link or not such a file (nothing was written).
        OSError: it could not be opened.
    """
    try:
        fd = os.open(name, flags | _FILE_FLAGS, FILE_MODE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise refused_file(path, "is a symbolic link") from None
        raise
    try:
        problem = _file_problem(os.fstat(fd))
        if problem is not None:
            raise refused_file(path, problem)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_leftover(dir_fd: int, name: str, path: Path) -> None:
    """Remove the file ``name`` in the folder ``dir_fd`` (a temp file a writer left when
    it stopped) if it is provably the store's own: a regular file of this process's
    user with no other hard link. Nothing there is fine.

    Raises:
        StoreError: something else is there (it is left alone).
    """
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    problem = _file_problem(info)
    if problem is not None:
        raise refused_file(path, problem)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def new_private_file(dir_fd: int, name: str, path: Path) -> int:
    """A new file ``name`` in the folder ``dir_fd``, open for writing: created 0600 with
    ``O_EXCL`` (never a file that was there, never through a symbolic link), after
    removing a leftover ``remove_leftover`` proves the store's own.

    Raises:
        StoreError: something else is there under that name (it is left alone).
        OSError: it could not be created.
    """
    remove_leftover(dir_fd, name, path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS
    try:
        fd = os.open(name, flags, FILE_MODE, dir_fd=dir_fd)
    except FileExistsError:  # made again meanwhile, by someone else
        remove_leftover(dir_fd, name, path)
        fd = os.open(name, flags, FILE_MODE, dir_fd=dir_fd)
    os.fchmod(fd, FILE_MODE)
    return fd


def write_private(dir_fd: int, name: str, data: bytes, path: Path) -> None:
    """Write ``data`` to a new file ``name`` in the folder ``dir_fd`` (``new_private_file``:
    0600, never through a link or over a file it cannot prove its own), not fsynced."""
    fd = new_private_file(dir_fd, name, path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
