"""Who holds one run's driver: the drives of this kernel (``run``, ``step``) that hold it
or wait their turn, and a command of the same kernel committing under its lease between
two of its commits. A small object of its own, so the driver keeps to the run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

__all__ = ["Seats"]


class Seats:
    """The drives holding or waiting for one driver, and the command between its commits."""

    def __init__(self) -> None:
        self._drive = asyncio.Lock()
        self._users = 0
        self.commit_lock = asyncio.Lock()
        """Held while a commit of the run is computed and landed: by the driver's
        ``commit`` and by a command of the same kernel that commits between two of them."""
        self._commander: asyncio.Task[Any] | None = None

    @property
    def driving(self) -> bool:
        """True while a drive (of any task) holds the driver."""
        return self._drive.locked()

    @property
    def awaited(self) -> bool:
        """True while another drive than the one holding the driver waits for it."""
        return self._users > 1

    @property
    def empty(self) -> bool:
        """True when no drive holds or waits for the driver."""
        return not self._users

    @property
    def commanded(self) -> bool:
        """True while a command of this kernel commits between the driver's commits."""
        return self._commander is not None

    @contextlib.asynccontextmanager
    async def taken(self) -> AsyncIterator[bool]:
        """Hold the driver for one drive (others wait); yields whether a drive of another
        task held it when this one asked."""
        waited = self._drive.locked()
        self._users += 1
        try:
            async with self._drive:
                yield waited
        finally:
            self._users -= 1

    def commanding(self) -> bool:
        """True in the task of a command committing between the driver's commits."""
        return self._commander is asyncio.current_task()

    @contextlib.contextmanager
    def command(self) -> Iterator[None]:
        """Mark the current task as the command committing between the driver's commits
        (the caller holds ``commit_lock``)."""
        self._commander = asyncio.current_task()
        try:
            yield
        finally:
            self._commander = None
