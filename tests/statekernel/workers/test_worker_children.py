"""Child runs of runs that workers drive: each child takes its own lease, in the worker
that drives its parent or in the workers of another queue."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

import statekernel as sk
from statekernel.testing import ScriptedProvider, call

from .test_worker import FAST, all_in, kernel, serve, until

__all__ = ["kernel"]  # the fixture, shared with test_worker

pytestmark = pytest.mark.redis

PARENT = [call("helper", {"task": "find the total"}), "the helper says 42"]


def parent_agent(queue: str | None) -> Mapping[str, Any]:
    helper = sk.delegate("helper", "Ask the helper.", model="helper/small", queue=queue, poll=0.05)
    return {
        "tools": [helper],
        "providers": {
            "scripted": ScriptedProvider(PARENT),
            "helper": ScriptedProvider(["42"]),
        },
    }


async def the_child(kernel: sk.Kernel, parent_id: str) -> sk.Run:
    parent = await kernel.get(parent_id)
    record = parent.turns[0].completed[0]
    assert record.error is None, f"the delegate call failed: {record.error}"
    assert record.output == "42"
    (child,) = [r for r in await _runs(kernel) if r.parent_run_id == parent_id]
    assert child.parent_call_id == record.id
    return child


async def _runs(kernel: sk.Kernel) -> list[sk.Run]:
    page = await kernel.store.list_runs(limit=100)
    return [await kernel.get(s.run_id) for s in page.runs]


async def test_a_worker_drives_the_child_of_a_run_it_drives(kernel: sk.Kernel) -> None:
    run = await kernel.start(model="scripted/x", messages=["go"])
    await kernel.submit(run.run_id)
    worker = sk.Worker(kernel.store, agent=parent_agent(None), **FAST)
    task = await serve(worker)
    await until(lambda: all_in(kernel, [run.run_id], "completed"))
    worker.stop()
    stats = await task
    assert (stats.completed, stats.lost, stats.errors) == (1, 0, 0)
    child = await the_child(kernel, run.run_id)
    assert child.state == "completed"


async def test_a_child_handed_to_another_queue_runs_on_its_workers(kernel: sk.Kernel) -> None:
    run = await kernel.start(model="scripted/x", messages=["go"])
    await kernel.submit(run.run_id)
    parents = sk.Worker(kernel.store, agent=parent_agent("kids"), **FAST)
    kids = sk.Worker(
        kernel.store,
        queue="kids",
        agent={"providers": {"helper": ScriptedProvider(["42"])}},
        **FAST,
    )
    tasks = [await serve(parents), await serve(kids)]
    await until(lambda: all_in(kernel, [run.run_id], "completed"))
    parents.stop()
    kids.stop()
    first, second = await asyncio.gather(*tasks)
    assert (first.completed, first.lost, first.errors) == (1, 0, 0)
    assert (second.completed, second.lost, second.errors) == (1, 0, 0)
    child = await the_child(kernel, run.run_id)
    assert child.state == "completed"
