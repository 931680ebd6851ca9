"""Keyed and delayed entries of the run queues (Redis, Redis Cluster, PostgreSQL): at
most ``key_limit`` entries of a key in flight at once, whatever else the queue holds;
settling one (ack, dead letter, hand back) gives its place back once; a delayed entry
waits aside. Workers keeping the limit: ``tests/statekernel/workers/test_worker_timers``."""

from __future__ import annotations

import pytest

import statekernel as sk
from statekernel._storage.queues import RunQueue, RunQueues
from statekernel.errors import InvalidArgument


@pytest.fixture
def kernel(queue_kernel: sk.Kernel) -> sk.Kernel:
    """A kernel on each store with run queues."""
    return queue_kernel


async def _queue(kernel: sk.Kernel) -> RunQueue:
    assert isinstance(kernel.store, RunQueues)
    queue = kernel.store.run_queue("default")
    await queue.prepare()
    return queue


async def _submit(kernel: sk.Kernel, run_id: str, **how: object) -> None:
    await kernel.start(model="scripted/m", messages=["go"], run_id=run_id)
    await kernel.submit(run_id, **how)  # type: ignore[arg-type]


async def test_no_more_than_the_limit_of_a_key_is_in_flight(kernel: sk.Kernel) -> None:
    for i in range(3):
        await _submit(kernel, f"a{i}", key="tenant-a")
    await _submit(kernel, "b0", key="tenant-b", key_limit=2)
    await _submit(kernel, "b1", key="tenant-b", key_limit=2)
    await _submit(kernel, "b2", key="tenant-b", key_limit=2)
    await _submit(kernel, "free")
    queue = await _queue(kernel)
    first = await queue.read("w1", 10, 0)
    assert sorted(e.run_id for e in first) == ["a0", "b0", "b1", "free"]
    assert {e.run_id: e.key for e in first}["a0"] == "tenant-a"
    assert await queue.read("w2", 10, 0) == []  # both keys at their limit
    assert await queue.waiting() == 3
    by_id = {e.run_id: e for e in first}
    await queue.ack(by_id["a0"])
    await queue.ack(by_id["a0"])  # settled twice: its place is given back once
    (a1,) = await queue.read("w2", 10, 0)
    assert a1.run_id == "a1"
    assert await queue.read("w2", 10, 0) == []
    await queue.dead(by_id["b0"], "failed", "it failed", "w1")  # a dead letter frees it too
    (b2,) = await queue.read("w3", 10, 0)
    assert b2.run_id == "b2"
    await queue.requeue(a1)  # handed back: it waits behind a2 for its key's place
    (a2,) = await queue.read("w3", 10, 0)
    assert a2.run_id == "a2"
    await queue.ack(a2)
    (again,) = await queue.read("w3", 10, 0)
    assert (again.run_id, again.key) == ("a1", "tenant-a")
    assert [d.run_id for d in await queue.dead_letters()] == ["b0"]


async def test_a_delayed_keyed_entry_waits_for_its_time_then_for_its_key(
    kernel: sk.Kernel,
) -> None:
    await _submit(kernel, "now", key="k")
    await _submit(kernel, "later", key="k", delay=3600)
    queue = await _queue(kernel)
    (taken,) = await queue.read("w", 10, 0)
    assert taken.run_id == "now"
    assert await queue.waiting() == 1
    await queue.ack(taken)
    assert await queue.read("w", 10, 0) == []  # its key is free, its time has not come


async def test_a_key_that_is_not_one_is_refused(kernel: sk.Kernel) -> None:
    await kernel.start(model="scripted/m", messages=["go"], run_id="r")
    for key, limit in (("", 1), ("a\x00b", 1), ("x" * 201, 1), ("ok", 0), ("ok", True)):
        with pytest.raises(InvalidArgument, match="key"):
            await kernel.submit("r", key=key, key_limit=limit)
    assert await (await _queue(kernel)).waiting() == 0
