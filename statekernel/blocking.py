"""A kernel for synchronous code: Celery tasks, RQ jobs, WSGI handlers, scripts.

A kernel lives on one event loop: it holds the store's connections and the leases of
the runs it drives, and renews them in the background. Sync code that calls
``asyncio.run`` for each task would open and close a kernel (and its connections) every
time, and could not keep one between tasks. ``KernelThread`` runs one event loop in a
daemon thread of the process and a kernel on it; each call blocks until the coroutine
it sends there has finished. Make one per process (for Celery's prefork pool, in the
``worker_process_init`` signal, so a forked child never shares its parent's loop or
connections), and ``close`` it at the process's end.

``SyncKernel`` wraps a ``KernelThread`` so that every method of ``Kernel`` is a plain
method (``run`` and ``start_and_run`` sync iterators of events); in a process forked
after it was made, its first call makes a new ``KernelThread`` there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import os
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from statekernel._kernel.cancelling import CancelResult
from statekernel._kernel.kernel import NOT_GIVEN, Kernel
from statekernel._kernel.output import DEFAULT_RETRIES
from statekernel._kernel.retention import DEFAULT_STATES, PruneResult
from statekernel._records.events import Event
from statekernel._records.fallback import Fallback
from statekernel._records.limits import Limits
from statekernel._records.messages import JSON, Message
from statekernel._records.run import Run, StateId
from statekernel.errors import InvalidArgument, StatekernelError

__all__ = ["KernelThread", "SyncKernel"]

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
        return self._wait(self._start(work), timeout)

    def _start(self, work: Awaitable[T]) -> concurrent.futures.Future[T]:
        """Start ``work`` on the loop, as a call that ``close`` ends, without waiting."""
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
            return asyncio.run_coroutine_threadsafe(wrapped(), self._loop)

    def _wait(self, future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
        """The result of a call started on the loop (its error raised here)."""
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


_MADE: weakref.WeakSet[SyncKernel] = weakref.WeakSet()
"""The sync kernels of this process: a forked child gives each a new lock."""


def _after_fork() -> None:
    for made in list(_MADE):
        made._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


class SyncKernel:
    """A ``Kernel`` made by ``make()`` for sync code: each method of ``Kernel`` with
    the same arguments, blocking until it is done (Celery tasks, RQ jobs, WSGI
    handlers, scripts). ``run`` and ``start_and_run`` are sync iterators of events.

    ``make`` opens the kernel and its store (on the background loop): in a process
    forked after this was made, the first call makes a new one there. ``close()``
    closes the kernel and stops the loop's thread; use one per process.
    """

    def __init__(self, make: Callable[[], Kernel], *, name: str = "statekernel") -> None:
        if not callable(make):
            raise InvalidArgument(f"make must be a callable that returns a Kernel, got {make!r}")
        self._make = make
        self._name = name
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._thread = KernelThread(make, name=name)
        _MADE.add(self)

    @property
    def thread(self) -> KernelThread:
        """The ``KernelThread`` serving this process (made again in a forked child)."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._thread = KernelThread(self._make, name=self._name)
                    self._pid = os.getpid()
        return self._thread

    def _call(self, fn: Callable[[Kernel], Awaitable[T]]) -> T:
        return self.thread.call(fn)

    def _iterate(self, make: Callable[[Kernel], AsyncIterator[T]]) -> Generator[T, None, None]:
        """The items of ``make(kernel)``, each fetched on the loop when asked for here;
        closing this closes it there."""
        thread = self.thread
        asked: asyncio.Queue[bool] = asyncio.Queue()  # bound to the loop at its first use
        handed: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

        async def pump() -> None:
            try:
                async with contextlib.aclosing(make(thread.kernel)) as items:  # type: ignore[type-var]
                    while await asked.get():
                        try:
                            item = await anext(items)
                        except StopAsyncIteration:
                            return
                        handed.put(("item", item))
            except Exception as exc:
                handed.put(("error", exc))
            except BaseException:
                closed = StatekernelError("this KernelThread was closed while the events came")
                handed.put(("error", closed))
                raise
            finally:
                handed.put(("end", None))

        future = thread._start(pump())
        loop = thread._loop
        try:
            while True:
                loop.call_soon_threadsafe(asked.put_nowait, True)
                kind, value = handed.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            if not future.done():
                loop.call_soon_threadsafe(asked.put_nowait, False)
            with contextlib.suppress(Exception):
                thread._wait(future)

    # -- the kernel's methods, in Kernel's order -----------------------------------------

    def start(
        self,
        *,
        model: str | Fallback,
        messages: Iterable[Message | str] = (),
        context: JSON = None,
        run_id: str | None = None,
        max_turns: int | None = NOT_GIVEN,
        parent_run_id: str | None = None,
        parent_call_id: str | None = None,
        deadline: datetime | None = None,
        timeout: float | None = None,
        output_type: object = None,
        output_retries: int = DEFAULT_RETRIES,
        limits: Limits | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Run:
        """``Kernel.start``: create a run (not driven yet).

        Returns:
            The new run.
        """
        return self._call(
            lambda k: k.start(
                model=model,
                messages=messages,
                context=context,
                run_id=run_id,
                max_turns=max_turns,
                parent_run_id=parent_run_id,
                parent_call_id=parent_call_id,
                deadline=deadline,
                timeout=timeout,
                output_type=output_type,
                output_retries=output_retries,
                limits=limits,
                tags=tags,
            )
        )

    def start_and_run(
        self,
        *,
        model: str | Fallback,
        messages: Iterable[Message | str] = (),
        context: JSON = None,
        run_id: str | None = None,
        max_turns: int | None = NOT_GIVEN,
        raise_on_failure: bool = False,
        deadline: datetime | None = None,
        timeout: float | None = None,
        output_type: object = None,
        output_retries: int = DEFAULT_RETRIES,
        limits: Limits | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Generator[Event, None, None]:
        """``Kernel.start_and_run``: create a run and drive it to rest, yielding its events.

        Returns:
            The run's events, as they happen.
        """
        return self._iterate(
            lambda k: k.start_and_run(
                model=model,
                messages=messages,
                context=context,
                run_id=run_id,
                max_turns=max_turns,
                raise_on_failure=raise_on_failure,
                deadline=deadline,
                timeout=timeout,
                output_type=output_type,
                output_retries=output_retries,
                limits=limits,
                tags=tags,
            )
        )

    def fork(
        self, run_id: str, *, at_revision: int | None = None, new_run_id: str | None = None
    ) -> Run:
        """``Kernel.fork``: a new run from a revision of ``run_id``.

        Returns:
            The new run.
        """
        return self._call(lambda k: k.fork(run_id, at_revision=at_revision, new_run_id=new_run_id))

    def children(self, run_id: str) -> list[Run]:
        """``Kernel.children``: the child runs of ``run_id``.

        Returns:
            The child runs.
        """
        return self._call(lambda k: k.children(run_id))

    def delete(
        self,
        run_id: str,
        *,
        children: bool = False,
        approve: Callable[[list[str]], Awaitable[None]] | Callable[[list[str]], None] | None = None,
    ) -> list[str]:
        """``Kernel.delete``: delete a run (with ``children``, its subtree). ``approve``
        may also be a sync function: it is called in a thread of the loop's executor.

        Returns:
            The ids of the runs deleted, the deepest first.
        """
        if approve is None:
            return self._call(lambda k: k.delete(run_id, children=children))
        if not callable(approve):
            raise InvalidArgument(
                f"approve must be a function taking the list of run ids, got {approve!r}"
            )
        given = approve

        async def approved(ids: list[str]) -> None:
            loop = asyncio.get_running_loop()
            result: object = await loop.run_in_executor(None, given, ids)
            if inspect.isawaitable(result):
                await result

        return self._call(lambda k: k.delete(run_id, children=children, approve=approved))

    def prune(
        self,
        *,
        older_than: timedelta | datetime,
        states: Iterable[StateId] = DEFAULT_STATES,
        dry_run: bool = False,
        batch: int = 100,
    ) -> PruneResult:
        """``Kernel.prune``: delete old runs with their child runs.

        Returns:
            What was deleted (or would be, with ``dry_run``) and what was held.
        """
        return self._call(
            lambda k: k.prune(older_than=older_than, states=states, dry_run=dry_run, batch=batch)
        )

    def run(
        self, run_id: str, *messages: Message | str, raise_on_failure: bool = False
    ) -> Generator[Event, None, None]:
        """``Kernel.run``: drive the run to rest, yielding its events; leaving the loop
        early stops the run cleanly, as closing the async generator does.

        Returns:
            The run's events, as they happen.
        """
        return self._iterate(lambda k: k.run(run_id, *messages, raise_on_failure=raise_on_failure))

    def step(self, run_id: str, *, raise_on_failure: bool = False) -> list[Event]:
        """``Kernel.step``: drive the run by one turn.

        Returns:
            The turn's events.
        """
        return self._call(lambda k: k.step(run_id, raise_on_failure=raise_on_failure))

    def submit(
        self,
        run_id: str,
        *,
        queue: str = "default",
        delay: float = 0.0,
        key: str | None = None,
        key_limit: int = 1,
    ) -> str:
        """``Kernel.submit``: hand the run to the workers of a run queue.

        Returns:
            The id of the queue entry.
        """
        return self._call(
            lambda k: k.submit(run_id, queue=queue, delay=delay, key=key, key_limit=key_limit)
        )

    def holds(self, run_id: str) -> bool:
        """``Kernel.holds``: whether this kernel drives (holds the lease of) the run.

        Returns:
            True while it does.
        """

        async def holds(k: Kernel) -> bool:
            return k.holds(run_id)

        return self._call(holds)

    def get(self, run_id: str) -> Run:
        """``Kernel.get``: the run's head.

        Returns:
            The run.
        """
        return self._call(lambda k: k.get(run_id))

    def events(self, run_id: str, *, after_revision: int = -1) -> list[Event]:
        """``Kernel.events``: the run's persisted events after a revision.

        Returns:
            The events.
        """
        return self._call(lambda k: k.events(run_id, after_revision=after_revision))

    def watch(
        self, run_id: str, *, after_revision: int = -1, until_rest: bool = True
    ) -> Generator[Event, None, None]:
        """``Kernel.watch``: the run's events as they happen, whichever process drives it
        (leaving the loop early stops watching).

        Returns:
            The run's events, committed and live.
        """
        return self._iterate(
            lambda k: k.watch(run_id, after_revision=after_revision, until_rest=until_rest)
        )

    def tree(self, run_id: str) -> list[tuple[int, Run]]:
        """``Kernel.tree``: the run and its descendants with their depths.

        Returns:
            ``(depth, run)`` pairs, the run first.
        """
        return self._call(lambda k: k.tree(run_id))

    def diagram(self, run_id: str, *, format: str = "svg") -> bytes:
        """``Kernel.diagram``: the lifecycle diagram with the run's path.

        Returns:
            The diagram.
        """
        return self._call(lambda k: k.diagram(run_id, format=format))

    def send(self, run_id: str, *messages: Message | str) -> Run:
        """``Kernel.send``: add input to a run at rest.

        Returns:
            The run.
        """
        return self._call(lambda k: k.send(run_id, *messages))

    def resume(
        self,
        run_id: str,
        *,
        value: JSON = NOT_GIVEN,
        max_turns: int | None = None,
        limits: Limits | None = None,
    ) -> Run:
        """``Kernel.resume``: answer a paused run (or raise its limits).

        Returns:
            The run.
        """
        return self._call(
            lambda k: k.resume(run_id, value=value, max_turns=max_turns, limits=limits)
        )

    def cancel(
        self, run_id: str, reason: str = "", *, by: str | None = None, children: bool = True
    ) -> CancelResult:
        """``Kernel.cancel``: cancel a run (and its child runs).

        Returns:
            What was cancelled.
        """
        return self._call(lambda k: k.cancel(run_id, reason, by=by, children=children))

    def retry(self, run_id: str) -> Run:
        """``Kernel.retry``: make a failed run ready to drive again.

        Returns:
            The run.
        """
        return self._call(lambda k: k.retry(run_id))

    def resolve_tool_call(
        self,
        run_id: str,
        call_id: str,
        *,
        output: JSON = NOT_GIVEN,
        error: str | None = None,
        rerun: bool = False,
    ) -> Run:
        """``Kernel.resolve_tool_call``: settle a tool call whose outcome is uncertain.

        Returns:
            The run.
        """
        return self._call(
            lambda k: k.resolve_tool_call(run_id, call_id, output=output, error=error, rerun=rerun)
        )

    def update_context(self, run_id: str, fn: Callable[[JSON], Any], *, attempts: int = 5) -> Run:
        """``Kernel.update_context``: change the run's context with ``fn`` (run on the
        loop: keep it quick).

        Returns:
            The run.
        """
        return self._call(lambda k: k.update_context(run_id, fn, attempts=attempts))

    def update_tags(
        self,
        run_id: str,
        set: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        *,
        expected_revision: int | None = None,
    ) -> Run:
        """``Kernel.update_tags``: set and remove the run's tags, compare-and-set.

        Returns:
            The run.
        """
        return self._call(
            lambda k: k.update_tags(run_id, set, remove, expected_revision=expected_revision)
        )

    def aclose(self) -> None:
        """``Kernel.aclose``, as ``close``."""
        self.close()

    def close(self) -> None:
        """Close the kernel (releasing its leases) and stop the loop's thread. Idempotent."""
        self._thread.close()

    def __enter__(self) -> SyncKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
