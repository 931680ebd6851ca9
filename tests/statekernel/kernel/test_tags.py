"""Tags on runs: given at the start, changed with compare-and-set, checked at the door."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import ConflictError, InvalidArgument, InvalidTag, RunNotFound
from statekernel.testing import ScriptedProvider

from ..conftest import MakeKernel, drain, start


async def test_tags_given_at_the_start_are_kept_and_listed(make_kernel: MakeKernel) -> None:
    kernel, store, _ = make_kernel(["done"])
    run = await start(kernel, tags={"team": "search", "env": "prod"})
    other = await start(kernel, tags={"team": "ads"})
    assert run.tags == {"team": "search", "env": "prod"}
    await drain(kernel, run.run_id)
    assert (await kernel.get(run.run_id)).tags == {"team": "search", "env": "prod"}
    page = await store.list_runs(tags={"team": "search"})
    assert [s.run_id for s in page.runs] == [run.run_id]
    assert page.runs[0].tags == {"team": "search", "env": "prod"}
    assert [s.run_id for s in (await store.list_runs(tags={"team": "ads"})).runs] == [other.run_id]


async def test_start_and_run_and_fork_carry_tags(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel(["one"])
    events = [
        e
        async for e in kernel.start_and_run(
            model="scripted/test", messages=["hi"], tags={"batch": "7"}
        )
    ]
    run_id = events[0].run_id
    assert (await kernel.get(run_id)).tags == {"batch": "7"}
    forked = await kernel.fork(run_id)
    assert forked.tags == {"batch": "7"}


async def test_update_tags_sets_and_removes_with_an_event(make_kernel: MakeKernel) -> None:
    kernel, store, _ = make_kernel(["x"])
    run = await start(kernel, tags={"a": "1", "b": "2"})
    updated = await kernel.update_tags(run.run_id, {"c": "3", "a": "9"}, ["b"])
    assert updated.tags == {"a": "9", "c": "3"}
    assert (updated.revision, updated.state) == (1, "init")
    events = await kernel.events(run.run_id)
    assert [(e.type, e.data) for e in events] == [
        ("tags_updated", {"set": {"c": "3", "a": "9"}, "removed": ["b"]})
    ]
    assert [s.run_id for s in (await store.list_runs(tags={"a": "9"})).runs] == [run.run_id]
    assert (await store.list_runs(tags={"b": "2"})).runs == ()
    same = await kernel.update_tags(run.run_id, {"a": "9"}, ["nothing"])
    assert same.revision == 1, "a change that changes nothing commits nothing"


async def test_update_tags_with_a_stale_revision_is_a_conflict(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel(["x"])
    run = await start(kernel)
    await kernel.update_tags(run.run_id, {"k": "1"}, expected_revision=0)
    with pytest.raises(ConflictError) as caught:
        await kernel.update_tags(run.run_id, {"k": "2"}, expected_revision=0)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    assert (await kernel.get(run.run_id)).tags == {"k": "1"}


async def test_concurrent_updates_from_two_kernels(tmp_path: Path) -> None:
    """Two processes' kernels on one store: of two updates at the same expected revision
    exactly one lands; updates without one both land, each on the other's tags."""
    url = f"sqlite:///{tmp_path}/runs.db"
    providers: Any = {"scripted": ScriptedProvider([])}
    async with (
        sk.Kernel(url, providers=providers) as one,
        sk.Kernel(url, providers=providers) as two,
    ):
        run = await one.start(model="scripted/test")
        outcomes = await asyncio.gather(
            one.update_tags(run.run_id, {"owner": "one"}, expected_revision=0),
            two.update_tags(run.run_id, {"owner": "two"}, expected_revision=0),
            return_exceptions=True,
        )
        landed = [o for o in outcomes if isinstance(o, sk.Run)]
        refused = [o for o in outcomes if isinstance(o, ConflictError)]
        assert (len(landed), len(refused)) == (1, 1), outcomes
        assert (await one.get(run.run_id)).tags == landed[0].tags
        await asyncio.gather(
            one.update_tags(run.run_id, {"x": "1"}), two.update_tags(run.run_id, {"y": "2"})
        )
        final = await two.get(run.run_id)
        assert final.revision == 3
        assert {"x": "1", "y": "2"}.items() <= final.tags.items()


@pytest.mark.parametrize(
    ("tags", "key"),
    [
        ({"bad key": "v"}, "bad key"),
        ({"": "v"}, ""),
        ({"k" * 65: "v"}, "k" * 65),
        ({"k": 1}, "k"),
        ({"k": "v" * 257}, "k"),
        ({"k": "nul\x00"}, "k"),
        ({f"k{i}": "v" for i in range(33)}, None),
        ("team=a", None),
    ],
)
async def test_bad_tags_are_refused_naming_the_key(
    make_kernel: MakeKernel, tags: Any, key: str | None
) -> None:
    kernel, store, _ = make_kernel(["x"])
    with pytest.raises(InvalidTag) as caught:
        await start(kernel, tags=tags)
    assert caught.value.key == key
    assert isinstance(caught.value, InvalidArgument)
    if key:
        assert repr(key)[:40] in str(caught.value)
    assert (await store.list_runs()).runs == (), "nothing was created"


async def test_bad_updates_are_refused_and_commit_nothing(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel(["x"])
    run = await start(kernel, tags={f"k{i}": "v" for i in range(32)})
    with pytest.raises(InvalidTag, match="at most 32"):
        await kernel.update_tags(run.run_id, {"one": "more"})
    with pytest.raises(InvalidTag) as caught:
        await kernel.update_tags(run.run_id, {"k1": "x"}, ["k1"])
    assert caught.value.key == "k1"
    with pytest.raises(InvalidTag):
        await kernel.update_tags(run.run_id, remove="k1")
    with pytest.raises(InvalidArgument, match="expected_revision"):
        await kernel.update_tags(run.run_id, {"k1": "x"}, expected_revision=-1)
    with pytest.raises(RunNotFound):
        await kernel.update_tags("nobody", {"k1": "x"})
    assert (await kernel.get(run.run_id)).revision == 0
