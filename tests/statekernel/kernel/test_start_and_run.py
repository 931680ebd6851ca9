"""``Kernel.start_and_run``: a run created and driven in one call, on every store, with
the events of ``start`` then ``run``, one read of the head less, and no lease taken
apart from the creation (``CreatesLeased``); on a store that cannot (a wrapper that
does not declare it), a commit another kernel slips in before the lease is taken is not
lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

import pytest

import statekernel as sk
from statekernel._records.run import Run
from statekernel._storage.protocol import CheckpointStore, CreatesLeased, Lease, StoreWrapper
from statekernel.errors import (
    ConfigError,
    ConflictError,
    InvalidArgument,
    RunBusy,
    RunNotFound,
    StoreError,
)
from statekernel.stores import Checkpoint, MemoryStore, SQLiteStore, open_store
from statekernel.testing import ScriptedProvider, call


@sk.tool(idempotent=True)
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def _script() -> list[object]:
    return [call("add", {"a": 2, "b": 3}, id="c1"), "five"]


class CountingStore(StoreWrapper):
    """Counts the loads of a real store; ``before_acquire`` runs once, before the first
    lease is taken."""

    def __init__(self, inner: CheckpointStore) -> None:
        super().__init__(inner)
        self.loads = 0
        self.before_acquire: object = None

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        self.loads += 1
        return await self.inner.load(run_id, revision=revision)

    async def acquire(self, run_id: str, owner: str, *, ttl: float) -> Lease:
        hook, self.before_acquire = self.before_acquire, None
        if callable(hook):
            await hook(run_id)
        return await self.inner.acquire(run_id, owner, ttl=ttl)


def _shape(events: list[sk.Event]) -> list[tuple[str, int]]:
    return [(e.type, e.revision) for e in events]


async def test_it_drives_a_new_run_as_start_then_run_do_with_one_load_less(
    every_store_url: str,
) -> None:
    store = open_store(every_store_url)
    loads: list[str] = []
    load = store.load

    async def counted(run_id: str, *, revision: int | None = None) -> Run:
        loads.append(run_id)
        return await load(run_id, revision=revision)

    store.load = counted  # type: ignore[method-assign]
    async with contextlib.aclosing(store):
        two = sk.Kernel(store, tools=[add], providers={"scripted": ScriptedProvider(_script())})
        async with two:
            await two.start(model="scripted/m", messages=["2+3?"], run_id="two")
            apart = [e async for e in two.run("two")]
        one = sk.Kernel(store, tools=[add], providers={"scripted": ScriptedProvider(_script())})
        async with one:
            events = [
                e
                async for e in one.start_and_run(
                    model="scripted/m", messages=["2+3?"], run_id="one"
                )
            ]
            run = await one.get("one")
    assert run.state == "completed"
    assert run.messages[-1].text == "five"
    assert run.turns[0].completed[0].output == 5
    assert _shape(events) == _shape(apart)
    assert [e.run_id for e in events] == ["one"] * len(events)
    assert loads == ["two", "one"]  # run's of "two", get's of "one": start_and_run read none


class FailingCreation(SQLiteStore):
    """A real SQLite store whose ``create_leased`` fails in the store: before anything
    lands (``landed=False``), or after the run and its lease landed."""

    def __init__(self, url: str, *, landed: bool) -> None:
        super().__init__(url)
        self.landed = landed

    async def create_leased(
        self, checkpoint: Checkpoint, owner: str, *, ttl: float
    ) -> Lease | None:
        if self.landed:
            await super().create_leased(checkpoint, owner, ttl=ttl)
        raise StoreError("the connection dropped before the answer")


@pytest.mark.parametrize("landed", [False, True])
async def test_a_creation_that_failed_in_the_store_is_settled_and_the_run_driven_once(
    landed: bool, tmp_path: Path
) -> None:
    """Not landed: the run is created the usual way. Landed with its lease: the head says
    it is this run, and its lease is taken as a drive takes it (here once the lost one
    expired: ``lease_ttl``). Either way the run completes and its tool ran once."""
    store = FailingCreation(f"sqlite:///{tmp_path}/runs.db", landed=landed)
    ran: list[int] = []

    @sk.tool
    def count(n: int) -> int:
        """Count.

        Args:
            n: A number.
        """
        ran.append(n)
        return n

    provider = ScriptedProvider([call("count", {"n": 1}, id="c1"), "done"])
    kernel = sk.Kernel(store, tools=[count], providers={"scripted": provider}, lease_ttl=1.0)
    async with contextlib.aclosing(store), kernel:
        events = [e.type async for e in kernel.start_and_run(model="scripted/m", run_id="r")]
        assert (await kernel.get("r")).state == "completed"
    assert events[0] == "run_started"
    assert events[-1] == "run_completed"
    assert ran == [1]


async def test_nothing_is_created_until_it_is_iterated_and_bad_arguments_create_nothing() -> None:
    store = MemoryStore()
    async with sk.Kernel(store, providers={"scripted": ScriptedProvider(["hi"])}) as kernel:
        drive = cast(
            AsyncGenerator[sk.Event, None],
            kernel.start_and_run(model="scripted/m", messages=["hi"], run_id="r"),
        )
        with pytest.raises(RunNotFound):
            await store.load("r")
        first = await drive.__anext__()
        assert (first.type, first.run_id) == ("run_started", "r")
        await drive.aclose()
        with pytest.raises(ConfigError, match="nowhere"):
            await anext(kernel.start_and_run(model="nowhere/m", run_id="x"))
        with pytest.raises(InvalidArgument, match="raise_on_failure"):
            await anext(kernel.start_and_run(model="scripted/m", raise_on_failure="yes"))  # type: ignore[arg-type]
        with pytest.raises(ConflictError):
            await anext(kernel.start_and_run(model="scripted/m", run_id="r"))
        assert {r.run_id for r in (await store.list_runs()).runs} == {"r"}


async def test_a_commit_slipped_in_before_the_lease_is_kept_and_the_drive_goes_on(
    every_store_url: str,
) -> None:
    """Another kernel updates the run's context between its creation and the drive's
    lease: the drive's first commit (made on revision 0) is refused, the drive reads the
    head and goes on from it, and the update stays."""
    store = CountingStore(open_store(every_store_url))
    async with store:
        other = sk.Kernel(store, providers={"scripted": ScriptedProvider(["-"])})

        async def update(run_id: str) -> None:
            await other.update_context(run_id, lambda ctx: {**ctx, "tenant": "t1"})

        store.before_acquire = update
        kernel = sk.Kernel(store, tools=[add], providers={"scripted": ScriptedProvider(_script())})
        async with other, kernel:
            events = [
                e
                async for e in kernel.start_and_run(
                    model="scripted/m", messages=["2+3?"], context={"k": 1}, run_id="r"
                )
            ]
            run = await kernel.get("r")
    assert run.state == "completed"
    assert run.context == {"k": 1, "tenant": "t1"}
    revisions = [e.revision for e in events]
    assert revisions == sorted(revisions)
    assert revisions[0] == 2  # after the update's commit
    assert run.turns[0].completed[0].output == 5


async def test_the_lease_is_taken_with_the_creation_where_the_store_can(
    every_store_url: str,
) -> None:
    """From its first event the drive holds the run (another owner is refused), every
    built-in store declares ``CreatesLeased`` and no lease was taken apart from the
    creation; the last commit gives it back."""
    store = open_store(every_store_url)
    acquired: list[str] = []
    acquire = store.acquire

    async def counted(run_id: str, owner: str, *, ttl: float) -> Lease:
        acquired.append(owner)
        return await acquire(run_id, owner, ttl=ttl)

    store.acquire = counted  # type: ignore[method-assign]
    busy: list[str] = []
    async with contextlib.aclosing(store):
        kernel = sk.Kernel(store, tools=[add], providers={"scripted": ScriptedProvider(_script())})
        async with kernel:
            async for event in kernel.start_and_run(model="scripted/m", run_id="r"):
                if event.type == "run_started":
                    with pytest.raises(RunBusy) as held:
                        await store.acquire("r", "someone-else", ttl=30)
                    busy.append(held.value.owner)
            assert (await kernel.get("r")).state == "completed"
            await store.release(await store.acquire("r", "after", ttl=30))  # given back
    assert busy == [kernel.owner]
    assert isinstance(store, CreatesLeased)
    assert acquired == ["someone-else", "after"]  # none taken apart from the creation


STARTED: list[str] = []
ENDED: list[str] = []


@sk.tool
async def upload(name: str) -> str:
    """Upload a file; on cancellation it takes a few loop turns to clean up.

    Args:
        name: The file's name.
    """
    STARTED.append(name)
    try:
        await asyncio.Event().wait()
    finally:
        for _ in range(3):
            await asyncio.sleep(0)
        ENDED.append(name)
    return "uploaded"


async def test_closing_it_awaits_the_drive_and_its_tool_tasks() -> None:
    """Closing the generator ends the drive inside it at once (its tool tasks stopped and
    awaited), as closing ``run``'s does."""
    STARTED.clear()
    ENDED.clear()
    store = MemoryStore()
    provider = ScriptedProvider([call("upload", {"name": "a"}), "ok"])
    async with sk.Kernel(store, tools=[upload], providers={"scripted": provider}) as kernel:
        drive = cast(
            AsyncGenerator[sk.Event, None],
            kernel.start_and_run(model="scripted/m", messages=["go"], run_id="r"),
        )
        async for event in drive:
            if event.type == "tool_call_started":
                break
        while not STARTED:  # noqa: ASYNC110 - lets the tool task start
            await asyncio.sleep(0)
        await drive.aclose()
        assert ENDED == ["a"]
        assert not kernel.holds("r")
