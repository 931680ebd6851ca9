"""``Kernel.prune``: old runs go with all their parts and child runs, in batches, never
a run someone holds; on every store."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import statekernel as sk
from statekernel._records.run import utcnow
from statekernel.errors import InvalidArgument, RunNotFound
from statekernel.testing import ScriptedProvider, call


def _kernel(url: str, parent: list[object], child: list[object]) -> sk.Kernel:
    providers = {
        "scripted": ScriptedProvider(parent),
        "helper": ScriptedProvider(child),
        "plain": ScriptedProvider(["an answer"]),
    }
    researcher = sk.delegate("researcher", "Find a fact.", model="helper/small")
    return sk.Kernel(url, tools=[researcher], providers=providers)


async def _done(kernel: sk.Kernel, run_id: str) -> None:
    """A completed run: with a child run (``run_id.d1``) if its id says "tree"."""
    model = "scripted/lead" if "tree" in run_id else "plain/x"
    await kernel.start(model=model, messages=["ask"], run_id=run_id)
    async for _ in kernel.run(run_id):
        pass


async def _tick(after: datetime) -> datetime:
    """The first time of the wall clock later than ``after``."""
    while (now := utcnow()) <= after:  # noqa: ASYNC110 - waits for the clock to move on
        await asyncio.sleep(0.001)
    return now


async def _exists(kernel: sk.Kernel, run_id: str) -> bool:
    try:
        await kernel.get(run_id)
    except RunNotFound:
        return False
    return True


async def test_old_runs_go_with_their_children_and_the_rest_stays(every_store_url: str) -> None:
    script: list[object] = [call("researcher", {"task": "why?"}, id="d1"), "42"]
    kernel = _kernel(every_store_url, script, ["found"])
    try:
        await _done(kernel, "old-tree")
        await _done(kernel, "old-plain")
        waiting = await kernel.start(model="scripted/lead", messages=["x"], run_id="old-init")
        cut = await _tick(waiting.updated_at)
        await _tick(cut)
        await _done(kernel, "new")
        everything = {"old-tree", "old-tree.d1", "old-plain", "old-init", "new"}
        assert all([await _exists(kernel, r) for r in everything])

        dry = await kernel.prune(older_than=cut, dry_run=True)
        assert dry.dry_run
        assert set(dry.deleted) == {"old-tree", "old-tree.d1", "old-plain"}
        assert dry.deleted.index("old-tree.d1") < dry.deleted.index("old-tree")
        assert all([await _exists(kernel, r) for r in everything])

        pruned = await kernel.prune(older_than=cut, batch=1)
        assert set(pruned.deleted) == {"old-tree", "old-tree.d1", "old-plain"}
        assert pruned.held == ()
        assert pruned.cutoff == cut
        left = {r for r in everything if await _exists(kernel, r)}
        assert left == {"old-init", "new"}  # init is not a state pruned by default

        again = await kernel.prune(older_than=timedelta(0), states=["init"])
        assert again.deleted == ("old-init",)
        assert await _exists(kernel, "new")
        assert (await kernel.prune(older_than=timedelta(days=30))).deleted == ()
    finally:
        await kernel.aclose()


async def test_a_run_someone_holds_is_skipped_not_waited_for(every_store_url: str) -> None:
    script: list[object] = [call("researcher", {"task": "why?"}, id="d1"), "42"]
    kernel = _kernel(every_store_url, script, ["found"])
    kernel.busy_timeout = 3600.0  # prune must not wait for it
    try:
        await _done(kernel, "tree")
        await _done(kernel, "plain")
        held = await kernel.store.acquire("plain", "someone-else", ttl=3600)
        held_child = await kernel.store.acquire("tree.d1", "someone-else", ttl=3600)
        result = await kernel.prune(older_than=timedelta(0))
        assert result.deleted == ()
        assert set(result.held) == {"plain", "tree"}
        for run_id in ("tree", "tree.d1", "plain"):
            assert await _exists(kernel, run_id)
        await kernel.store.release(held)
        await kernel.store.release(held_child)
        result = await kernel.prune(older_than=timedelta(0))
        assert set(result.deleted) == {"tree", "tree.d1", "plain"}
        assert result.held == ()
    finally:
        await kernel.aclose()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"older_than": 30}, "older_than must be a timedelta or a datetime"),
        ({"older_than": timedelta(-1)}, "must not be negative"),
        ({"older_than": datetime(2026, 1, 1)}, "aware datetime"),
        ({"older_than": timedelta(0), "states": ["finished"]}, "unknown state 'finished'"),
        ({"older_than": timedelta(0), "states": "completed"}, "a list of state ids"),
        ({"older_than": timedelta(0), "states": []}, "at least one state"),
        ({"older_than": timedelta(0), "batch": 0}, "batch"),
        ({"older_than": timedelta(0), "dry_run": "yes"}, "dry_run"),
    ],
)
async def test_bad_options_are_refused(options: dict[str, Any], problem: str) -> None:
    async with sk.Kernel("memory://") as kernel:
        with pytest.raises(InvalidArgument, match=problem):
            await kernel.prune(**options)


async def test_an_aware_datetime_is_a_cutoff() -> None:
    async with sk.Kernel("memory://") as kernel:
        result = await kernel.prune(older_than=datetime(2000, 1, 1, tzinfo=UTC))
        assert result.cutoff == datetime(2000, 1, 1, tzinfo=UTC)
        assert result.deleted == ()
