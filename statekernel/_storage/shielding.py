"""Store work a cancelled caller abandons still ends before the cancellation goes on.

A store may write in a thread or over a socket, and cancelling the await does not stop
that write. ``shielded`` runs the work in a task of its own and, when the caller is
cancelled, waits for it to end before the cancellation propagates (however many more
cancellations arrive meanwhile): no orphaned write can land under a process that acts
right after, for instance one that resumes the run. ``wait_ended`` is the wait itself.
The stores (``statekernel.stores``) and the kernel use these two, and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

__all__ = ["shielded", "wait_ended"]

T = TypeVar("T")


async def wait_ended(futures: Collection[asyncio.Future[Any]]) -> None:
    """Return once every future is done.

    A cancellation that arrives meanwhile does not cut the wait short: it is raised
    (as ``CancelledError``) after the last future is done. Outcomes are not collected.
    """
    pending = {future for future in futures if not future.done()}
    cancelled = False
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
            # looked at again before waiting again: a canceller that strikes at every
            # turn of the loop (anyio's cancel scopes do, under Starlette and FastAPI)
            # would otherwise cut every wait before it saw the futures done, for ever
            pending = {future for future in pending if not future.done()}
    if cancelled:
        raise asyncio.CancelledError


async def shielded(work: Awaitable[T], *, withdraw: Callable[[], bool] | None = None) -> T:
    """The result of ``work``, run to its end even if the caller is cancelled.

    On a cancellation of the caller, ``work`` goes on and the cancellation is raised
    once it has ended (its outcome is dropped: pass a task or future and read it there
    to know it). ``withdraw`` is asked first: True when it took the work back before
    the work began (a queued write that will never be written), so nothing is waited for.
    """
    future = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if withdraw is None or not withdraw():
            await wait_ended([future])
        raise
