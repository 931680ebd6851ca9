"""Child runs: a ``delegate`` tool's call runs another agent as a run of its own, with
an id derived from the parent run and the call, so a crash never starts two children
for one call; a paused child pauses the parent; every store keeps the lineage."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import statekernel as sk
from statekernel._front.text import waiting_for
from statekernel.errors import (
    ConfigError,
    InvalidArgument,
    InvalidTag,
    ProviderUnavailable,
    RunHasChildren,
    RunNotFound,
)
from statekernel.pauses import LimitReached
from statekernel.stores import MemoryStore, open_store
from statekernel.testing import Crash, CrashAt, Fail, FaultPlan, Reply, ScriptedProvider, call

from ..cli.test_cli_runs import EXE, as_json, ok
from ..cli.test_cli_runs import sk as sk_cli


@sk.tool
def transfer(amount: int) -> str:
    """Move money."""
    return f"moved {amount}"


class Approvals(sk.Hooks):
    def on_tool_call_started(self, run: sk.Run, record: sk.ToolCallRecord) -> sk.Decision | None:
        if run.resume_value != {"approve": record.id}:
            return sk.Pause("approval", {"call": record.id})
        return None


def _providers(parent: list[object], child: list[object]) -> dict[str, ScriptedProvider]:
    return {"scripted": ScriptedProvider(parent), "helper": ScriptedProvider(child)}


def _researcher(model: str | sk.Fallback = "helper/small", **kw: object) -> sk.Tool:
    return sk.delegate(
        "researcher",
        "Find a fact.",
        model=model,
        instructions="You research.",
        **kw,  # type: ignore[arg-type]
    )


async def _drive(kernel: sk.Kernel, run_id: str) -> sk.Run:
    async for _ in kernel.run(run_id):
        pass
    return await kernel.get(run_id)


async def test_a_delegate_call_runs_a_child_and_takes_its_answer(every_store_url: str) -> None:
    providers = _providers(
        [call("researcher", {"task": "the answer?"}, id="d1"), "It is 42."], ["found: 42"]
    )
    kernel = sk.Kernel(every_store_url, tools=[_researcher()], providers=providers)
    run = await kernel.start(model="scripted/lead", messages=["ask"], run_id="lead-1")
    final = await _drive(kernel, run.run_id)
    assert final.state == "completed"
    assert final.turns[0].completed[0].output == "found: 42"
    child_id = sk.child_run_id("lead-1", "d1")
    assert child_id == "lead-1.d1"
    [child] = await kernel.children("lead-1")
    assert (child.run_id, child.parent_run_id, child.parent_call_id) == (child_id, "lead-1", "d1")
    assert [(m.role, m.text) for m in child.messages] == [
        ("system", "You research."),
        ("user", "the answer?"),
        ("assistant", "found: 42"),
    ]
    assert child.model == "helper/small"
    assert (await kernel.get("lead-1")).parent_run_id is None
    await kernel.aclose()
    store = open_store(every_store_url) if every_store_url != "memory://" else None
    if store is not None:
        assert (await store.load(child_id)) == child
        await store.aclose()


async def test_a_crash_after_the_child_completed_takes_its_answer_without_a_second_child() -> None:
    store = MemoryStore()
    providers = _providers([call("researcher", {"task": "t"}, id="d1"), "done"], ["answer"])
    plan = FaultPlan([CrashAt("tool_after_effect", 1)])
    crashing = sk.Kernel(
        store, tools=[_researcher()], providers=providers, middleware=[plan.middleware()]
    )
    run = await crashing.start(model="scripted/lead", messages=["go"])
    with pytest.raises(Crash):
        await _drive(crashing, run.run_id)
    child = await store.load(sk.child_run_id(run.run_id, "d1"))
    assert child.state == "completed"
    kernel = sk.Kernel(store, tools=[_researcher()], providers=providers)
    final = await _drive(kernel, run.run_id)
    assert final.state == "completed"
    assert final.turns[0].completed[0].output == "answer"
    assert len(providers["helper"].requests) == 1  # the child's model was called once
    assert (await store.load(child.run_id)).revision == child.revision


async def test_a_paused_child_pauses_its_parent_until_it_is_resumed() -> None:
    store = MemoryStore()
    payer = sk.delegate("payer", "Pay.", model="helper/small", tools=[transfer], hooks=Approvals())
    providers = _providers(
        [call("payer", {"task": "pay 5"}, id="p1"), "paid"],
        [call("transfer", {"amount": 5}, id="t1"), "transferred"],
    )
    kernel = sk.Kernel(store, tools=[payer], providers=providers)
    run = await kernel.start(model="scripted/lead", messages=["go"], run_id="boss")
    paused = await _drive(kernel, run.run_id)
    assert paused.pause is not None
    assert paused.pause.reason == "child_paused"
    assert paused.pause.metadata == {
        "call": "p1",
        "calls": ["p1"],
        "name": "payer",
        "child": "boss.p1",
        "child_pause": {"reason": "approval", "metadata": {"call": "t1"}},
    }
    assert waiting_for(paused.pause) == "child_paused: child run boss.p1 (approval)"
    await kernel.resume("boss")  # the child still waits: the parent pauses again
    again = await _drive(kernel, "boss")
    assert again.pause is not None
    assert again.pause.reason == "child_paused"
    await kernel.resume("boss.p1", value={"approve": "t1"})
    await kernel.resume("boss")
    final = await _drive(kernel, "boss")
    assert final.state == "completed"
    assert final.turns[0].completed[0].output == "transferred"
    child = await kernel.get("boss.p1")
    assert child.turns[0].completed[0].output == "moved 5"


async def test_a_failed_child_is_an_error_result() -> None:
    class Broken(sk.Hooks):
        def on_turn_prepared(self, run: sk.Run, request: sk.ModelRequest) -> None:
            raise RuntimeError("no model for you")

    failing = sk.delegate("helper", "Help.", model="helper/small", hooks=Broken())
    providers = _providers([call("helper", {"task": "t"}, id="h"), "oh well"], ["never"])
    kernel = sk.Kernel(MemoryStore(), tools=[failing], providers=providers)
    run = await kernel.start(model="scripted/lead", messages=["go"], run_id="r")
    final = await _drive(kernel, run.run_id)
    assert final.state == "completed"
    error = final.turns[0].completed[0].error or ""
    assert error == "child run r.h failed: RuntimeError: no model for you"


def test_child_run_ids_are_derived_and_always_valid() -> None:
    assert sk.child_run_id("a", "call_1") == "a.call_1"
    long = sk.child_run_id("p" * 125, "call_1")
    assert long == sk.child_run_id("p" * 125, "call_1")
    assert len(long) <= 128
    assert long.startswith("p" * 80 + ".")
    assert sk.child_run_id("a", "toolu/01 x") != sk.child_run_id("a", "toolu/01 y")


async def _nested(store: object) -> sk.Kernel:
    """A lead whose researcher delegates again: lead-1 -> lead-1.d1 -> lead-1.d1.g1."""
    deep = sk.delegate("digger", "Dig deeper.", model="helper/deep")
    researcher = _researcher(tools=[deep])
    providers = {
        "scripted": ScriptedProvider([call("researcher", {"task": "t"}, id="d1"), "lead done"]),
        "helper": ScriptedProvider(
            [
                Reply(text="", tool_calls=[call("digger", {"task": "dig"}, id="g1")]),
                "researched",
            ]
        ),
    }
    kernel = sk.Kernel(store, tools=[researcher], providers=providers)  # type: ignore[arg-type]
    run = await kernel.start(model="scripted/lead", messages=["go"], run_id="lead-1")
    assert (await _drive(kernel, run.run_id)).state == "completed"
    return kernel


async def test_deleting_a_run_with_children_is_refused_unless_asked() -> None:
    store = MemoryStore()
    kernel = await _nested(store)
    assert [c.run_id for c in await kernel.children("lead-1")] == ["lead-1.d1"]
    assert (await store.load("lead-1.d1.g1")).parent_run_id == "lead-1.d1"
    with pytest.raises(RunHasChildren) as refused:
        await kernel.delete("lead-1")
    assert refused.value.children == ["lead-1.d1", "lead-1.d1.g1"]
    assert (await store.load("lead-1")).state == "completed"
    assert await kernel.delete("lead-1", children=True) == ["lead-1.d1.g1", "lead-1.d1", "lead-1"]
    for run_id in ("lead-1", "lead-1.d1", "lead-1.d1.g1"):
        with pytest.raises(RunNotFound):
            await store.load(run_id)


class _Refused(Exception):
    """What an application's approval raises to keep a tree."""


async def test_a_deletion_is_approved_on_the_whole_tree_it_deletes() -> None:
    store = MemoryStore()
    kernel = await _nested(store)
    seen: list[list[str]] = []

    async def refuse(tree: list[str]) -> None:
        seen.append(tree)
        raise _Refused

    with pytest.raises(_Refused):
        await kernel.delete("lead-1", children=True, approve=refuse)
    assert seen == [["lead-1", "lead-1.d1", "lead-1.d1.g1"]]
    for run_id in ("lead-1", "lead-1.d1", "lead-1.d1.g1"):  # nothing was deleted
        assert (await store.load(run_id)).state == "completed"

    async def allow(tree: list[str]) -> None:
        seen.append(tree)

    deleted = await kernel.delete("lead-1", children=True, approve=allow)
    assert deleted == ["lead-1.d1.g1", "lead-1.d1", "lead-1"]
    assert seen[-1] == ["lead-1", "lead-1.d1", "lead-1.d1.g1"]


async def test_an_approval_that_is_not_an_async_function_deletes_nothing() -> None:
    store = MemoryStore()
    kernel = await _nested(store)
    with pytest.raises(InvalidArgument, match="approve must be an async function"):
        await kernel.delete("lead-1", children=True, approve="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"approve returned None, which cannot be awaited"):
        await kernel.delete("lead-1", children=True, approve=lambda tree: None)  # type: ignore[arg-type, return-value]
    assert (await store.load("lead-1.d1.g1")).state == "completed"
    assert await kernel.delete("lead-1", children=True) == ["lead-1.d1.g1", "lead-1.d1", "lead-1"]


@pytest.mark.skipif(EXE is None, reason="the statekernel console script is not installed")
async def test_the_command_line_shows_lists_and_deletes_a_tree(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    kernel = await _nested(store)
    await kernel.aclose()
    drawn = ok(sk_cli("runs", "tree", "lead-1", "--store", store, cwd=tmp_path))
    lines = drawn.splitlines()
    assert lines[0].startswith("lead-1  completed")
    assert "lead-1.d1  completed" in lines[1]
    assert "(call d1)" in lines[1]
    assert "lead-1.d1.g1  completed" in lines[2]
    assert lines[2].index("lead-1.d1.g1") > lines[1].index("lead-1.d1")  # one level deeper
    nodes = as_json(sk_cli("runs", "tree", "lead-1", "--store", store, "--json", cwd=tmp_path))
    assert [(n["run_id"], n["depth"]) for n in nodes] == [
        ("lead-1", 0),
        ("lead-1.d1", 1),
        ("lead-1.d1.g1", 2),
    ]
    listed = as_json(
        sk_cli("runs", "list", "--root", "lead-1.d1", "--store", store, "--json", cwd=tmp_path)
    )
    assert sorted(r["run_id"] for r in listed) == ["lead-1.d1", "lead-1.d1.g1"]
    refused = sk_cli("runs", "delete", "lead-1", "--yes", "--store", store, cwd=tmp_path)
    assert refused.returncode == 2
    assert "has 2 child run(s)" in refused.stderr
    gone = sk_cli(
        "runs", "delete", "lead-1", "--yes", "--with-children", "--store", store, cwd=tmp_path
    )
    assert "deleted run lead-1 and 2 child run(s)" in ok(gone)
    left = as_json(sk_cli("runs", "list", "--store", store, "--json", cwd=tmp_path))
    assert left == []


async def test_cancelling_the_parents_drive_leaves_the_child_resumable() -> None:
    import asyncio

    store = MemoryStore()
    providers = _providers(
        [call("researcher", {"task": "slow"}, id="d1"), "lead done"],
        [Reply(text="slow answer", chunk=2, delay=0.05)],
    )
    kernel = sk.Kernel(store, tools=[_researcher()], providers=providers)
    run = await kernel.start(model="scripted/lead", messages=["go"], run_id="p")
    drive = asyncio.ensure_future(_drive(kernel, "p"))
    for _ in range(200):  # until the child's model is streaming
        await asyncio.sleep(0.01)
        if providers["helper"].requests:
            break
    drive.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drive
    child = await store.load("p.d1")
    assert child.state == "calling_model"  # its intent committed, its answer not
    assert (await store.load("p")).state == "dispatching_tools"
    final = await _drive(kernel, run.run_id)
    assert final.state == "completed"
    assert final.turns[0].completed[0].output == "slow answer"
    assert (await store.load("p.d1")).state == "completed"
    await kernel.aclose()


@pytest.mark.redis
async def test_children_run_on_the_workers_of_a_queue(redis_store_url: str) -> None:
    """The parent's process drives only the parent: the child is handed to the workers
    of its queue (which bring the child agent), paused there, resumed, and finished."""
    child_model = ScriptedProvider([call("transfer", {"amount": 7}, id="t1"), "transferred 7"])
    payer_chain = sk.Fallback("helper/small", "helper/big")
    payer = sk.delegate(
        "payer",
        "Pay.",
        model=payer_chain,
        queue="payers",
        poll=0.1,
        limits=sk.Limits(tool_calls=5),
        tags={"role": "payer"},
    )
    parent = sk.Kernel(
        redis_store_url,
        tools=[payer],
        providers={"scripted": ScriptedProvider([call("payer", {"task": "pay 7"}, id="p1"), "ok"])},
    )
    agent = {"tools": [transfer], "hooks": Approvals(), "providers": {"helper": child_model}}
    worker = sk.Worker(redis_store_url, queue="payers", agent=agent, lease_ttl=2.0, block=0.05)
    serving = asyncio.ensure_future(worker.serve())
    try:
        run = await parent.start(
            model="scripted/lead", messages=["go"], run_id="q-boss", tags={"team": "pay"}
        )
        paused = await _drive(parent, run.run_id)
        assert paused.pause is not None
        assert paused.pause.metadata["child"] == "q-boss.p1"
        assert child_model.requests, "the worker drove the child"
        await parent.resume("q-boss.p1", value={"approve": "t1"})
        await parent.resume("q-boss")
        final = await _drive(parent, "q-boss")
        assert final.state == "completed"
        assert final.turns[0].completed[0].output == "transferred 7"
        child = await parent.get("q-boss.p1")
        assert child.parent_run_id == "q-boss"
        assert child.turns[0].completed[0].output == "moved 7"
        assert (child.fallback, child.limits) == (payer_chain, sk.Limits(tool_calls=5))
        assert child.tags == {"team": "pay", "role": "payer"}
    finally:
        worker.stop()
        stats = await serving
        await parent.aclose()
    assert stats.completed == 1
    assert stats.paused == 1


def test_a_delegate_polls_at_a_positive_interval() -> None:
    with pytest.raises(InvalidArgument, match="poll"):
        sk.delegate("x", "X.", model="helper/small", queue="q", poll=0)


async def test_a_child_run_carries_its_parents_tags_with_the_delegates_over_them(
    tmp_path: Path,
) -> None:
    researcher = _researcher(tags={"env": "staging", "role": "researcher"})
    providers = _providers([call("researcher", {"task": "t"}, id="d1"), "done"], ["found"])
    async with sk.Kernel(
        f"sqlite:///{tmp_path}/runs.db", tools=[researcher], providers=providers
    ) as kernel:
        await kernel.start(
            model="scripted/lead", messages=["go"], run_id="tagged", tags={"team": "search"}
        )
        await kernel.update_tags("tagged", {"env": "prod"})  # the tags when the call starts
        assert (await _drive(kernel, "tagged")).state == "completed"
        child = await kernel.get("tagged.d1")
        assert child.tags == {"team": "search", "env": "staging", "role": "researcher"}
        assert (await kernel.get("tagged")).tags == {"team": "search", "env": "prod"}
        found = await kernel.store.list_runs(tags={"role": "researcher"})
        assert [r.run_id for r in found.runs] == ["tagged.d1"]


async def test_a_child_with_too_many_tags_is_an_error_result_naming_it() -> None:
    many = {f"k{i}": "v" for i in range(30)}
    researcher = _researcher(tags={f"own{i}": "v" for i in range(5)})
    providers = _providers([call("researcher", {"task": "t"}, id="d1"), "done"], ["found"])
    async with sk.Kernel(MemoryStore(), tools=[researcher], providers=providers) as kernel:
        await kernel.start(model="scripted/lead", messages=["go"], run_id="crowded", tags=many)
        final = await _drive(kernel, "crowded")
        [result] = final.turns[0].completed
        assert result.error is not None
        assert "child run 'crowded.d1' would carry 35 tags" in result.error
        with pytest.raises(RunNotFound):
            await kernel.get("crowded.d1")


async def test_a_child_that_reaches_its_limit_pauses_its_parent_until_it_is_raised() -> None:
    payer = sk.delegate(
        "payer", "Pay.", model="helper/small", tools=[transfer], limits=sk.Limits(tool_calls=1)
    )
    providers = _providers(
        [call("payer", {"task": "pay twice"}, id="p1"), "paid"],
        [call("transfer", {"amount": 1}, id="t1"), call("transfer", {"amount": 2}, id="t2"), "ok"],
    )
    async with sk.Kernel(MemoryStore(), tools=[payer], providers=providers) as kernel:
        await kernel.start(model="scripted/lead", messages=["go"], run_id="budget")
        paused = await _drive(kernel, "budget")
        child = await kernel.get("budget.p1")
        assert child.limits == sk.Limits(tool_calls=1)
        assert child.pause is not None
        assert child.pause.reason == "limit_reached"
        assert child.pause.details == LimitReached("tool_calls", 1, 1)
        assert paused.pause is not None
        assert paused.pause.reason == "child_paused"
        assert paused.pause.metadata["child"] == "budget.p1"
        assert paused.pause.metadata["child_pause"] == {
            "reason": "limit_reached",
            "metadata": {"limit": "tool_calls", "used": 1, "allowed": 1},
        }
        await kernel.resume("budget.p1", limits=sk.Limits(tool_calls=3))
        await kernel.resume("budget")
        final = await _drive(kernel, "budget")
        assert final.state == "completed"
        assert final.turns[0].completed[0].output == "ok"
        child = await kernel.get("budget.p1")
        assert [c.output for t in child.turns for c in t.completed] == ["moved 1", "moved 2"]
        assert child.limits == sk.Limits(tool_calls=3)
        assert (await kernel.get("budget")).limits is None  # the parent had none


async def test_a_child_on_a_fallback_chain_is_answered_by_the_next_model() -> None:
    chain = sk.Fallback("down/big", "helper/small")
    researcher = _researcher(model=chain)
    providers = _providers([call("researcher", {"task": "t"}, id="d1"), "done"], ["found"])
    down = ScriptedProvider([Fail(ProviderUnavailable("overloaded", provider="down"), times=9)])
    async with sk.Kernel(
        MemoryStore(), tools=[researcher], providers={**providers, "down": down}
    ) as kernel:
        await kernel.start(model="scripted/lead", messages=["go"], run_id="chained")
        final = await _drive(kernel, "chained")
        assert final.turns[0].completed[0].output == "found"
        child = await kernel.get("chained.d1")
        assert (child.model, child.fallback) == ("down/big", chain)
        assert child.turns[0].model == "helper/small"
        assert down.requests  # the first model was asked first


async def test_a_child_on_a_chain_whose_provider_is_unknown_is_an_error_result() -> None:
    researcher = _researcher(model=sk.Fallback("helper/small", "nowhere/x"))
    providers = _providers([call("researcher", {"task": "t"}, id="d1"), "done"], ["found"])
    async with sk.Kernel(MemoryStore(), tools=[researcher], providers=providers) as kernel:
        await kernel.start(model="scripted/lead", messages=["go"], run_id="unknown")
        final = await _drive(kernel, "unknown")
        [result] = final.turns[0].completed
        assert result.error is not None
        assert "nowhere" in result.error
        with pytest.raises(RunNotFound):
            await kernel.get("unknown.d1")


def test_a_delegates_model_limits_and_tags_are_checked_when_it_is_made() -> None:
    with pytest.raises(InvalidArgument, match="model must be a str 'provider/name' or a"):
        sk.delegate("x", "X.", model=["helper/small"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"limits must be None or a statekernel\.Limits"):
        sk.delegate("x", "X.", model="helper/small", limits={"tool_calls": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidTag, match="tag key 'bad key'") as bad:
        sk.delegate("x", "X.", model="helper/small", tags={"bad key": "v"})
    assert bad.value.key == "bad key"
    with pytest.raises(InvalidTag, match="must have a str value"):
        sk.delegate("x", "X.", model="helper/small", tags={"k": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidTag, match="at most 32"):
        sk.delegate("x", "X.", model="helper/small", tags={f"k{i}": "v" for i in range(33)})
