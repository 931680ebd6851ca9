"""Stores that find runs by the start of their id (``FindsRunIds``: memory, SQLite,
PostgreSQL): one query finds a run's child runs, whose ids start with the parent's."""

from __future__ import annotations

from pathlib import Path

import pytest

import statekernel as sk
from statekernel._kernel.delegate import child_run_id, child_runs
from statekernel._storage.protocol import FindsRunIds
from statekernel.stores import Checkpoint, open_store
from statekernel.testing import ScriptedProvider
from statekernel.testing._store_cases import sample_run


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/runs.db"


async def test_run_ids_are_the_runs_starting_with_a_prefix(url: str) -> None:
    store = open_store(url)
    try:
        assert isinstance(store, FindsRunIds)
        for run_id in ("p", "p.c2", "p.c1", "p.c1.g", "pa", "q.p", "o"):
            await store.commit(Checkpoint.between(None, sample_run(run_id)))
        assert await store.run_ids("p.", limit=10) == ["p.c1", "p.c1.g", "p.c2"]
        assert await store.run_ids("p", limit=10) == ["p", "p.c1", "p.c1.g", "p.c2", "pa"]
        assert await store.run_ids("p", limit=2) == ["p", "p.c1"]
        assert await store.run_ids("z", limit=10) == []
        assert await store.run_ids("p.c1", limit=0) == []
    finally:
        await store.aclose()


async def test_child_runs_are_found_among_runs_named_alike(url: str) -> None:
    """A parent's child runs are found through the ids; runs whose ids merely start the
    same (another parent, a grandchild) are not taken for its children."""
    model = ScriptedProvider(["done"], repeat_last=True)
    async with sk.Kernel(url, providers={"s": model}) as kernel:
        parent = await kernel.start(model="s/m", messages=["go"], run_id="p")
        await kernel.start(model="s/m", messages=["go"], run_id="pa")  # not a child
        run = await kernel.get(parent.run_id)
        assert await child_runs(kernel.store, run) == []
        child = child_run_id("p", "c1")
        await kernel.start(
            model="s/m", messages=["go"], run_id=child, parent_run_id="p", parent_call_id="c1"
        )
        # the parent's transcript names no call c1: no child is claimed without its call
        assert await child_runs(kernel.store, run) == []
