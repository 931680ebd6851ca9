"""One owner per run, exact commit outcomes and results kept through store failures.

In-process tests on every store; two real processes racing live in
``test_ownership_processes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import InvalidArgument, LeaseLost, StoreError
from statekernel.stores import (
    Checkpoint,
    CheckpointStore,
    FileStore,
    Lease,
    MemoryStore,
    SQLiteStore,
    StoreWrapper,
    open_store,
)
from statekernel.testing import ManualClock, ScriptedProvider, call

from ...conftest import STORE_KINDS

KINDS = STORE_KINDS
HOST_KINDS = ["memory", "file", "sqlite"]
"""The stores whose leases expire on a clock they are given (Redis expires them itself)."""
_n = itertools.count()


@pytest.fixture(params=KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    n = next(_n)
    if kind == "memory":
        return f"memory://own-{n}-{id(tmp_path)}"
    if kind == "file":
        return f"file://{tmp_path}/files"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    return str(request.getfixturevalue(f"{kind.replace('-', '_')}_store_url"))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000.0)


@pytest.fixture(params=HOST_KINDS)
async def clocked_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[CheckpointStore]:
    """A memory, file or SQLite store whose leases expire on ``clock``."""
    store: CheckpointStore
    if request.param == "memory":
        store = MemoryStore(clock=clock)
    elif request.param == "file":
        store = FileStore(f"file://{tmp_path}/files", clock=clock)
    else:
        store = SQLiteStore(f"sqlite:///{tmp_path}/runs.db", clock=clock)
    try:
        yield store
    finally:
        await store.aclose()


class Renewals(StoreWrapper):
    """Notes when each lease renewal began on the store's clock, once it has landed."""

    def __init__(self, inner: CheckpointStore, clock: ManualClock) -> None:
        super().__init__(inner)
        self.clock = clock
        self.landed: list[float] = []

    async def renew(self, lease: Lease, *, ttl: float) -> None:
        began = self.clock()
        await self.inner.renew(lease, ttl=ttl)
        self.landed.append(began)

    async def advance_renewed(self, seconds: float) -> None:
        """Move the clock on, then wait for a renewal made at the new time to land."""
        now = self.clock.advance(seconds)
        deadline = asyncio.get_running_loop().time() + 10
        while not any(t >= now for t in self.landed):  # at the renewer's real-time pace
            assert asyncio.get_running_loop().time() < deadline, "the lease is not renewed"
            await asyncio.sleep(0.005)


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[CheckpointStore]:
    store = open_store(url)
    try:
        yield store
    finally:
        await store.aclose()


class Ledger:
    """Executions of the tools, and how many run at once per call."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.running: dict[str, int] = {}
        self.overlaps: list[str] = []
        self.gate = asyncio.Event()

    def tools(self, *, hold: bool = False) -> list[sk.Tool]:
        @sk.tool
        async def charge(amount: int, ctx: sk.ToolContext) -> str:
            """Charge a card (not idempotent)."""
            key = ctx.idempotency_key
            self.started.append(key)
            self.running[key] = self.running.get(key, 0) + 1
            if self.running[key] > 1:
                self.overlaps.append(key)
            try:
                if hold:
                    await self.gate.wait()
                await asyncio.sleep(0.02)
            finally:
                self.running[key] -= 1
            return f"charged {amount}"

        return [charge]


SCRIPT: list[object] = [call("charge", {"amount": 5}), call("charge", {"amount": 7}), "paid"]


def kernel_on(store: CheckpointStore, ledger: Ledger, **kwargs: Any) -> sk.Kernel:
    hold = kwargs.pop("hold", False)
    return sk.Kernel(
        store,
        tools=ledger.tools(hold=hold),
        providers={"scripted": ScriptedProvider(SCRIPT)},
        **kwargs,
    )


async def drain(kernel: sk.Kernel, run_id: str) -> list[sk.Event]:
    return [e async for e in kernel.run(run_id)]


async def test_a_second_owner_waits_then_gets_run_busy(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = Ledger()
    async with opened(store_url) as store:
        owner = kernel_on(store, ledger, hold=True)
        # a timeout well past one acquire's time on a loaded machine: the first refusal
        # comes before it, so the kernel waits (and says so) before it gives up
        other = kernel_on(store, ledger, busy_timeout=1.0)
        run = await owner.start(model="scripted/x", messages=["pay"])
        driving = asyncio.create_task(drain(owner, run.run_id))
        while not ledger.started:  # noqa: ASYNC110 - waits for the tool to be inside its effect
            await asyncio.sleep(0.005)
        with pytest.raises(sk.RunBusy) as busy:
            await drain(other, run.run_id)
        assert busy.value.owner == owner.owner
        assert busy.value.waited >= 0.1
        said = [r for r in caplog.records if "waiting up to" in r.getMessage()]
        assert len(said) == 1  # the wait is said once, naming the holder and the run
        assert owner.owner in said[0].getMessage()
        assert said[0].run_id == run.run_id  # type: ignore[attr-defined]
        with pytest.raises(sk.RunBusy):
            await other.send(run.run_id, "more")  # commands wait for the owner too
        with pytest.raises(sk.RunBusy):
            await other.update_context(run.run_id, lambda ctx: {**ctx, "plan": "b"})
        with pytest.raises(sk.RunBusy):
            await other.resolve_tool_call(run.run_id, "call_0_0", output="paid")
        with pytest.raises(sk.RunBusy):
            await other.resume(run.run_id)
        head = await store.load(run.run_id)
        assert head.state == "dispatching_tools"
        assert head.current_turn is not None
        assert [r.id for r in head.current_turn.in_flight] == ["call_0_0"]  # not uncertain
        ledger.gate.set()
        await driving
        assert (await store.load(run.run_id)).state == "completed"
        assert ledger.started == [f"{run.run_id}:call_0_0", f"{run.run_id}:call_1_0"]
        assert not ledger.overlaps
        await owner.aclose()
        await other.aclose()


async def test_a_waiting_owner_takes_over_when_the_first_finishes(store_url: str) -> None:
    ledger = Ledger()
    async with opened(store_url) as store:
        first = kernel_on(store, ledger, hold=True)
        second = kernel_on(store, ledger, busy_timeout=30)
        run = await first.start(model="scripted/x", messages=["pay"])
        driving = asyncio.create_task(drain(first, run.run_id))
        while not ledger.started:  # noqa: ASYNC110 - waits for the tool to be inside its effect
            await asyncio.sleep(0.005)
        waiting = asyncio.create_task(drain(second, run.run_id))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        ledger.gate.set()
        await driving
        assert await waiting == []  # found it completed: nothing to do
        assert len(ledger.started) == 2
        assert not ledger.overlaps
        await first.aclose()
        await second.aclose()


TTL = 0.06
"""The lease time to live of the kernels whose renewals the tests watch: they renew
every third of it in real time, while the store's clock moves only when a test says."""


async def test_leases_are_renewed_while_a_drive_runs(
    clocked_store: CheckpointStore, clock: ManualClock
) -> None:
    ledger = Ledger()
    store = Renewals(clocked_store, clock)
    owner = kernel_on(store, ledger, hold=True, lease_ttl=TTL)
    other = kernel_on(store, ledger, busy_timeout=0.1)
    run = await owner.start(model="scripted/x", messages=["pay"])
    driving = asyncio.create_task(drain(owner, run.run_id))
    while not ledger.started:  # noqa: ASYNC110 - waits for the tool to be inside its effect
        await asyncio.sleep(0.005)
    for _ in range(3):  # three times the lease's time to live, renewed on the way
        await store.advance_renewed(TTL * 0.9)
    with pytest.raises(sk.RunBusy):
        await drain(other, run.run_id)
    ledger.gate.set()
    await driving
    assert len(ledger.started) == 2
    await owner.aclose()
    await other.aclose()


class Flaky(StoreWrapper):
    """Fails commits of chosen kinds: before they reach the store, or after they landed."""

    def __init__(self, inner: CheckpointStore, plan: Callable[[Checkpoint], str]) -> None:
        super().__init__(inner)
        self.plan = plan
        self.failures = 0

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        what = self.plan(checkpoint)
        if what == "before":
            self.failures += 1
            raise StoreError("connection refused")
        await self.inner.commit(checkpoint, lease=lease)
        if what == "after":
            self.failures += 1
            raise StoreError("connection reset after the write")


def completions(failures: int, when: str) -> Callable[[Checkpoint], str]:
    left = [failures]

    def plan(cp: Checkpoint) -> str:
        if any(e.type == "tool_call_completed" for e in cp.events) and left[0] > 0:
            left[0] -= 1
            return when
        return ""

    return plan


@pytest.mark.parametrize("when", ["before", "after"])
async def test_results_in_hand_survive_failed_commits(store_url: str, when: str) -> None:
    ledger = Ledger()
    async with opened(store_url) as inner:
        store = Flaky(inner, completions(3, when))
        kernel = kernel_on(store, ledger)
        run = await kernel.start(model="scripted/x", messages=["pay"])
        await drain(kernel, run.run_id)
        final = await inner.load(run.run_id)
        assert final.state == "completed"  # never paused as uncertain
        assert store.failures == (3 if when == "before" else 2)  # one per commit after
        assert len(ledger.started) == 2  # nothing ran twice
        kinds = [e.type for e in await inner.events(run.run_id)]
        assert kinds.count("tool_call_completed") == 2  # a landed commit is not repeated
        await kernel.aclose()


async def test_a_store_that_stays_down_keeps_the_results_for_the_next_drive(
    tmp_path: Path,
) -> None:
    ledger = Ledger()
    async with opened(f"sqlite:///{tmp_path}/runs.db") as inner:
        down = [True]
        store = Flaky(inner, lambda cp: "before" if down[0] and cp.run.revision > 2 else "")
        kernel = kernel_on(store, ledger)
        run = await kernel.start(model="scripted/x", messages=["pay"])
        with pytest.raises(StoreError):
            await drain(kernel, run.run_id)
        assert len(ledger.started) == 1
        down[0] = False
        await drain(kernel, run.run_id)
        final = await inner.load(run.run_id)
        assert final.state == "completed"
        assert [r.resolved for t in final.turns for r in t.completed] == [False, False]
        assert len(ledger.started) == 2
        await kernel.aclose()


class SlowAfter(StoreWrapper):
    """Lands the first commit with an event of ``kind``, then keeps the caller waiting
    (to be cancelled)."""

    def __init__(self, inner: CheckpointStore, kind: str) -> None:
        super().__init__(inner)
        self.kind = kind
        self.landed = asyncio.Event()

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        await self.inner.commit(checkpoint, lease=lease)
        if not self.landed.is_set() and any(e.type == self.kind for e in checkpoint.events):
            self.landed.set()
            await asyncio.sleep(1.0)  # the caller is cancelled meanwhile


async def cancelled_after_landing(kernel: sk.Kernel, store: SlowAfter) -> sk.Run:
    """Start a run, drive it, and cancel the drive while ``store`` keeps it waiting
    after the commit it watches for landed."""
    run = await kernel.start(model="scripted/x", messages=["pay"])
    task = asyncio.create_task(drain(kernel, run.run_id))
    await store.landed.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return run


async def test_a_cancelled_drive_keeps_an_intent_that_landed(store_url: str) -> None:
    ledger = Ledger()
    async with opened(store_url) as inner:
        store = SlowAfter(inner, "tool_call_started")
        kernel = kernel_on(store, ledger)
        run = await cancelled_after_landing(kernel, store)
        assert not ledger.started  # the intent landed, the effect never began
        kernel.store = inner
        await drain(kernel, run.run_id)
        final = await inner.load(run.run_id)
        assert final.state == "completed"  # not paused as uncertain: it knew
        assert len(ledger.started) == 2
        assert final.turns[0].completed[0].attempt == 1
        await kernel.aclose()


@pytest.mark.redis
async def test_a_resent_redis_commit_knows_it_landed(
    redis_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from statekernel.stores.redis._wire import Wire

    real = Wire._once
    cut = [0]

    async def once(self: Wire, commands: Any, conn: Any) -> list[Any]:
        replies = await real(self, commands, conn)
        if cut[0] == 0 and any(c[0] == "EVALSHA" for c in commands):
            cut[0] += 1
            raise RedisConnectionError("connection lost before the reply")
        return replies

    async with opened(redis_store_url) as store:
        ledger = Ledger()
        kernel = kernel_on(store, ledger)
        run = await kernel.start(model="scripted/x", messages=["pay"])
        monkeypatch.setattr(Wire, "_once", once)
        await drain(kernel, run.run_id)  # no ConflictError for a commit that landed
        assert cut[0] == 1
        final = await store.load(run.run_id)
        assert final.state == "completed"
        assert len(ledger.started) == 2
        await kernel.aclose()


async def test_cancellation_at_any_moment_never_makes_a_call_uncertain_that_never_began(
    store_url: str,
) -> None:
    """Cancel drives at many moments (some inside a commit): an uncertain pause may only
    name calls whose effect began."""
    async with opened(store_url) as store:
        for i in range(12):
            ledger = Ledger()
            kernel = kernel_on(store, ledger)
            run = await kernel.start(model="scripted/x", messages=["pay"], run_id=f"c{i}")
            task = asyncio.create_task(drain(kernel, run.run_id))
            await asyncio.sleep(i * 0.002)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await drain(kernel, run.run_id)
            head = await store.load(run.run_id)
            if head.pause is not None and head.pause.reason == "uncertain_tool_calls":
                for c in head.pause.metadata["calls"]:
                    assert f"{run.run_id}:{c['id']}" in ledger.started, c
            await kernel.aclose()


class SlowHooks(sk.Hooks):
    async def on_turn_prepared(self, run: sk.Run, request: sk.ModelRequest) -> None:
        await asyncio.sleep(0.1)


async def test_a_drive_waiting_behind_a_step_keeps_the_lease(
    clocked_store: CheckpointStore, clock: ManualClock
) -> None:
    ledger = Ledger()
    store = Renewals(clocked_store, clock)
    owner = sk.Kernel(
        store,
        tools=ledger.tools(hold=True),
        providers={"scripted": ScriptedProvider(SCRIPT)},
        hooks=SlowHooks(),
        lease_ttl=TTL,
    )
    run = await owner.start(model="scripted/x", messages=["pay"])
    await owner.step(run.run_id)
    stepping = asyncio.create_task(owner.step(run.run_id))  # inside the slow hook
    await asyncio.sleep(0.02)
    driving = asyncio.create_task(drain(owner, run.run_id))  # waits for the step
    await stepping
    while not ledger.started:  # noqa: ASYNC110 - waits for the tool to be inside its effect
        await asyncio.sleep(0.005)
    assert run.run_id in owner._tenancy.drivers  # the waiting drive's lease is renewed
    for _ in range(3):  # three times the lease's time to live, renewed on the way
        await store.advance_renewed(TTL * 0.9)
    other = kernel_on(store, ledger, busy_timeout=0.1)
    with pytest.raises(sk.RunBusy):
        await drain(other, run.run_id)
    ledger.gate.set()
    await driving
    assert not ledger.overlaps
    assert (await store.load(run.run_id)).state == "completed"
    await owner.aclose()
    await other.aclose()


EPS = 0.001


async def test_a_lease_expires_exactly_when_the_clock_passes_its_ttl(
    clocked_store: CheckpointStore, clock: ManualClock
) -> None:
    store = clocked_store
    kernel = kernel_on(store, Ledger())
    run = await kernel.start(model="scripted/x", messages=["pay"])
    await kernel.aclose()
    first = await store.acquire(run.run_id, "owner-a", ttl=10.0)
    clock.advance(10.0 - EPS)
    with pytest.raises(sk.RunBusy) as busy:
        await store.acquire(run.run_id, "owner-b", ttl=10.0)
    assert busy.value.owner == "owner-a"
    clock.advance(2 * EPS)  # owner-a never renewed: its lease is over
    second = await store.acquire(run.run_id, "owner-b", ttl=10.0)
    assert int(second.token) > int(first.token)
    with pytest.raises(LeaseLost):
        await store.renew(first, ttl=10.0)
    clock.advance(5.0)
    await store.renew(second, ttl=10.0)  # counts from the renewal, not the acquisition
    clock.advance(10.0 - EPS)
    with pytest.raises(sk.RunBusy):
        await store.acquire(run.run_id, "owner-c", ttl=10.0)
    clock.advance(2 * EPS)
    third = await store.acquire(run.run_id, "owner-c", ttl=10.0)
    await store.release(third)
    await store.release(second)  # moved on: changes nothing
    await store.release(first)


async def test_a_waiting_kernel_takes_over_once_a_dead_owners_lease_expires(
    clocked_store: CheckpointStore, clock: ManualClock
) -> None:
    ledger = Ledger()
    store = clocked_store
    kernel = kernel_on(store, ledger, busy_timeout=30)
    run = await kernel.start(model="scripted/x", messages=["pay"])
    dead = await store.acquire(run.run_id, "dead-owner", ttl=15.0)  # never renewed
    waiting = asyncio.create_task(drain(kernel, run.run_id))
    await asyncio.sleep(0.05)
    clock.advance(15.0 - EPS)
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the lease is still live: the kernel keeps waiting
    clock.advance(2 * EPS)
    await asyncio.wait_for(waiting, timeout=5)
    assert (await store.load(run.run_id)).state == "completed"
    assert len(ledger.started) == 2
    with pytest.raises(LeaseLost):
        await store.renew(dead, ttl=15.0)
    await kernel.aclose()


def test_a_manual_clock_moves_only_forward_and_only_when_told() -> None:
    before = time.time()
    assert before <= ManualClock()() <= time.time()
    clock = ManualClock(100.0)
    assert clock() == clock() == 100.0
    assert clock.advance(2.5) == clock() == 102.5
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument):
            clock.advance(bad)
    assert clock() == 102.5


async def test_a_cancelled_drive_forgets_a_result_that_landed(store_url: str) -> None:
    ledger = Ledger()
    async with opened(store_url) as inner:
        store = SlowAfter(inner, "tool_call_completed")
        kernel = kernel_on(store, ledger, busy_timeout=1.0)
        run = await cancelled_after_landing(kernel, store)
        assert run.run_id not in kernel._tenancy.drivers  # nothing held: the run is let go
        other = kernel_on(inner, ledger, busy_timeout=1.0)
        await drain(other, run.run_id)
        assert (await inner.load(run.run_id)).state == "completed"
        assert len(ledger.started) == 2
        await kernel.aclose()
        await other.aclose()


class FailsTheFirstCompletion(StoreWrapper):
    """The first tool result's commit fails after a while without landing."""

    def __init__(self, inner: CheckpointStore) -> None:
        super().__init__(inner)
        self.entered = asyncio.Event()

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        if not self.entered.is_set() and any(
            e.type == "tool_call_completed" for e in checkpoint.events
        ):
            self.entered.set()
            await asyncio.sleep(0.1)
            raise StoreError("connection reset")
        await self.inner.commit(checkpoint, lease=lease)


async def test_a_command_waits_for_the_drives_commit_in_flight_and_never_cuts_it(
    store_url: str,
) -> None:
    ledger = Ledger()
    async with opened(store_url) as inner:
        store = FailsTheFirstCompletion(inner)
        kernel = kernel_on(store, ledger)
        run = await kernel.start(model="scripted/x", messages=["pay"])
        driving = asyncio.create_task(drain(kernel, run.run_id))
        await store.entered.wait()  # the drive's commit of a result is in flight
        await kernel.update_context(run.run_id, lambda c: {**c, "x": 1})
        await driving  # the drive goes on from the command's commit: no conflict
        final = await inner.load(run.run_id)
        assert final.state == "completed"
        assert final.context == {"x": 1}
        kinds = [e.type for e in await inner.events(run.run_id)]
        assert kinds.count("tool_call_completed") == 2
        assert kinds.count("context_updated") == 1
        assert len(ledger.started) == 2  # each call ran once
        assert ledger.overlaps == []
        await kernel.aclose()


async def test_aclose_during_a_drive_stops_it_without_unfenced_commits(store_url: str) -> None:
    ledger = Ledger()
    async with opened(store_url) as store:
        kernel = kernel_on(store, ledger, hold=True)
        run = await kernel.start(model="scripted/x", messages=["pay"])
        driving = asyncio.create_task(drain(kernel, run.run_id))
        while not ledger.started:  # noqa: ASYNC110 - waits for the tool to be inside its effect
            await asyncio.sleep(0.005)
        revision = (await store.load(run.run_id)).revision
        await kernel.aclose()
        done, _ = await asyncio.wait([driving], timeout=5)
        assert done, "the drive hangs after aclose"
        with contextlib.suppress(sk.ConflictError):
            driving.result()
        assert (await store.load(run.run_id)).revision == revision  # nothing unfenced
        ledger.gate.set()
        other = kernel_on(store, ledger, busy_timeout=1.0)
        await drain(other, run.run_id)
        assert (await store.load(run.run_id)).state in ("completed", "paused")
        await other.aclose()
