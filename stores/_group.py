"""Group commit: commits that are ready at the same moment share one write.

A store hands ``GroupCommit`` a ``write(items)`` coroutine that writes a batch in one
round trip (one transaction, one fsync, one pipeline) and returns one outcome per
item: its result, or the exception of that item alone. Callers ``submit`` an item
and get exactly the outcome of their own item.

There is no timer. A commit that finds the writer idle starts a batch on the next
turn of the event loop, so the commits that become ready in the same turn join it;
commits that arrive while a batch is being written form the next batch, taken whole
when that write returns. A lone commit costs one extra loop turn, nothing more.

Cancellation: a caller cancelled while its item waits in the queue takes it out (it
is never written); a caller cancelled once its batch is being written waits for the
batch to end before the cancellation propagates (the write landed whole or not at
all, and nothing of it is left running).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from statekernel._storage.shielding import shielded

__all__ = ["GroupCommit"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


class _Entry(Generic[I, O]):
    __slots__ = ("future", "item", "taken")

    def __init__(self, item: I, future: asyncio.Future[O]) -> None:
        self.item = item
        self.future = future
        self.taken = False


class GroupCommit(Generic[I, O]):
    """A queue of items written in batches by ``write``, one batch at a time.

    ``write(items)`` returns one ``O`` or exception per item, in order; if it raises,
    every item of the batch fails with ``fail(exception)`` (a new exception per
    caller). ``sizes`` counts the batches written by size (for measurements).
    """

    def __init__(
        self,
        write: Callable[[list[I]], Awaitable[Sequence[O | BaseException]]],
        fail: Callable[[BaseException], BaseException],
    ) -> None:
        self._write = write
        self._fail = fail
        self._queue: list[_Entry[I, O]] = []
        self._writer: asyncio.Task[None] | None = None
        self.sizes: dict[int, int] = {}

    async def submit(self, item: I) -> O:
        """Write ``item`` with the next batch; its own outcome (result or exception)."""
        entry: _Entry[I, O] = _Entry(item, asyncio.get_running_loop().create_future())
        self._queue.append(entry)
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._drain())

        def withdraw() -> bool:
            if entry.taken:
                return False  # being written: waited for
            entry.future.cancel()  # still queued: the writer skips it
            return True

        return await shielded(entry.future, withdraw=withdraw)

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = [e for e in self._queue if not e.future.done()]
                self._queue = []
                if batch:
                    await self._flush(batch)
        finally:
            self._writer = None

    async def _flush(self, batch: list[_Entry[I, O]]) -> None:
        for entry in batch:
            entry.taken = True
        self.sizes[len(batch)] = self.sizes.get(len(batch), 0) + 1
        try:
            outcomes = await self._write([e.item for e in batch])
        except BaseException as exc:
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(self._fail(exc))
            if not isinstance(exc, Exception):
                raise
            return
        for entry, outcome in zip(batch, outcomes, strict=True):
            if entry.future.done():
                continue
            if isinstance(outcome, BaseException):
                entry.future.set_exception(outcome)
            else:
                entry.future.set_result(outcome)
