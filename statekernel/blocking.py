"""A kernel for synchronous code: Celery tasks, RQ jobs, WSGI handlers, scripts.

A kernel lives on one event loop: it holds the store's connections and the leases of
the runs it drives, and renews them in the background. Sync code that calls
``asyncio.run`` for each task would open and close a kernel (and its connections) every
time, and could not keep one between tasks. ``KernelThread`` runs one event loop in a
daemon thread of the process and a kernel on it; each call blocks until the coroutine
it sends there has finished. Make one per process (for Celery's prefork pool, in the
``worker_process_init`` signal, so a forked child never shares its parent's loop or
connections), and ``close`` it at the process's end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from statekernel._kernel.kernel import Kernel
from statekernel._records.messages import Message
from statekernel._records.run import Run
from statekernel.errors import InvalidArgument, StatekernelError

__all__ = ["KernelThread"]

T = TypeVar("T")


class KernelThread:
    """A kernel made by ``make()`` on an event loop of its own thread.

    ``call(fn)`` runs ``fn(kernel)`` there and returns its result (or raises its error)
    in the calling thread; ``drive(run_id)`` drives a run to rest. Calls from several
    threads are served concurrently by the one loop. ``close()`` closes the kernel and
    stops the thread; a call after it raises ``StatekernelError``.
    """

    def __init__(self, make: Callable[[], Kernel], *, name: str = "statekernel") -> None:
        if not callable(make):
            raise InvalidArgument(f"make must be a callable that returns a Kernel, got {make!r}")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False
        self._lock = threading.Lock()
        """Orders a call's check of ``_closed`` and its hand-off to the loop with ``close``."""
        self._pid = os.getpid()
        self._calls: set[asyncio.Task[object]] = set()
        """The tasks of the calls running on the loop (touched on the loop's thread only)."""

        async def made() -> Kernel:
            kernel = make()
            if not isinstance(kernel, Kernel):
                raise InvalidArgument(f"make() must return a Kernel, got {kernel!r}")
            return kernel

        try:
            self.kernel: Kernel = self._submit(made())
            """The kernel (use it only through ``call``: it belongs to the thread's loop)."""
        except BaseException:
            self._stop()
            raise

    def _submit(self, work: Awaitable[T], timeout: float | None = None) -> T:
        """Run ``work`` on the loop and wait for it; refused once closed, or in a process
        forked from the one that made this (the child has no copy of the loop's thread)."""
        calls = self._calls

        async def wrapped() -> T:
            task = asyncio.current_task()
            assert task is not None
            calls.add(task)
            try:
                return await work
            finally:
                calls.discard(task)

        self._check_process(work)
        with self._lock:
            if self._closed:
                _discard(work)
                raise StatekernelError("this KernelThread is closed")
            future = asyncio.run_coroutine_threadsafe(wrapped(), self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            if not self._closed:
                raise  # the call's own cancellation, as it is
            raise StatekernelError("this KernelThread was closed while the call ran") from None

    def _check_process(self, work: Awaitable[object] | None = None) -> None:
        """Refuse a call in a process forked after this was made (checked before any lock,
        which a thread of the parent may have held at the fork)."""
        if self._pid != os.getpid():
            if work is not None:
                _discard(work)
            raise StatekernelError(
                f"this KernelThread was made in process {self._pid}, before a fork: "
                "make one in each process (after the fork)"
            )

    def call(self, fn: Callable[[Kernel], Awaitable[T]], *, timeout: float | None = None) -> T:
        """``await fn(kernel)`` on the kernel's loop; its result.

        Args:
            fn: Takes the kernel and returns what to await on its loop.
            timeout: Seconds to wait; the work goes on after it.

        Returns:
            What ``fn(kernel)`` gave.

        Raises:
            StatekernelError: the KernelThread is closed (or was closed while the call
                ran), or was made in another process (before a fork).
            TimeoutError: the call had not finished after ``timeout`` seconds.

        Any error of ``fn(kernel)`` is raised here, in the calling thread, as it is.
        """
        self._check_process()
        with self._lock:
            if self._closed:
                raise StatekernelError("this KernelThread is closed")
        return self._submit(fn(self.kernel), timeout)

    def drive(self, run_id: str, *messages: Message | str, raise_on_failure: bool = False) -> Run:
        """Drive ``run_id`` to rest (with ``messages`` as new user input, as
        ``Kernel.run`` takes them); the run then. ``raise_on_failure=True``: raise
        ``RunFailed`` when the run is failed at rest, as ``Kernel.run`` does.

        Returns:
            The run's head once it is at rest (completed, paused or failed).

        Raises:
            StatekernelError: this ``KernelThread`` is closed.
            RunNotFound: no run has this id.
            RunBusy: a live owner held the run for longer than the kernel's
                ``busy_timeout``.
            InvalidTransition: ``messages`` were given to a run that cannot take input.
            LeaseLost: another owner took the run over.
            StoreError: the store failed (after retries with backoff).
            RunFailed: ``raise_on_failure`` and the run is failed at rest.
        """

        async def drive(kernel: Kernel) -> Run:
            async for _ in kernel.run(run_id, *messages, raise_on_failure=raise_on_failure):
                pass
            return await kernel.get(run_id)

        return self.call(drive)

    def close(self) -> None:
        """Close the kernel (releasing its leases) and stop the thread. Idempotent. A call
        still running then ends with ``StatekernelError``; a call after it is refused."""
        if self._pid != os.getpid():  # a forked child: the loop's thread is not here
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result()
        finally:
            self._stop()

    async def _shut(self) -> None:
        """End the calls still running (their callers wait on them), so none starts a
        drive or reopens the store while the kernel closes; then close the kernel, then
        cancel whatever it left on the loop."""
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        try:
            await self.kernel.aclose()
        finally:
            here = asyncio.current_task()
            left = [task for task in asyncio.all_tasks() if task is not here]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> KernelThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _discard(work: Awaitable[object]) -> None:
    """Close a coroutine that will not run (so Python does not warn it was never awaited)."""
    close = getattr(work, "close", None)
    if callable(close):
        close()
