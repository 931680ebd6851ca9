"""Workers' timer loops (``Worker(timers=True)``) fire pause timers and deadlines with no
kernel of the run's own open: a question that times out, fired by one of three
competing workers exactly once and driven on by their queue; a durable sleep across a
worker restart; a paused run past its deadline; a delayed submit; a key's limit of runs
in flight."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import timedelta
from typing import Any

import pytest

import statekernel as sk
import statekernel.stores
from statekernel._records.run import utcnow
from statekernel._storage.protocol import StoreWrapper
from statekernel._storage.queues import RunQueue, RunQueues
from statekernel.errors import InvalidArgument, StoreError
from statekernel.testing import ScriptedProvider, call

from .test_worker import FAST, serve, until

SUBMITTER = {"scripted": ScriptedProvider([])}


def agent(script: list[object], ran: Counter[str], **ask: Any) -> Callable[[], Mapping[str, Any]]:
    """A scripted model, an ``ask_user`` tool with ``ask`` and a ``note`` tool whose
    executions ``ran`` counts (not idempotent)."""

    @sk.tool
    def note(text: str) -> str:
        """Note it.

        Args:
            text: What.
        """
        ran[text] += 1
        return f"noted {text}"

    @sk.tool
    def nap(seconds: float) -> str:
        """Sleep durably.

        Args:
            seconds: How long.
        """
        sk.sleep_until(utcnow() + timedelta(seconds=seconds), result="rested")

    tools = [note, nap, sk.ask_user(**ask)]
    return lambda: {"tools": tools, "providers": {"scripted": ScriptedProvider(script)}}


async def paused_with_nobody(feed_store_url: str, options: Mapping[str, Any], **start: Any) -> str:
    """Drive a new run to its pause, then close its kernel: nobody watches it."""
    async with sk.Kernel(feed_store_url, **options) as kernel:
        run = await kernel.start(model="scripted/m", messages=["go"], **start)
        async for _ in kernel.run(run.run_id):
            pass
        assert (await kernel.get(run.run_id)).state == "paused"
        return run.run_id


@pytest.fixture
async def reader(feed_store_url: str) -> AsyncIterator[sk.Kernel]:
    kernel = sk.Kernel(feed_store_url, providers=SUBMITTER)
    yield kernel
    await kernel.aclose()


async def test_a_question_times_out_with_nobody_watching_fired_once_by_three_workers(
    feed_store_url: str, reader: sk.Kernel
) -> None:
    ran: Counter[str] = Counter()
    script = [call("ask_user", {"question": "Ship?"}), call("note", {"text": "after"}), "done"]
    options = agent(script, ran, timeout=0, on_timeout="no answer: ship")
    run_id = await paused_with_nobody(feed_store_url, options())
    workers = [
        sk.Worker(feed_store_url, agent=options, timers=True, timer_every=0.05, **FAST)
        for _ in range(3)
    ]
    tasks = [await serve(w) for w in workers]
    await until(lambda: _state_is(reader, run_id, "completed"))
    for w in workers:
        w.stop()
    stats = [await t for t in tasks]
    assert sum(s.timers_fired for s in stats) == 1
    events = [e.type for e in await reader.events(run_id)]
    assert events.count("timer_fired") == 1
    assert events.count("run_resumed") == 1
    assert ran == Counter({"after": 1})  # the run went on once, from the answer
    done = await reader.get(run_id)
    assert done.turns[0].completed[0].output == "no answer: ship"


async def test_a_durable_sleep_outlives_its_worker(feed_store_url: str, reader: sk.Kernel) -> None:
    ran: Counter[str] = Counter()
    script = [call("nap", {"seconds": 0.3}), call("note", {"text": "woke"}), "done"]
    options = agent(script, ran)
    run = await reader.start(model="scripted/m", messages=["go"])
    await reader.submit(run.run_id)
    first = sk.Worker(feed_store_url, agent=options, timers=True, timer_every=0.05, **FAST)
    task = await serve(first)
    await until(lambda: _state_is(reader, run.run_id, "paused"))
    asleep = await reader.get(run.run_id)
    first.stop()  # the worker that put it to sleep goes away
    assert (await task).timers_fired == 0
    assert asleep.pause is not None
    timer = asleep.pause.timer
    assert timer is not None
    second = sk.Worker(feed_store_url, agent=options, timers=True, timer_every=0.05, **FAST)
    task = await serve(second)
    await until(lambda: _state_is(reader, run.run_id, "completed"))
    second.stop()
    assert (await task).timers_fired == 1
    (fired,) = [e for e in await reader.events(run.run_id) if e.type == "timer_fired"]
    assert fired.at >= timer.at  # never woken before its time
    assert ran == Counter({"woke": 1})


async def test_a_paused_run_past_its_deadline_fails_by_a_worker(
    feed_store_url: str, reader: sk.Kernel
) -> None:
    ran: Counter[str] = Counter()
    options = agent([call("ask_user", {"question": "?"}), "done"], ran)
    run_id = await paused_with_nobody(
        feed_store_url, options(), deadline=utcnow() + timedelta(seconds=1)
    )
    worker = sk.Worker(feed_store_url, agent=options, timers=True, timer_every=0.05, **FAST)
    task = await serve(worker)
    await until(lambda: _state_is(reader, run_id, "failed"))
    worker.stop()
    assert (await task).timers_fired == 1
    failed = await reader.get(run_id)
    assert failed.failure is not None
    assert failed.failure.error == "DeadlineExceeded"


async def _state_is(kernel: sk.Kernel, run_id: str, state: str) -> bool:
    await asyncio.sleep(0)
    return (await kernel.get(run_id)).state == state


async def test_a_delayed_submit_is_taken_no_sooner_than_asked(
    feed_store_url: str, reader: sk.Kernel
) -> None:
    later = await reader.start(model="scripted/m", messages=["go"], run_id="later")
    soon = await reader.start(model="scripted/m", messages=["go"], run_id="soon")
    await reader.submit(later.run_id, delay=3600)  # not within this test
    began = asyncio.get_running_loop().time()
    await reader.submit(soon.run_id, delay=0.3)
    assert isinstance(reader.store, sk.stores.RunQueues)
    queue = reader.store.run_queue("default")
    await queue.prepare()
    assert await queue.waiting() == 2  # both wait, apart from the entries ready now
    taken: list[str] = []
    while not taken:
        taken = [e.run_id for e in await queue.read("reader", 10, 50)]
    assert taken == ["soon"]  # the hour-long delay keeps the other one back
    assert asyncio.get_running_loop().time() - began >= 0.3
    assert await queue.waiting() == 1
    with pytest.raises(InvalidArgument, match="delay"):
        await reader.submit(soon.run_id, delay=-1)


async def test_workers_keep_a_keys_limit_of_runs_in_flight(
    feed_store_url: str, reader: sk.Kernel
) -> None:
    active: set[str] = set()
    peak = 0

    async def track(invocation: Any, nxt: Any) -> Any:
        nonlocal peak
        active.add(invocation.run.run_id)
        peak = max(peak, len(active))
        try:
            await asyncio.sleep(0.1)  # overlaps runs taken together (an upper bound below)
            return await nxt(invocation)
        finally:
            active.discard(invocation.run.run_id)

    ran: Counter[str] = Counter()
    base = agent([call("note", {"text": "x"}), "done"], ran)
    ids = [f"t{i}" for i in range(6)]
    for run_id in ids:
        await reader.start(model="scripted/m", messages=["go"], run_id=run_id)
        await reader.submit(run_id, key="tenant-1", key_limit=2)
    options = lambda: {**base(), "middleware": [track]}  # noqa: E731
    workers = [sk.Worker(feed_store_url, agent=options, concurrency=5, **FAST) for _ in range(3)]
    tasks = [await serve(w) for w in workers]
    await until(lambda: _all_completed(reader, ids))
    for w in workers:
        w.stop()
    for task in tasks:
        await task
    assert peak <= 2
    assert ran == Counter({"x": 6})


async def _all_completed(kernel: sk.Kernel, ids: list[str]) -> bool:
    return all([await _state_is(kernel, run_id, "completed") for run_id in ids])


class SubmitFailsOnce(StoreWrapper):
    """A store with run queues whose first submit fails (the store unreachable)."""

    failed = False

    async def submit(self, run_id: str, queue: str = "default", **how: Any) -> str:
        if not self.failed:
            self.failed = True
            raise StoreError("the store is unreachable for a moment")
        assert isinstance(self.inner, RunQueues)
        return await self.inner.submit(run_id, queue, **how)

    def run_queue(self, name: str) -> RunQueue:
        assert isinstance(self.inner, RunQueues)
        return self.inner.run_queue(name)

    async def aclose(self) -> None:
        """The store stays open for the reader."""


async def test_a_run_a_timer_moved_on_is_handed_to_the_queue_past_a_store_failure(
    feed_store_url: str, reader: sk.Kernel
) -> None:
    ran: Counter[str] = Counter()
    script = [call("ask_user", {"question": "?"}), call("note", {"text": "on"}), "done"]
    options = agent(script, ran, timeout=0, on_timeout="late")
    run_id = await paused_with_nobody(feed_store_url, options())
    flaky = SubmitFailsOnce(reader.store)
    worker = sk.Worker(flaky, agent=options, timers=True, timer_every=0.05, **FAST)
    task = await serve(worker)
    await until(lambda: _state_is(reader, run_id, "completed"))
    worker.stop()
    assert (await task).timers_fired == 1
    assert flaky.failed
    assert ran == Counter({"on": 1})
