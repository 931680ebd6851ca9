"""Values are checked where they enter a run, so every store accepts, refuses and
reloads them alike: context, resume values, tool outputs, resolutions, messages."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel._records.values import (
    INT_MAX,
    INT_MIN,
    MAX_DEPTH,
    check_messages,
    checked,
    json_problem,
)
from statekernel.errors import InvalidArgument
from statekernel.middleware import ToolInvocation
from statekernel.stores import CheckpointStore, open_store
from statekernel.testing import ScriptedProvider, call

KINDS = ["memory", "file", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]

Reopen = Callable[[], CheckpointStore]


@pytest.fixture(params=KINDS)
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Reopen:
    """Opens the same store again (memory: the same object), so a load decodes what was
    stored instead of reusing what was committed."""
    kind = request.param
    if kind == "memory":
        store = open_store("memory://")
        return lambda: store
    if kind == "file":
        url = f"file://{tmp_path}/files"
    elif kind == "sqlite":
        url = f"sqlite:///{tmp_path}/runs.db"
    else:
        base, prefix = (request.getfixturevalue(f) for f in ("redis_url", "redis_prefix"))
        url = f"{base}/0?prefix={prefix}"
    return lambda: open_store(url)


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def _self_ref() -> Any:
    value: dict[str, Any] = {"a": []}
    value["a"].append(value)
    return value


BOUNDARY = {
    "max": INT_MAX,
    "min": INT_MIN,
    "big_float": 1.8446744073709552e19,
    "neg_zero": -0.0,
    "tiny": 5e-324,
    "nested": {"$b": [True, False, None, "", "é\u2028"]},
    "deep": _deep(MAX_DEPTH - 1),
}

REFUSED = [
    pytest.param({"a": 2**63}, 'context["a"]: integer outside', id="int-2**63"),
    pytest.param({"a": 2**64}, 'context["a"]: integer outside', id="int-2**64"),
    pytest.param({"a": -(2**63) - 1}, 'context["a"]: integer outside', id="int-below"),
    pytest.param({"a": [1, 2, 3, {4}]}, 'context["a"][3]: set is not JSON', id="set"),
    pytest.param({"a": math.nan}, 'context["a"]: nan is not JSON', id="nan"),
    pytest.param({"a": [math.inf]}, 'context["a"][0]: inf is not JSON', id="inf"),
    pytest.param({"a": b"x"}, 'context["a"]: bytes is not JSON', id="bytes"),
    pytest.param({"t": datetime.now(UTC)}, 'context["t"]: datetime is not JSON', id="datetime"),
    pytest.param({"o": object()}, 'context["o"]: object is not JSON', id="object"),
    pytest.param({"k": {1: "a"}}, 'context["k"]: key 1 is int, not str', id="int-key"),
    pytest.param(_self_ref(), 'context["a"][0]: refers to itself', id="self-reference"),
    pytest.param(_deep(100_000), f"nested deeper than {MAX_DEPTH} levels", id="deep-100000"),
]


def _kernel(store: CheckpointStore, script: list[object], **kwargs: Any) -> sk.Kernel:
    return sk.Kernel(store, providers={"scripted": ScriptedProvider(script)}, **kwargs)


async def _drain(kernel: sk.Kernel, run_id: str) -> None:
    async for _ in kernel.run(run_id):
        pass


@pytest.mark.parametrize("value", [pytest.param(v, id=k) for k, v in BOUNDARY.items()])
async def test_boundary_values_round_trip_exactly(reopen: Reopen, value: Any) -> None:
    store = reopen()
    kernel = _kernel(store, ["done"])
    run = await kernel.start(model="scripted/m", context={"v": value}, run_id="r1")
    await store.aclose()
    again = reopen()
    loaded = await again.load(run.run_id)
    assert loaded.context == {"v": value}
    assert repr(loaded.context) == repr({"v": value})  # ints stay ints, -0.0 stays -0.0
    await again.aclose()


async def test_tuples_are_stored_as_lists_on_every_store(reopen: Reopen) -> None:
    store = reopen()
    kernel = _kernel(store, ["done"])
    run = await kernel.start(model="scripted/m", context={"t": (1, (2, 3))}, run_id="r1")
    assert run.context == {"t": [1, [2, 3]]}
    await store.aclose()
    again = reopen()
    assert (await again.load("r1")).context == {"t": [1, [2, 3]]}
    await again.aclose()


@pytest.mark.parametrize(("context", "message"), REFUSED)
async def test_values_that_do_not_round_trip_are_refused_alike(
    reopen: Reopen, context: Any, message: str
) -> None:
    store = reopen()
    kernel = _kernel(store, ["done"])
    with pytest.raises(InvalidArgument, match=r"^context") as info:
        await kernel.start(model="scripted/m", context=context, run_id="r1")
    assert message in str(info.value)
    run = await kernel.start(model="scripted/m", run_id="r2")
    with pytest.raises(InvalidArgument, match=r"^context"):
        await kernel.update_context(run.run_id, lambda _: context)
    await _drain(kernel, run.run_id)  # completed: nothing was stored
    assert (await kernel.get("r2")).context == {}
    with pytest.raises(InvalidArgument, match=r"^value"):
        await kernel.resume(run.run_id, value=context)
    with pytest.raises(InvalidArgument, match=r"^output"):
        await kernel.resolve_tool_call(run.run_id, "c", output=context)
    await store.aclose()


async def test_tool_outputs_and_resume_values_round_trip(reopen: Reopen) -> None:
    @sk.tool
    async def extremes() -> Any:
        """Boundary numbers."""
        return {"max": INT_MAX, "min": INT_MIN, "pair": (1, 2)}

    store = reopen()
    kernel = _kernel(store, [call("extremes", {}), "done"], tools=[extremes])
    run = await kernel.start(model="scripted/m", run_id="r1", messages=["go"])
    await _drain(kernel, run.run_id)
    await store.aclose()
    again = reopen()
    loaded = await again.load("r1")
    record = loaded.turns[0].completed[0]
    assert record.error is None
    assert repr(record.output) == repr({"max": INT_MAX, "min": INT_MIN, "pair": [1, 2]})
    await again.aclose()


async def test_tool_output_that_is_not_json_becomes_an_error_result(reopen: Reopen) -> None:
    @sk.tool(idempotent=True)  # else the run pauses (test_unstorable_results)
    async def huge() -> Any:
        """Too big a number."""
        return {"n": [2**64]}

    async def middleware(call_: Any, next_: Any) -> Any:
        result = await next_(call_)
        if isinstance(call_, ToolInvocation) and call_.call.name == "raw":
            return {"when": datetime(2020, 1, 1, tzinfo=UTC)}
        return result

    @sk.tool(idempotent=True)  # else the run pauses (test_unstorable_results)
    async def raw() -> Any:
        """Replaced by the middleware."""
        return {}

    store = reopen()
    script: list[object] = [[call("huge", {}), call("raw", {})], "done"]
    kernel = _kernel(store, script, tools=[huge, raw], middleware=[middleware])
    run = await kernel.start(model="scripted/m", run_id="r1", messages=["go"])
    await _drain(kernel, run.run_id)
    await store.aclose()
    again = reopen()
    loaded = await again.load("r1")
    assert loaded.state == "completed"
    errors = [r.error for r in loaded.turns[0].completed]
    assert errors[0] is not None
    assert 'output["n"][0]: integer outside' in errors[0]
    assert errors[1] is not None
    assert 'output["when"]: datetime is not JSON' in errors[1]
    await again.aclose()


# -- hooks and model arguments ---------------------------------------------------------


class _SkipWithSet:
    def on_tool_call_started(self, run: sk.Run, record: Any) -> Any:
        return sk.Skip(result={"s": {1, 2}})


async def test_hook_decision_with_a_non_json_value_fails_the_run() -> None:
    @sk.tool
    async def noop() -> str:
        """Nothing."""
        return "x"

    store = open_store("memory://")
    kernel = _kernel(store, [call("noop", {}), "done"], tools=[noop], hooks=_SkipWithSet())
    run = await kernel.start(model="scripted/m", messages=["go"])
    await _drain(kernel, run.run_id)
    failed = await kernel.get(run.run_id)
    assert failed.state == "failed"
    assert failed.failure is not None
    assert failed.failure.error == "InvalidArgument"
    assert 'Skip.result["s"]: set is not JSON' in failed.failure.message


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ('{"a": NaN}', 'arguments["a"]: nan is not JSON'),
        ('{"a": 1e999}', 'arguments["a"]: inf is not JSON'),
        ('{"a": 18446744073709551616}', 'arguments["a"]: integer outside'),
        ("[" * 100_000 + "]" * 100_000, "arguments: nested too deeply to parse"),
        ('{"a": ' + "[" * 200 + "]" * 200 + "}", "nested deeper than 100 levels"),
    ],
)
async def test_model_arguments_that_are_not_storable_get_an_error_result(
    arguments: str, why: str
) -> None:
    @sk.tool
    async def take(a: Any = None) -> str:
        """Takes anything."""
        return "ran"

    store = open_store("memory://")
    kernel = _kernel(store, [call("take", arguments), "done"], tools=[take])
    run = await kernel.start(model="scripted/m", messages=["go"])
    await _drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    record = final.turns[0].completed[0]
    assert record.error is not None
    assert why in record.error


# -- the checker itself ------------------------------------------------------------------


def test_checker_names_the_path() -> None:
    assert json_problem({"a": [0, 1, 2, {1}]}, "context") == 'context["a"][3]: set is not JSON'
    problem = json_problem([{'k"ey': None, "x": b""}], "output")
    assert problem == 'output[0]["x"]: bytes is not JSON'
    assert json_problem({"ok": [1, "2", 3.5, None, True]}, "v") is None


def test_checker_depth_limit_is_exact_and_needs_no_recursion() -> None:
    assert json_problem(_deep(MAX_DEPTH), "v") is None
    problem = json_problem(_deep(MAX_DEPTH + 1), "v")
    assert problem is not None
    assert problem.endswith(f"nested deeper than {MAX_DEPTH} levels")
    assert problem.startswith("v" + "[0]" * MAX_DEPTH)
    problem = json_problem(_deep(1_000_000), "v")
    assert problem is not None
    assert "nested deeper" in problem


def test_checker_refuses_cycles_but_not_shared_values() -> None:
    shared = {"x": 1}
    assert json_problem({"a": shared, "b": [shared, shared]}, "v") is None
    loop: list[Any] = [1]
    loop.append({"back": loop})
    assert json_problem(loop, "v") == 'v[1]["back"]: refers to itself'
    assert json_problem(_self_ref(), "context") == 'context["a"][0]: refers to itself'


def test_checker_refuses_subclasses_and_normalises_tuples() -> None:
    from collections import OrderedDict
    from enum import IntEnum

    class Level(IntEnum):
        LOW = 1

    assert json_problem({"l": Level.LOW}, "v") == 'v["l"]: Level is not JSON'
    assert json_problem(OrderedDict(a=1), "v") == "v: OrderedDict is not JSON"
    value = {"t": (1, [2, (3,)])}
    assert checked(value, "v") == {"t": [1, [2, [3]]]}
    assert value == {"t": (1, [2, (3,)])}  # the caller's value is not changed
    plain = {"t": [1]}
    assert checked(plain, "v") is plain  # nothing to normalise: no copy


def test_message_fields_are_checked_with_their_path() -> None:
    good = [sk.Message.user("hi"), sk.Message.assistant("ok")]
    check_messages(good)
    bad = sk.Message("user", (sk.TextPart("a"), sk.TextPart(5)))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"^messages\[1\]\.content\[1\]\.text: int"):
        check_messages([good[0], bad])
    call_ = sk.Message("assistant", (sk.ToolCall("id", "t", {"a": 1}),))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"content\[0\]\.arguments: dict is not str"):
        check_messages([call_])
    with pytest.raises(InvalidArgument, match=r"messages\[0\]\.role: 'robot'"):
        check_messages([sk.Message("robot", ())])  # type: ignore[arg-type]


async def test_start_and_send_check_messages() -> None:
    kernel = _kernel(open_store("memory://"), ["done"])
    bad = sk.Message("user", (sk.TextPart(b"x"),))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"messages\[1\]\.content\[0\]\.text: bytes"):
        await kernel.start(model="scripted/m", messages=["hi", bad])
    run = await kernel.start(model="scripted/m", messages=["hi"])
    await _drain(kernel, run.run_id)
    with pytest.raises(InvalidArgument, match=r"messages\[0\]\.content\[0\]\.text: bytes"):
        await kernel.send(run.run_id, bad)
