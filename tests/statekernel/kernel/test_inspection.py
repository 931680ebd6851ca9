"""What the command line and a web view read of a run, through the public API: the run
tree, the run's own lifecycle diagram, its listing line and its plain data."""

from __future__ import annotations

import json

import pytest

import statekernel as sk
from statekernel.errors import InvalidArgument
from statekernel.stores import MemoryStore, RunSummary
from statekernel.testing import call, fuzz_agent


async def _delegating_run(kernel: sk.Kernel) -> sk.Run:
    run = await kernel.start(model="scripted/fuzz", messages=["go"], run_id="parent")
    async for _ in kernel.run(run.run_id):
        pass
    return await kernel.get(run.run_id)


async def test_tree_and_diagram_of_a_run_that_delegated() -> None:
    make = fuzz_agent([[call("helper", {"task": "first"})], "done"])
    async with sk.Kernel(MemoryStore(), **make()) as kernel:
        run = await _delegating_run(kernel)
        assert run.state == "completed"
        tree = await kernel.tree(run.run_id)
        assert [(depth, r.run_id) for depth, r in tree] == [
            (0, "parent"),
            (1, sk.child_run_id("parent", run.turns[0].completed[0].id)),
        ]
        assert tree[1][1].parent_run_id == "parent"
        mermaid = (await kernel.diagram(run.run_id, format="mmd")).decode()
        dot = (await kernel.diagram(run.run_id, format="dot")).decode()
        assert "run parent: completed at revision" in mermaid
        assert "dispatching_tools" in dot
        assert "completed" in dot
        with pytest.raises(InvalidArgument, match="format must be one of"):
            await kernel.diagram(run.run_id, format="png")


async def test_a_listing_line_and_plain_data_of_a_run() -> None:
    make = fuzz_agent(["hello"])
    async with sk.Kernel(MemoryStore(), **make()) as kernel:
        run = await kernel.start(model="scripted/fuzz", messages=["go"])
        async for _ in kernel.run(run.run_id):
            pass
        run = await kernel.get(run.run_id)
        listed = (await kernel.store.list_runs()).runs[0]
    assert RunSummary.of(run) == listed
    plain = sk.to_plain(run)
    assert plain["state"] == "completed"
    assert plain["pause"] is None  # a field at its default is there too
    assert plain["failure"] is None
    assert json.loads(json.dumps(plain)) == plain
    assert sk.to_plain([listed])[0]["run_id"] == run.run_id
