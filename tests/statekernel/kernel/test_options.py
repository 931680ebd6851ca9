"""Options and arguments of the public API are checked where they are given: a wrong
value is ``InvalidArgument`` naming the argument and the value, nothing is committed,
and a run can always be read back."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import InvalidArgument, StatekernelError
from statekernel.stores import MemoryStore
from statekernel.testing import ScriptedProvider

from ..conftest import MakeKernel, drain, start

NOT_A_BUDGET = ["10", 1.5, 2**70, True, -5, 0, 10.0]
NOT_SECONDS = [math.nan, math.inf, -math.inf, "15", True, None, -1.0]


def refused(name: str, value: Any) -> Any:
    """``pytest.raises`` of the ``InvalidArgument`` naming ``name`` (and the value)."""
    return pytest.raises(InvalidArgument, match=rf"^{name} .*{_shown(value)}")


def _shown(value: Any) -> str:
    return re.escape(repr(value)[:20])


@pytest.mark.parametrize("budget", NOT_A_BUDGET)
async def test_a_turn_budget_is_an_int_of_at_least_one(
    make_kernel: MakeKernel, budget: Any
) -> None:
    with refused("max_turns", budget):
        sk.Kernel("memory://", max_turns=budget)
    kernel, store, _ = make_kernel(["hi"])
    with refused("max_turns", budget):
        await start(kernel, max_turns=budget, run_id="r")
    assert (await store.list_runs()).runs == ()  # nothing committed
    await start(kernel, run_id="r", max_turns=1)
    await drain(kernel, "r")
    await kernel.send("r", "again")
    await drain(kernel, "r")
    paused = await kernel.get("r")
    assert paused.pause is not None
    assert paused.pause.reason == "max_turns"
    with refused("max_turns", budget):
        await kernel.resume("r", max_turns=budget)
    after = await kernel.get("r")
    assert after == paused
    assert after.max_turns == 1
    resumed = await kernel.resume("r", max_turns=5)
    assert resumed.max_turns == 5


@pytest.mark.parametrize("value", NOT_SECONDS)
def test_kernel_seconds_are_finite_numbers(value: Any) -> None:
    with refused("lease_ttl", value):
        sk.Kernel("memory://", lease_ttl=value)
    with refused("busy_timeout", value):
        sk.Kernel("memory://", busy_timeout=value)
    kernel = sk.Kernel("memory://", lease_ttl=2, busy_timeout=0)
    assert (kernel.lease_ttl, kernel.busy_timeout) == (2.0, 0.0)
    assert type(kernel.lease_ttl) is float


@pytest.mark.parametrize("dispatch", ["eager", {"eager": True}, 4])
def test_dispatch_is_a_policy(dispatch: Any) -> None:
    with refused("dispatch", dispatch):
        sk.Kernel("memory://", dispatch=dispatch)


@pytest.mark.parametrize(
    ("option", "value", "name"),
    [
        ("tools", 5, "tools"),
        ("tools", "record", "tools"),
        ("middleware", 5, "middleware"),
        ("middleware", [5], r"middleware\[0\]"),
        ("providers", 5, "providers"),
        ("providers", ["scripted"], "providers"),
    ],
)
def test_kernel_parts(option: str, value: Any, name: str) -> None:
    options: dict[str, Any] = {option: value}
    shown = _shown(value[0] if value == [5] else value)
    with pytest.raises(InvalidArgument, match=rf"^{name} must be .*, got {shown}"):
        sk.Kernel("memory://", **options)


async def test_kernel_parts_may_be_any_collection(make_kernel: MakeKernel) -> None:
    seen: list[str] = []

    async def note(c: Any, nxt: Any) -> Any:
        seen.append(type(c).__name__)
        return await nxt(c)

    kernel, _, _ = make_kernel(["hi"], middleware=(m for m in [note]))
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert seen == ["ModelCall"]  # a generator of middleware is taken as it is given


@pytest.mark.parametrize("value", [-1, "4", None, 2.0, True])
def test_dispatch_policy_counts_are_ints(value: Any) -> None:
    with refused("max_concurrent", value):
        sk.DispatchPolicy(max_concurrent=value)


@pytest.mark.parametrize("name", ["merge_identical", "eager"])
def test_dispatch_policy_flags_are_bools(name: str) -> None:
    options: dict[str, Any] = {name: "yes"}
    with refused(name, "yes"):
        sk.DispatchPolicy(**options)


@pytest.mark.parametrize("model", [None, 5, b"scripted/x"])
async def test_a_model_is_a_string(make_kernel: MakeKernel, model: Any) -> None:
    kernel, store, _ = make_kernel(["hi"])
    with refused("model", model):
        await kernel.start(model=model, messages=["hi"])
    assert (await store.list_runs()).runs == ()


@pytest.mark.parametrize("messages", ["abc", b"abc", sk.Message.user("hi"), 5, {"role": "user"}])
async def test_messages_are_a_list_not_one_string(make_kernel: MakeKernel, messages: Any) -> None:
    kernel, store, _ = make_kernel(["hi"])
    with pytest.raises(InvalidArgument, match=r"^messages must be a list"):
        await kernel.start(model="scripted/x", messages=messages)
    assert (await store.list_runs()).runs == ()


@pytest.mark.parametrize("run_id", [None, 5, "", "\ud800"])
async def test_run_ids_of_every_method(make_kernel: MakeKernel, run_id: Any) -> None:
    kernel, store, _ = make_kernel(["hi"])
    await start(kernel, run_id="r")
    calls = [
        kernel.get(run_id),
        kernel.events(run_id),
        kernel.send(run_id, "x"),
        kernel.resume(run_id),
        kernel.retry(run_id),
        kernel.step(run_id),
        kernel.fork(run_id),
        kernel.delete(run_id),
        kernel.children(run_id),
        kernel.update_context(run_id, lambda c: c),
        kernel.resolve_tool_call(run_id, "c", rerun=True),
        drain(kernel, run_id),
    ]
    for work in calls:
        with pytest.raises(InvalidArgument, match="run_id"):
            await work
    with pytest.raises(InvalidArgument):
        await start(kernel, run_id=run_id if run_id is not None else 5)
    assert [s.run_id for s in (await store.list_runs()).runs] == ["r"]


@pytest.mark.parametrize("after", [2**64, "1", 1.5, None])
async def test_events_after_a_revision(make_kernel: MakeKernel, after: Any) -> None:
    kernel, _, _ = make_kernel(["hi"])
    await start(kernel, run_id="r")
    await drain(kernel, "r")
    if after == 2**64:
        assert await kernel.events("r", after_revision=after) == []
        return
    with refused("after_revision", after):
        await kernel.events("r", after_revision=after)


async def test_other_arguments_of_commands(make_kernel: MakeKernel) -> None:
    kernel, store, _ = make_kernel(["hi"])
    run = await start(kernel, run_id="r")
    with refused("fn", 5):
        await kernel.update_context("r", 5)  # type: ignore[arg-type]
    with refused("children", "yes"):
        await kernel.delete("r", children="yes")  # type: ignore[arg-type]
    with refused("rerun", "yes"):
        await kernel.resolve_tool_call("r", "c", rerun="yes")  # type: ignore[arg-type]
    with refused("call_id", 5):
        await kernel.resolve_tool_call("r", 5, rerun=True)  # type: ignore[arg-type]
    with refused("queue", 5):
        await kernel.submit("r", queue=5)  # type: ignore[arg-type]
    with refused("limit", "5"):
        await store.list_runs(limit="5")  # type: ignore[arg-type]
    assert await kernel.get("r") == run


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("poll", math.nan),
        ("poll", math.inf),
        ("poll", "1"),
        ("poll", 0),
        ("max_turns", "3"),
        ("max_turns", 0),
        ("model", None),
        ("instructions", 5),
        ("queue", 5),
        ("context", {"a": {1, 2}}),
    ],
)
def test_delegate_options(option: str, value: Any) -> None:
    options: dict[str, Any] = {"model": "helper/small", option: value}
    with pytest.raises(InvalidArgument, match=rf"^{option}"):
        sk.delegate("helper", "Helps.", **options)


async def test_every_refusal_is_a_statekernel_error() -> None:
    """The refusals above derive from the one tree (and from ``ValueError``)."""
    store = MemoryStore()
    kernel = sk.Kernel(store, providers={"scripted": ScriptedProvider(["x"])})
    for work in (kernel.get(None), kernel.events("r", after_revision="1")):  # type: ignore[arg-type]
        with pytest.raises(StatekernelError) as info:
            await work
        assert isinstance(info.value, ValueError)
