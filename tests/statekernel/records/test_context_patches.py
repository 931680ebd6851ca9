"""A tool's result can carry a change to the run's context (``ToolReturn``): committed
with the result, applied in call order when the turn's calls have completed, seen by
the hooks after, kept by every store, and applied once across a crash."""

from __future__ import annotations

import asyncio

import pytest

import statekernel as sk
from statekernel._records.run import Run
from statekernel.stores import MemoryStore, open_store
from statekernel.testing import Crash, CrashAt, FaultPlan, FaultyStore, ScriptedProvider, call


@sk.tool
def remember(key: str, value: str) -> sk.ToolReturn:
    """Remember ``value`` under ``key`` (and forget the draft)."""
    return sk.ToolReturn(f"remembered {key}", context={key: value, "draft": None})


@sk.tool
async def choose(value: str, delay: float) -> sk.ToolReturn:
    """Set the choice to ``value`` after ``delay`` seconds."""
    await asyncio.sleep(delay)
    return sk.ToolReturn("ok", context={"choice": value, "seen": {value: True}})


@sk.tool(idempotent=True)  # a tool that is not pauses instead (test_unstorable_results)
def broken() -> sk.ToolReturn:
    """Return a patch that is not an object."""
    return sk.ToolReturn("ok", context=["not", "an", "object"])


class Seen(sk.Hooks):
    """Records the context each turn was prepared with."""

    def __init__(self) -> None:
        self.contexts: list[object] = []

    def on_turn_prepared(self, run: Run, request: sk.ModelRequest) -> None:
        self.contexts.append(run.context)


async def _drive(kernel: sk.Kernel, context: dict[str, object]) -> Run:
    run = await kernel.start(model="scripted/x", messages=["go"], context=context)
    async for _ in kernel.run(run.run_id):
        pass
    return await kernel.get(run.run_id)


async def test_a_patch_lands_with_its_result_and_the_next_turn_sees_it(
    every_store_url: str,
) -> None:
    seen = Seen()
    script = [call("remember", {"key": "city", "value": "Paris"}), "done"]
    provider = ScriptedProvider(script)
    kernel = sk.Kernel(
        every_store_url, tools=[remember], providers={"scripted": provider}, hooks=seen
    )
    final = await _drive(kernel, {"draft": "x", "keep": 1})
    assert final.state == "completed"
    assert final.context == {"keep": 1, "city": "Paris"}
    assert seen.contexts == [{"draft": "x", "keep": 1}, {"keep": 1, "city": "Paris"}]
    record = final.turns[0].completed[0]
    assert record.output == "remembered city"
    assert record.context_patch == {"city": "Paris", "draft": None}
    events = await kernel.events(final.run_id)
    done = next(e for e in events if e.type == "tool_call_completed")
    assert done.data["context"] == ["city", "draft"]
    closed = next(e for e in events if e.type == "tools_completed")
    assert closed.data["context_patched_by"] == [record.id]
    await kernel.aclose()
    if every_store_url != "memory://":
        store = open_store(every_store_url)
        loaded = await store.load(final.run_id)
        await store.aclose()
        assert loaded == final
        assert loaded.turns[0].completed[0].context_patch == {"city": "Paris", "draft": None}


async def test_parallel_patches_apply_in_call_order_not_finishing_order() -> None:
    slow_first = [
        call("choose", {"value": "first", "delay": 0.05}),
        call("choose", {"value": "second", "delay": 0.0}),
    ]
    provider = ScriptedProvider([slow_first, "done"])
    kernel = sk.Kernel("memory://", tools=[choose], providers={"scripted": provider})
    final = await _drive(kernel, {})
    finished = [r.id for r in sorted(final.turns[0].completed, key=lambda r: r.finished_at)]  # type: ignore[arg-type, return-value]
    assert finished == ["call_0_1", "call_0_0"], "the second call finished first"
    assert final.context == {"choice": "second", "seen": {"first": True, "second": True}}
    await kernel.aclose()


async def test_a_patch_that_is_not_an_object_is_an_error_result() -> None:
    provider = ScriptedProvider([call("broken", {}), "done"])
    kernel = sk.Kernel("memory://", tools=[broken], providers={"scripted": provider})
    final = await _drive(kernel, {"keep": 1})
    record = final.turns[0].completed[0]
    assert record.output is None
    assert record.error == "broken returned a context patch that is not a JSON object"
    assert record.context_patch is None
    assert final.context == {"keep": 1}
    await kernel.aclose()


class Observing(sk.Hooks):
    """Defining ``on_tool_call_completed`` makes each result its own commit."""

    def on_tool_call_completed(self, run: Run, call: sk.ToolCallRecord) -> None:
        return None


async def test_a_crash_after_the_result_commit_applies_the_patch_once() -> None:
    inner = MemoryStore()
    plan = FaultPlan([CrashAt("after_commit", 4)])  # the commit of the result, alone
    script = [call("remember", {"key": "city", "value": "Rome"}), "done"]

    def kernel_over(store: object) -> sk.Kernel:
        provider = ScriptedProvider(script)
        tools = [remember]
        return sk.Kernel(store, tools=tools, hooks=Observing(), providers={"scripted": provider})  # type: ignore[arg-type]

    crashing = kernel_over(FaultyStore(inner, plan))
    run = await crashing.start(model="scripted/x", messages=["go"], context={"draft": 1})
    with pytest.raises(Crash):
        async for _ in crashing.run(run.run_id):
            pass
    stored = await inner.load(run.run_id)
    assert stored.current_turn is not None
    assert stored.current_turn.completed[0].context_patch == {"city": "Rome", "draft": None}
    assert stored.context == {"draft": 1}, "applied only when the turn's calls completed"

    resumed = kernel_over(inner)
    async for _ in resumed.run(run.run_id):
        pass
    final = await resumed.get(run.run_id)
    assert final.state == "completed"
    assert final.context == {"city": "Rome"}
    closes = [e for e in await inner.events(run.run_id) if e.type == "tools_completed"]
    assert [e.data.get("context_patched_by") for e in closes] == [["call_0_0"]]
    await resumed.aclose()
