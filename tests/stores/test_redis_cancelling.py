"""A Redis store's call cancelled in any loop turn stops with the cancellation: redis-py
sends under ``asyncio.wait_for``, which on Python 3.11 returned normally when the
cancellation came in the turn the send ended in (``stores/redis/_cancelling.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from statekernel.stores import Checkpoint, RedisStore
from statekernel.testing._store_cases import sample_run

pytestmark = pytest.mark.redis

TURNS = 40
"""Loop turns the cancellation is moved through, one more each round: a send ends in
one of them, whatever the machine's speed (a loopback write does not wait)."""


async def sweep(call: Callable[[int], Awaitable[object]]) -> tuple[int, int]:
    """Cancel ``call(n)`` after n loop turns, for n in ``range(TURNS)``, twice over; how
    many calls raised the cancellation, and how many returned although cancelled."""
    raised = swallowed = 0
    for n in range(2 * TURNS):

        async def calling(n: int = n) -> bool:
            task = asyncio.current_task()
            assert task is not None
            await call(n)
            return task.cancelling() > 0

        task = asyncio.create_task(calling())
        for _ in range(n % TURNS):
            await asyncio.sleep(0)
        task.cancel()
        try:
            swallowed += await task
        except asyncio.CancelledError:
            raised += 1
    return raised, swallowed


@pytest.mark.parametrize("where", ["redis_store_url", "redis_cluster_store_url"])
async def test_a_cancelled_call_raises_its_cancellation(
    where: str, request: pytest.FixtureRequest
) -> None:
    store = RedisStore(str(request.getfixturevalue(where)))
    try:
        await store.commit(Checkpoint.between(None, sample_run("read")))

        async def create(n: int) -> None:
            await store.commit(Checkpoint.between(None, sample_run(f"r{n}")))

        async def read(n: int) -> None:
            await store.load("read")

        for call in (create, read):
            raised, swallowed = await sweep(call)
            assert swallowed == 0, f"{call.__name__}: {swallowed} cancellations were lost"
            assert raised > 0
        assert (
            await store.load("read")
        ).run_id == "read"  # the dropped connections left none out of step
    finally:
        await store.aclose()
