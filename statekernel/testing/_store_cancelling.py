"""Conformance check: a store call cancelled in any loop turn raises its cancellation.

A store that returns normally from a call its caller cancelled makes the caller's task go
on as if never cancelled: a drive told to stop runs on to the end of its run. On Python
3.11, ``asyncio.wait_for`` does that when the cancellation comes in the loop turn its
wait ends in, and client libraries use it (redis-py sends every command under it); the
check catches a store built on one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from statekernel._storage.protocol import Checkpoint, CheckpointStore
from statekernel.testing._store_cases import sample_run

__all__ = ["check_cancellations"]

TURNS = 40
"""Loop turns a cancellation is moved through, one more each time: the work of a call
on a local store or server ends in one of them, whatever the machine's speed."""


async def check_cancellations(store: CheckpointStore) -> None:
    """Create, read, list and take the lease of runs, each call cancelled after 0, 1, 2
    ... loop turns: every cancelled call raises ``CancelledError``; none returns as if
    its caller had not been cancelled."""
    await store.commit(Checkpoint.between(None, sample_run("cancelled-read")))
    for n in range(TURNS):  # a run of its own per lease: a cancelled release may keep one
        await store.commit(Checkpoint.between(None, sample_run(f"leased-{n}")))

    async def create(n: int) -> None:
        await store.commit(Checkpoint.between(None, sample_run(f"cancelled-{n}")))

    async def read(n: int) -> object:
        return await store.load("cancelled-read")

    async def listing(n: int) -> object:
        return await store.list_runs(limit=5)

    async def lease(n: int) -> object:
        taken = await store.acquire(f"leased-{n}", "owner", ttl=60)
        await store.release(taken)
        return taken

    for call in (create, read, listing, lease):
        lost = await _lost_cancellations(call)
        assert not lost, f"{call.__name__}: cancelled after {lost} loop turns, it returned"
    assert (await store.load("cancelled-read")).run_id == "cancelled-read"


async def _lost_cancellations(call: Callable[[int], Awaitable[object]]) -> list[int]:
    """The loop turns after which a cancelled ``call(n)`` returned instead of raising."""
    lost: list[int] = []
    for n in range(TURNS):

        async def calling(n: int = n) -> bool:
            task = asyncio.current_task()
            await call(n)
            return task is not None and task.cancelling() > 0

        task = asyncio.create_task(calling())
        for _ in range(n):
            await asyncio.sleep(0)
        if not task.cancel():
            await task  # it had ended: nothing was lost
            continue
        try:
            if await task:
                lost.append(n)
        except asyncio.CancelledError:
            pass
    return lost
