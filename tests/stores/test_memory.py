"""Memory store: stores of one ``memory://NAME`` share data while one of them is alive."""

from __future__ import annotations

import gc

import pytest

from statekernel.errors import RunNotFound
from statekernel.stores import Checkpoint, open_store
from statekernel.stores.memory import _store as _memory
from statekernel.testing._store_cases import sample_run


async def test_stores_of_one_name_share_runs_while_one_is_alive() -> None:
    first = open_store("memory://shared-test")
    await first.commit(Checkpoint.between(None, sample_run("r")))
    second = open_store("memory://shared-test")
    assert (await second.load("r")).run_id == "r"
    await first.aclose()
    del first
    gc.collect()
    third = open_store("memory://shared-test")
    assert (await third.load("r")).run_id == "r"  # second still holds the data
    del second, third
    gc.collect()
    assert "shared-test" not in _memory._named
    with pytest.raises(RunNotFound):
        await open_store("memory://shared-test").load("r")


async def test_the_registry_of_names_empties_once_the_stores_are_gone() -> None:
    gc.collect()
    before = len(_memory._named)
    for i in range(1000):
        store = open_store(f"memory://many-{i}")
        await store.commit(Checkpoint.between(None, sample_run("r")))
        await store.aclose()
    del store
    gc.collect()
    assert len(_memory._named) == before
