"""``Worker`` in one process: acknowledgement, failures, backpressure, reclaim, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import pytest

import statekernel as sk
from statekernel._storage.protocol import Lease, StoreWrapper
from statekernel._storage.queues import RunQueue, RunQueues
from statekernel.errors import ConfigError, InvalidArgument, ProviderError, RunNotFound
from statekernel.stores.redis._queue import GROUP, RedisRunQueue
from statekernel.testing import Fail, Reply, ScriptedProvider, call


class Timing(TypedDict):
    lease_ttl: float
    block: float
    grace: float


FAST: Timing = {"lease_ttl": 2.0, "block": 0.05, "grace": 5.0}
"""Short enough that a test waits little for a lease to lapse, long enough that a loaded
machine (a cluster queue is slower) does not let a live worker's lease lapse."""
SUBMITTER = {"scripted": ScriptedProvider([])}
"""What a process that only starts runs for the workers needs: the provider's name."""


@pytest.fixture
def kernel(queue_kernel: sk.Kernel) -> sk.Kernel:
    """A kernel on each store with run queues in turn (Redis also on a Redis Cluster)."""
    return queue_kernel


def queue_of(kernel: sk.Kernel, name: str = "default") -> RunQueue:
    assert isinstance(kernel.store, RunQueues)
    return kernel.store.run_queue(name)


async def released(kernel: sk.Kernel, ids: Sequence[str]) -> bool:
    """True when another owner takes each run's lease at once (the worker gave it back)."""
    for run_id in ids:
        lease = await kernel.store.acquire(run_id, "someone-else", ttl=5)
        await kernel.store.release(lease)
    return True


def agent(
    script: Sequence[object],
    *,
    ran: Counter[str] | None = None,
    tool_delay: float = 0.0,
    gate: asyncio.Event | None = None,
) -> Callable[[], Mapping[str, Any]]:
    """Kernel options: a scripted model and a ``note`` tool counting its executions (and,
    with ``gate``, returning only once it is set)."""
    counts = ran if ran is not None else Counter()

    @sk.tool
    async def note(text: str, ctx: sk.ToolContext) -> str:
        """Not idempotent."""
        counts[ctx.idempotency_key] += 1
        await asyncio.sleep(tool_delay)
        if gate is not None:
            await gate.wait()
        return f"noted {text}"

    return lambda: {"tools": [note], "providers": {"scripted": ScriptedProvider(script)}}


def note_then_done(delay: float = 0.0) -> list[object]:
    return [
        Reply(tool_calls=(call("note", {"text": "a"}),), delay=delay),
        Reply("done", delay=delay),
    ]


async def submit_new(kernel: sk.Kernel, n: int, queue: str = "default") -> list[str]:
    ids = []
    for i in range(n):
        run = await kernel.start(model="scripted/x", messages=["go"], run_id=f"run-{i}")
        await kernel.submit(run.run_id, queue=queue)
        ids.append(run.run_id)
    return ids


async def until(predicate: Callable[[], Any], within: float = 120.0) -> None:
    """Wait until ``predicate()``; ``within`` only ends a failing test (a loaded machine
    may take long)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def states(kernel: sk.Kernel, ids: Sequence[str]) -> list[str]:
    return [(await kernel.get(i)).state for i in ids]


async def all_in(kernel: sk.Kernel, ids: Sequence[str], state: str) -> bool:
    return set(await states(kernel, ids)) == {state}


async def queue_empty(q: RunQueue) -> bool:
    """No entry waits or is delivered and unsettled. An entry goes from waiting to
    delivered, then away (or back to waiting when handed back): read in that order, an
    entry delivered between two reads is not missed (it was, read the other way round)."""
    return await q.waiting() == 0 and await q.pending() == 0 and await q.waiting() == 0


async def serve(worker: sk.Worker) -> asyncio.Task[sk.WorkerStats]:
    task = asyncio.create_task(worker.serve())
    await asyncio.sleep(0)
    return task


async def test_submitted_runs_complete_and_nothing_stays_pending(kernel: sk.Kernel) -> None:
    ran: Counter[str] = Counter()
    ids = await submit_new(kernel, 30)
    worker = sk.Worker(kernel.store, agent=agent(note_then_done(), ran=ran), concurrency=8, **FAST)
    task = await serve(worker)
    await until(lambda: all_in(kernel, ids, "completed"))
    q = queue_of(kernel)
    await until(lambda: queue_empty(q))
    worker.stop()
    stats = await task
    assert (stats.completed, stats.taken, stats.failed, stats.lost) == (30, 30, 0, 0)
    assert stats.max_in_flight == 8
    assert set(ran.values()) == {1}
    assert len(ran) == 30
    assert worker.holding == {}
    assert await released(kernel, ids)
    assert await q.pending(worker.name) == 0
    assert await q.dead_letters() == []


async def test_never_more_runs_in_flight_than_concurrency(kernel: sk.Kernel) -> None:
    active: set[str] = set()
    peak = 0
    overlapped = asyncio.Event()  # three runs in a call at once: the worker's limit reached

    async def track(call_: Any, nxt: Any) -> Any:
        nonlocal peak
        active.add(call_.run.run_id)
        peak = max(peak, len(active))
        if len(active) >= 3:
            overlapped.set()
        try:
            # the first calls wait for the others (not for the clock), so the peak is
            # reached however slow the machine; the timeout only ends a failing test
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(overlapped.wait(), 60)
            return await nxt(call_)
        finally:
            active.discard(call_.run.run_id)

    base = agent(note_then_done(delay=0.02))
    ids = await submit_new(kernel, 12)
    options = lambda: {**base(), "middleware": [track]}  # noqa: E731
    worker = sk.Worker(kernel.store, agent=options, concurrency=3, **FAST)
    task = await serve(worker)
    await until(lambda: all_in(kernel, ids, "completed"))
    worker.stop()
    stats = await task
    assert peak == 3
    assert stats.max_in_flight == 3


async def test_failed_run_is_acknowledged_with_its_failure_recorded(kernel: sk.Kernel) -> None:
    script = [Fail(ProviderError("model down", provider="scripted"), times=5)]
    ids = await submit_new(kernel, 1)
    worker = sk.Worker(kernel.store, agent=agent(script), concurrency=2, **FAST)
    task = await serve(worker)
    await until(lambda: all_in(kernel, ids, "failed"))
    q = queue_of(kernel)
    await until(lambda: queue_empty(q))
    worker.stop()
    assert (await task).failed == 1
    (dead,) = await q.dead_letters()
    assert (dead.run_id, dead.reason, dead.worker) == (ids[0], "failed", worker.name)
    assert "model down" in dead.detail
    assert dead.at_ms > 0


async def test_paused_run_is_acknowledged_and_can_be_submitted_again(kernel: sk.Kernel) -> None:
    class Approve(sk.Hooks):
        def on_tool_call_started(self, run: sk.Run, call_: Any) -> Any:
            if run.resume_value != "yes":
                return sk.Pause("approval", {})
            return None

    base = agent(note_then_done())
    ids = await submit_new(kernel, 1)
    worker = sk.Worker(
        kernel.store, agent=lambda: {**base(), "hooks": Approve()}, concurrency=2, **FAST
    )
    task = await serve(worker)
    q = queue_of(kernel)
    await until(lambda: all_in(kernel, ids, "paused"))
    await until(lambda: queue_empty(q))
    await kernel.resume(ids[0], value="yes")
    await kernel.submit(ids[0])
    await until(lambda: all_in(kernel, ids, "completed"))
    await until(lambda: queue_empty(q))
    worker.stop()
    stats = await task
    assert (stats.paused, stats.completed) == (1, 1)


async def test_entry_for_an_unknown_run_goes_to_the_dead_letters(kernel: sk.Kernel) -> None:
    q = queue_of(kernel)
    await q.submit("no-such-run")
    worker = sk.Worker(kernel.store, agent=agent(["done"]), **FAST)
    task = await serve(worker)
    await until(lambda: queue_empty(q))
    worker.stop()
    assert (await task).errors == 1
    (dead,) = await q.dead_letters()
    assert (dead.run_id, "RunNotFound" in dead.detail) == ("no-such-run", True)


async def test_submit_needs_a_store_with_queues_an_existing_run_and_a_valid_queue(
    kernel: sk.Kernel,
) -> None:
    memory = sk.Kernel("memory://", providers=SUBMITTER)
    run = await memory.start(model="scripted/x", run_id="m1")
    with pytest.raises(ConfigError, match="run queues"):
        await memory.submit(run.run_id)
    with pytest.raises(RunNotFound):
        await kernel.submit("missing")
    await kernel.start(model="scripted/x", run_id="r1")
    with pytest.raises(InvalidArgument):
        await kernel.submit("r1", queue="{bad}")
    with pytest.raises(ConfigError):
        await sk.Worker("memory://").serve()


class Dies(StoreWrapper):
    """A store whose owner dies holding its leases once ``dead``: from then on it never
    renews nor releases them (they end when they expire)."""

    dead = False

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        if not self.dead:
            await self.inner.renew(lease, ttl=ttl)

    async def release(self, lease: Lease) -> None:
        if not self.dead:
            await self.inner.release(lease)

    async def aclose(self) -> None:
        """The store stays open for the others."""


DYING_TTL = 2.0
"""The lease of a worker that dies: long enough that its first commits come before it
lapses on a loaded machine; the worker that reclaims the run waits this long."""


async def crashed_holder(kernel: sk.Kernel, ttl: float) -> tuple[list[str], RunQueue]:
    """A worker that took a run, committed the model intent under its lease, and died."""
    ids = await submit_new(kernel, 1)
    store = kernel.store
    q = queue_of(kernel)
    await q.prepare()
    (entry,) = await q.read("dead-worker", 1, 100)
    await q.aclose()
    dies = Dies(store)
    dying = sk.Kernel(dies, lease_ttl=ttl, **agent(note_then_done())())
    for step in range(3):  # start, turn_prepared, model_started
        dies.dead = step == 2
        await dying.step(entry.run_id)
    await dying.aclose()
    return ids, q


async def test_a_crashed_workers_run_is_reclaimed_after_its_lease_expires(
    kernel: sk.Kernel,
) -> None:
    ids, q = await crashed_holder(kernel, ttl=DYING_TTL)
    assert await q.pending("dead-worker") == 1
    worker = sk.Worker(kernel.store, agent=agent(note_then_done()), **FAST)
    task = await serve(worker)
    await until(lambda: all_in(kernel, ids, "completed"))
    await until(lambda: queue_empty(q))
    worker.stop()
    stats = await task
    assert stats.reclaimed == 1
    assert stats.completed == 1
    kinds = [e.type for e in await kernel.events(ids[0])]
    assert kinds.count("model_restarted") == 1
    assert kinds.count("run_completed") == 1


async def test_an_entry_delivered_too_often_goes_to_the_dead_letters(
    kernel: sk.Kernel,
) -> None:
    ids, q = await crashed_holder(kernel, ttl=DYING_TTL)
    worker = sk.Worker(kernel.store, agent=agent(["done"]), max_deliveries=1, **FAST)
    task = await serve(worker)
    await until(lambda: queue_empty(q))
    worker.stop()
    assert (await task).errors == 1
    (dead,) = await q.dead_letters()
    assert (dead.reason, dead.run_id) == ("deliveries", ids[0])


async def test_a_live_holder_keeps_its_run_past_the_lease_ttl(kernel: sk.Kernel) -> None:
    """Leases and entries are refreshed: a slow model call is not reclaimed by a peer."""
    ran: Counter[str] = Counter()
    # the model call outlasts the ttl 2.5 times; the ttl leaves a loaded machine room
    # to renew in time (renewals come every third of it)
    timing: Timing = {**FAST, "lease_ttl": 2.0}
    slow = [Reply(tool_calls=(call("note", {"text": "a"}),), delay=5.0), Reply("done")]
    ids = await submit_new(kernel, 1)
    first = sk.Worker(kernel.store, agent=agent(slow, ran=ran), name="first", **timing)
    task1 = await serve(first)
    await until(lambda: all_in(kernel, ids, "calling_model"))
    second = sk.Worker(kernel.store, agent=agent(slow, ran=ran), name="second", **timing)
    task2 = await serve(second)
    await until(lambda: all_in(kernel, ids, "completed"))
    first.stop()
    second.stop()
    s1, s2 = await task1, await task2
    kinds = [e.type for e in await kernel.events(ids[0])]
    assert (s1.completed, s1.lost, s2.taken) == (1, 0, 0), (s1, s2, kinds)
    assert "model_restarted" not in kinds
    assert list(ran.values()) == [1]


async def test_stop_lets_in_flight_tools_commit_and_hands_runs_back(kernel: sk.Kernel) -> None:
    ran: Counter[str] = Counter()
    script = [Reply(tool_calls=(call("note", {"text": "a"}),)), Reply("done")]
    ids = await submit_new(kernel, 4)
    gate = asyncio.Event()  # the tools end only once the worker was told to stop
    first = sk.Worker(kernel.store, agent=agent(script, ran=ran, gate=gate), **FAST)
    task = await serve(first)
    await until(lambda: _started_tools(kernel, ids, 4))
    first.stop()
    gate.set()
    stats = await task
    # every run taken was handed back; one handed back while the worker's last read of
    # the queue was still waiting (a loaded machine) came back in that read: taken again,
    # and handed back again
    assert stats.requeued == stats.taken >= 4
    assert stats.completed == 0
    assert first.holding == {}
    q = queue_of(kernel)
    assert await q.pending() == 0
    assert await q.waiting() == 4
    for run_id in ids:  # the tool calls in flight finished and were committed
        run = await kernel.get(run_id)
        assert run.current_turn is not None
        assert not run.current_turn.in_flight
    second = sk.Worker(kernel.store, agent=agent(script, ran=ran), **FAST)
    task2 = await serve(second)
    await until(lambda: all_in(kernel, ids, "completed"))
    second.stop()
    assert (await task2).completed == 4
    assert set(ran.values()) == {1}
    assert len(ran) == 4


async def test_a_worker_stopped_by_the_commit_that_completes_a_run_acknowledges_it(
    kernel: sk.Kernel,
) -> None:
    """``stop()`` while the final commit is being read: the run is at rest, not handed back."""
    workers: list[sk.Worker] = []

    class StopBeforeTheLastCommit(sk.Hooks):
        def on_model_completed(self, run: sk.Run, result: sk.ModelResult) -> None:
            if not result.tool_calls:
                workers[0].stop()  # the commit of this answer completes the run

    options = agent(note_then_done())
    worker = sk.Worker(
        kernel.store, agent=lambda: {**options(), "hooks": StopBeforeTheLastCommit()}, **FAST
    )
    workers.append(worker)
    ids = await submit_new(kernel, 1)
    stats = await asyncio.wait_for(await serve(worker), 120)
    assert (stats.completed, stats.requeued) == (1, 0)
    assert await states(kernel, ids) == ["completed"]
    assert await queue_empty(queue_of(kernel))


async def _started_tools(kernel: sk.Kernel, ids: Sequence[str], n: int) -> bool:
    started = 0
    for run_id in ids:
        started += any(e.type == "tool_call_started" for e in await kernel.events(run_id))
    return started >= n


async def test_cancelling_serve_hands_the_runs_back_at_once(kernel: sk.Kernel) -> None:
    ids = await submit_new(kernel, 3)
    worker = sk.Worker(kernel.store, agent=agent([Reply("done", delay=30.0)]), **FAST)
    task = await serve(worker)
    await until(lambda: _seen(kernel, ids, "model_started"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 60)
    assert worker.holding == {}
    q = queue_of(kernel)
    assert await q.pending() == 0
    assert await q.waiting() == 3
    with pytest.raises(InvalidArgument, match="serves once"):
        await worker.serve()


async def _seen(kernel: sk.Kernel, ids: Sequence[str], kind: str) -> bool:
    return all([any(e.type == kind for e in await kernel.events(i)) for i in ids])


async def test_duplicate_submissions_drive_a_run_once(kernel: sk.Kernel) -> None:
    ran: Counter[str] = Counter()
    ids = await submit_new(kernel, 1)
    for _ in range(3):
        await kernel.submit(ids[0])
    workers = [
        sk.Worker(kernel.store, agent=agent(note_then_done(0.05), ran=ran), **FAST)
        for _ in range(2)
    ]
    tasks = [await serve(w) for w in workers]
    q = queue_of(kernel)
    await until(lambda: all_in(kernel, ids, "completed"))
    await until(lambda: queue_empty(q))
    for w in workers:
        w.stop()
    await asyncio.gather(*tasks)
    kinds = [e.type for e in await kernel.events(ids[0])]
    assert kinds.count("run_completed") == 1
    assert list(ran.values()) == [1]
    if isinstance(q, RedisRunQueue):
        consumers = await q.client.xinfo_consumers(q.key, GROUP)
        assert consumers == [], "stopped workers leave the group"


def test_worker_command_reports_mistakes_in_one_line(kernel: sk.Kernel) -> None:
    from click.testing import CliRunner

    from statekernel._cli.main import cli

    runner = CliRunner()
    done = runner.invoke(cli, ["worker", "--help"])
    assert done.exit_code == 0
    assert "--concurrency" in done.output
    for agent_spec, needle in [
        ("no_colon", "package.module:function"),
        ("no_such_module_xyz:make", "cannot load"),
        ("statekernel:__version__x", "cannot load"),
    ]:
        done = runner.invoke(cli, ["worker", "--store", "redis://x", "--agent", agent_spec])
        assert (done.exit_code, needle in done.output) == (2, True), done.output
    done = runner.invoke(cli, ["worker", "--store", "memory://"])
    assert (done.exit_code, "run queues" in done.output) == (2, True), done.output
    done = runner.invoke(cli, ["worker", "--store", "sqlite:///x.db"])
    assert done.exit_code == 2
    assert done.output.strip().splitlines() == [  # no banner before the error
        "error: a worker needs a store with run queues (redis://, rediss:// or"
        " postgresql://), not 'sqlite:///x.db'"
    ]
    done = runner.invoke(cli, ["worker", "--help"])
    assert "--json" in done.output
