"""``SQLiteThread``: the one thread a SQLite store's connection lives on.

Every operation of the store is one plain function run whole on this thread, one after
another, so the event loop never blocks on SQLite and each transaction costs one hop.
The thread is a daemon: a store that is never closed (a program that returns from
``main()`` without ``aclose()``, or dies of an exception) never keeps the process
alive. SQLite itself keeps what was committed (the WAL), and a transaction cut off by
the process's exit is rolled back when the file is next opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["SQLiteThread"]

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "asyncio.Future[Any] | None"]


class SQLiteThread:
    """A daemon thread that holds one ``sqlite3`` connection and runs work on it."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], *, name: str) -> None:
        """Start the thread; ``connect`` runs on it first (``open`` awaits it)."""
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._connect: Callable[[], sqlite3.Connection] | None = connect
        self._raw: sqlite3.Connection | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def daemon(self) -> bool:
        """Always True: the thread never keeps the process alive."""
        return self._thread.daemon

    async def open(self) -> sqlite3.Connection:
        """Open the connection on the thread; an error stops the thread and is raised."""

        def opening() -> sqlite3.Connection:
            connect, self._connect = self._connect, None  # held no longer: see _serve
            assert connect is not None, "opened twice"
            self._raw = connect()
            return self._raw

        try:
            return await self.call(opening)
        except BaseException:
            self.stop()
            raise

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` run whole on the thread; its result or its exception.

        Cancelling the caller does not stop ``fn`` (it runs to its end on the thread).
        """
        if self._stopped:
            raise ValueError("the SQLite connection is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.put((lambda: fn(*args), future))
        return await future

    async def close(self) -> None:
        """Close the connection on the thread and end the thread."""
        if self._stopped:
            return
        try:
            await self.call(self._close_connection)
        finally:
            self.stop()

    def stop(self) -> None:
        """End the thread after the work queued so far, closing the connection (does not
        wait: also for a store collected without being closed)."""
        if self._stopped:
            return
        self._stopped = True
        self._jobs.put((self._close_connection, None))
        self._jobs.put(None)

    def _close_connection(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            with contextlib.suppress(sqlite3.Error):
                raw.close()

    def _serve(self) -> None:
        """Run jobs until ``stop``. Nothing of a job is held once it is done, so the
        thread never keeps its store from being collected (which stops it)."""
        while (job := self._jobs.get()) is not None:
            _run(*job)
            del job


def _run(fn: Callable[[], Any], future: asyncio.Future[Any] | None) -> None:
    try:
        result = fn()
    except BaseException as exc:
        _settle(future, None, exc)
    else:
        _settle(future, result, None)


def _settle(future: asyncio.Future[Any] | None, result: Any, exc: BaseException | None) -> None:
    """Hand a result to its caller's loop (nothing to do when nobody waits any more)."""
    if future is None:
        return

    def settle() -> None:
        if future.done():  # the caller was cancelled
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
        future.get_loop().call_soon_threadsafe(settle)
