"""``shielded``: store work a cancelled caller abandoned ends before the cancellation goes
on, however many cancellations arrive while it is waited for."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from statekernel._storage.shielding import shielded
from statekernel.stores._group import GroupCommit


async def _turns(n: int = 5) -> None:
    """Let the other tasks run ``n`` loop turns (no clock involved)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def _cancelled_twice(
    caller: Callable[[], Awaitable[Any]], began: asyncio.Event, release: asyncio.Event
) -> list[str]:
    """Run ``caller`` in a task, cancel it once the work began, cancel it again while it
    waits for the work, then let the work end; what happened, in order."""
    seen: list[str] = []

    async def call() -> None:
        try:
            await caller()
        except asyncio.CancelledError:
            seen.append("cancellation propagated")
            raise

    task = asyncio.ensure_future(call())
    await began.wait()
    task.cancel()
    await _turns()  # the caller is now waiting for the work
    task.cancel()  # a second cancellation while it waits
    await _turns()
    assert not task.done(), "the cancellation went on before the work ended"
    seen.append("work released")
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    return seen


async def test_a_second_cancellation_still_waits_for_the_abandoned_write() -> None:
    began, release = asyncio.Event(), asyncio.Event()
    ended: list[str] = []

    async def write() -> str:
        began.set()
        await release.wait()
        ended.append("written")
        return "done"

    seen = await _cancelled_twice(lambda: shielded(write()), began, release)
    assert seen == ["work released", "cancellation propagated"]
    assert ended == ["written"]


async def test_a_withdrawn_write_is_not_waited_for() -> None:
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def withdraw() -> bool:
        future.cancel()
        return True

    task = asyncio.ensure_future(shielded(future, withdraw=withdraw))
    await _turns()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert future.cancelled()  # taken back: nothing was waited for


async def test_a_group_commit_being_written_outlives_two_cancellations() -> None:
    """The stores' group commit: a caller whose batch is being written waits for it."""
    began, release = asyncio.Event(), asyncio.Event()
    written: list[list[int]] = []

    async def write(items: list[int]) -> Sequence[int | BaseException]:
        began.set()
        await release.wait()
        written.append(items)
        return items

    group: GroupCommit[int, int] = GroupCommit(write, lambda exc: exc)
    seen = await _cancelled_twice(lambda: group.submit(7), began, release)
    assert seen == ["work released", "cancellation propagated"]
    assert written == [[7]]


async def test_a_cancellation_delivered_at_every_turn_does_not_keep_a_finished_wait_going() -> None:
    """anyio's cancel scopes (Starlette, FastAPI) cancel a task again at every turn of the
    loop until it exits: once the shielded work is done, the wait must end."""
    import anyio

    from statekernel._storage.shielding import wait_ended

    work = asyncio.get_running_loop().create_future()
    waiting = asyncio.Event()

    async def waiter() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()  # delivered again at every turn while the task waits
            waiting.set()
            await wait_ended([work])

    task = asyncio.create_task(waiter())
    await waiting.wait()
    for _ in range(5):  # a few turns under the repeated cancellation
        await asyncio.sleep(0)
    work.set_result(None)
    done, _ = await asyncio.wait([task], timeout=30)  # ends the test if the wait never does
    assert done, "the wait went on after the work was done"
