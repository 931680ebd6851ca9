"""What an operator does with the run queues of every store that has them (Redis, Redis
Cluster, PostgreSQL): list the queues, their depth and entries, put dead letters back
on the queue, drop entries. The command line and the web view over them:
``tests/statekernel/cli/test_queues_cli.py``, ``tests/statekernel/web/test_queues_page.py``."""

from __future__ import annotations

import time

import pytest

import statekernel as sk
from statekernel._storage.queues import ListsQueues, RunQueue


@pytest.fixture
def kernel(queue_kernel: sk.Kernel) -> sk.Kernel:
    """A kernel on each store with run queues."""
    return queue_kernel


def _queues(kernel: sk.Kernel) -> ListsQueues:
    assert isinstance(kernel.store, ListsQueues)
    return kernel.store


async def _queue(kernel: sk.Kernel, name: str = "default") -> RunQueue:
    queue = _queues(kernel).run_queue(name)
    await queue.prepare()
    return queue


async def _submit(kernel: sk.Kernel, run_id: str, queue: str = "default", **how: object) -> None:
    await kernel.start(model="scripted/m", messages=["go"], run_id=run_id)
    await kernel.submit(run_id, queue=queue, **how)  # type: ignore[arg-type]


async def test_the_queues_are_listed_with_their_depth(kernel: sk.Kernel) -> None:
    assert await _queues(kernel).queue_names() == []
    before = int(time.time() * 1000)
    await _submit(kernel, "a")
    await _submit(kernel, "b")
    await _submit(kernel, "later", delay=3600)
    await _submit(kernel, "keyed", key="k")
    await _submit(kernel, "other", queue="mail")
    assert await _queues(kernel).queue_names() == ["default", "mail"]
    queue = await _queue(kernel)
    depth = await queue.depth()
    assert (depth.name, depth.waiting, depth.taken, depth.dead) == ("default", 4, 0, 0)
    assert depth.oldest_ms is not None
    assert before - 1000 <= depth.oldest_ms
    (taken,) = await queue.read("w1", 1, 0)
    assert taken.run_id == "a"
    depth = await queue.depth()
    assert (depth.waiting, depth.taken) == (3, 1)
    await queue.dead(taken, "failed", "it failed", "w1")
    depth = await queue.depth()
    assert (depth.waiting, depth.taken, depth.dead) == (3, 0, 1)
    empty = await (await _queue(kernel, "empty")).depth()
    assert (empty.waiting, empty.taken, empty.dead, empty.oldest_ms) == (0, 0, 0, None)


async def test_the_entries_say_their_state(kernel: sk.Kernel) -> None:
    await _submit(kernel, "a")
    await _submit(kernel, "b")
    await _submit(kernel, "later", delay=3600)
    await _submit(kernel, "keyed", key="k")
    queue = await _queue(kernel)
    (taken,) = await queue.read("w1", 1, 0)
    found = {e.run_id: e for e in await queue.entries()}
    assert set(found) == {"a", "b", "later", "keyed"}
    assert (found["a"].state, found["a"].consumer, found["a"].deliveries) == ("taken", "w1", 1)
    assert (found["b"].state, found["b"].consumer) == ("waiting", None)
    assert found["later"].state == "delayed"
    assert (found["keyed"].state, found["keyed"].key) == ("waiting", "k")
    assert taken.id == found["a"].id
    assert len(await queue.entries(limit=2)) == 2


async def test_a_dead_letter_is_put_back_once(kernel: sk.Kernel) -> None:
    await _submit(kernel, "a")
    await _submit(kernel, "b")
    queue = await _queue(kernel)
    entries = await queue.read("w1", 2, 0)
    for entry in entries:
        await queue.dead(entry, "failed", "it failed", "w1")
    await _submit(kernel, "c")
    (c,) = await queue.read("w1", 1, 0)
    await queue.dead(c, "deliveries", "delivered too often", "w1")
    await queue.dead(c, "deliveries", "delivered too often", "w2")  # the run's second letter
    assert await queue.revive("nobody") == 0
    assert await queue.revive("c") == 1  # its two dead letters: one entry
    assert [d.run_id for d in await queue.dead_letters()] == ["a", "b"]
    assert await queue.revive("c") == 0
    (again,) = await queue.read("w2", 10, 0)
    assert (again.run_id, again.deliveries) == ("c", 1)
    assert await queue.revive() == 2  # all of them
    assert await queue.dead_letters() == []
    assert sorted(e.run_id for e in await queue.read("w2", 10, 0)) == ["a", "b"]
    assert (await queue.depth()).dead == 0


async def test_drop_removes_what_no_worker_holds(kernel: sk.Kernel) -> None:
    await _submit(kernel, "taken")
    await _submit(kernel, "plain")
    await _submit(kernel, "later", delay=3600)
    await _submit(kernel, "keyed", key="k")
    queue = await _queue(kernel)
    (taken,) = await queue.read("w1", 1, 0)
    assert taken.run_id == "taken"
    assert await queue.drop("taken") == 0  # its worker holds it
    assert await queue.drop("plain") == 1
    assert await queue.drop("later") == 1
    assert await queue.drop("keyed") == 1
    assert await queue.drop("plain") == 0
    assert [e.run_id for e in await queue.entries()] == ["taken"]
    await queue.dead(taken, "failed", "it failed", "w1")
    assert await queue.drop("taken") == 1  # its dead letter
    assert await queue.dead_letters() == []
    depth = await queue.depth()
    assert (depth.waiting, depth.taken, depth.dead) == (0, 0, 0)
    assert await queue.read("w2", 10, 0) == []
