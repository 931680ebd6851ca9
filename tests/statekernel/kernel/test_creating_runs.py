"""``start`` and ``fork`` commit through the committer: an ambiguous store failure is
settled from the head, so the run is created exactly once and returned; a typed error
only when it truly did not land."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

import statekernel as sk
from statekernel._records.run import Run
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, StoreWrapper
from statekernel.errors import RunNotFound, StoreError
from statekernel.stores import MemoryStore
from statekernel.testing import ScriptedProvider


class AmbiguousStore(StoreWrapper):
    """Commits of the runs in ``ambiguous`` land, then fail as if the answer were lost
    (once per run); commits of the runs in ``down`` fail without landing. ``blind``:
    loads that fail first (the head cannot be read at once)."""

    def __init__(
        self,
        inner: CheckpointStore,
        *,
        ambiguous: Iterable[str] = (),
        down: Iterable[str] = (),
        blind: int = 0,
    ) -> None:
        super().__init__(inner)
        self.ambiguous = set(ambiguous)
        self.down = set(down)
        self.blind = blind
        self.writes: list[str] = []

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        run_id = checkpoint.run.run_id
        if run_id in self.down:
            raise StoreError("the store is down")
        await self.inner.commit(checkpoint, lease=lease)
        self.writes.append(run_id)
        if run_id in self.ambiguous:
            self.ambiguous.discard(run_id)
            raise StoreError("the connection dropped before the answer")

    async def load(self, run_id: str, *, revision: int | None = None) -> Run:
        if self.blind:
            self.blind -= 1
            raise StoreError("cannot read now")
        return await self.inner.load(run_id, revision=revision)


def _kernel(store: CheckpointStore) -> sk.Kernel:
    return sk.Kernel(store, providers={"scripted": ScriptedProvider(["hi"])})


@pytest.fixture
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The committer's pauses between attempts take no time."""

    async def no_wait(seconds: float) -> None:
        return None

    monkeypatch.setattr("statekernel._kernel.commit.asyncio.sleep", no_wait)


@pytest.mark.parametrize("blind", [0, 1])
async def test_start_after_an_ambiguous_failure_returns_the_run_created_once(
    blind: int, no_pauses: None
) -> None:
    """``blind=1``: the head cannot be read after the failure; the next attempt finds the
    run there, and it is this very one."""
    inner = MemoryStore()
    store = AmbiguousStore(inner, ambiguous={"r"})
    async with _kernel(store) as kernel:
        store.blind = blind
        run = await kernel.start(model="scripted/m", messages=["hello"], run_id="r")
        assert await inner.load("r") == run
        assert run.revision == 0
        assert store.writes == ["r"]  # written once
        page = await inner.list_runs()
        assert [s.run_id for s in page.runs] == ["r"]


async def test_fork_after_an_ambiguous_failure_returns_the_fork_created_once() -> None:
    inner = MemoryStore()
    store = AmbiguousStore(inner)
    async with _kernel(store) as kernel:
        await kernel.start(model="scripted/m", messages=["hello"], run_id="r")
        store.ambiguous.add("f")
        fork = await kernel.fork("r", new_run_id="f")
        assert await inner.load("f") == fork
        assert [e.type for e in await inner.events("f")] == ["run_forked"]
        assert store.writes == ["r", "f"]


async def test_start_and_fork_that_never_land_raise_a_store_error(no_pauses: None) -> None:
    inner = MemoryStore()
    store = AmbiguousStore(inner, down={"r", "f"})
    async with _kernel(store) as kernel:
        with pytest.raises(StoreError):
            await kernel.start(model="scripted/m", messages=["hello"], run_id="r")
        with pytest.raises(RunNotFound):
            await inner.load("r")
        await kernel.start(model="scripted/m", messages=["hello"], run_id="s")
        with pytest.raises(StoreError):
            await kernel.fork("s", new_run_id="f")
        with pytest.raises(RunNotFound):
            await inner.load("f")
