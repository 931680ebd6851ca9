"""``@statekernel.tool``: schemas from hints and docstrings, strict validation, flags."""

from __future__ import annotations

import asyncio
import enum
import threading
from typing import Any, Literal

import attrs
import pytest

import statekernel as sk
from statekernel.errors import ConfigError, ToolError
from statekernel.testing import call

from ..conftest import MakeKernel, drain, start


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


@attrs.frozen
class Place:
    city: str
    country: str = "FR"


@sk.tool(idempotent=True, timeout=5)
async def forecast(
    place: Place,
    days: int,
    unit: Unit = Unit.C,
    hours: list[int] | None = None,
    mode: Literal["brief", "full"] = "brief",
    ctx: sk.ToolContext | None = None,
) -> dict[str, object]:
    """Forecast the weather.

    Uses the national service.

    Args:
        place: Where to look.
        days: How many days
            ahead, 1 to 7.
        unit: Temperature unit.
    """
    return {"city": place.city, "days": days, "unit": unit, "key": ctx and ctx.idempotency_key}


def test_schema_from_hints_and_docstring() -> None:
    spec = forecast.spec
    assert spec.name == "forecast"
    assert spec.description == "Forecast the weather. Uses the national service."
    params = spec.parameters
    assert params["required"] == ["place", "days"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert set(props) == {"place", "days", "unit", "hours", "mode"}  # ctx is not a parameter
    assert props["days"] == {"type": "integer", "description": "How many days ahead, 1 to 7."}
    assert props["unit"] == {"enum": ["celsius", "fahrenheit"], "description": "Temperature unit."}
    assert props["hours"] == {
        "anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}]
    }
    assert props["mode"] == {"enum": ["brief", "full"]}
    assert props["place"]["properties"] == {
        "city": {"type": "string"},
        "country": {"type": "string"},
    }
    assert props["place"]["required"] == ["city"]
    assert forecast.idempotent
    assert forecast.concurrency_safe
    assert forecast.timeout == 5


async def test_invoke_structures_arguments_and_unstructures_output() -> None:
    ctx = sk.ToolContext("run", "c1", 1, {})
    out = await forecast.invoke({"place": {"city": "Paris"}, "days": 2, "unit": "fahrenheit"}, ctx)
    assert out == {"city": "Paris", "days": 2, "unit": "fahrenheit", "key": "run:c1"}


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"place": {"city": "Paris"}}, "required field missing @ $.days"),
        ({"place": {"city": "Paris"}, "days": "2"}, "$.days"),
        ({"place": {"city": "Paris"}, "days": True}, "$.days"),
        ({"place": {"city": "Paris"}, "days": 2, "unit": "kelvin"}, "$.unit"),
        ({"place": {"city": "Paris"}, "days": 2, "hours": "1,2"}, "$.hours"),
        ({"place": {"city": "Paris"}, "days": 2, "mode": "long"}, "$.mode"),
        ({"place": {"town": "Paris"}, "days": 2}, "$.place"),
        ({"place": {"city": "Paris"}, "days": 2, "extra": 1}, "extra fields"),
        (["not", "an", "object"], "must be a JSON object"),
    ],
)
def test_validation_is_strict(arguments: object, problem: str) -> None:
    with pytest.raises(ToolError) as info:
        forecast.validate(arguments)
    assert problem in str(info.value)


async def test_timeout_becomes_a_tool_error() -> None:
    @sk.tool(timeout=0.01)
    async def sleepy() -> str:
        """Sleep too long."""
        await asyncio.sleep(1)
        return "late"

    with pytest.raises(ToolError, match="timed out"):
        await sleepy.invoke({}, sk.ToolContext("r", "c", 1, {}))


async def test_non_json_output_is_an_error() -> None:
    @sk.tool
    def weird() -> object:
        """Return something that is not JSON."""
        return object()

    with pytest.raises(ToolError, match="not JSON"):
        await weird.invoke({}, sk.ToolContext("r", "c", 1, {}))


def test_bad_tool_definitions_are_config_errors() -> None:
    def variadic(*args: int) -> None:
        """No schema for this."""

    with pytest.raises(ConfigError, match="args"):
        sk.tool(variadic)
    with pytest.raises(ConfigError, match="not a tool"):
        sk.Kernel("memory://", tools=[variadic])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="two tools"):
        sk.Kernel("memory://", tools=[forecast, forecast])


class Shade(enum.Enum):
    LIGHT = 1j  # a value that is not JSON


def test_a_tool_whose_schema_is_not_json_is_a_config_error() -> None:
    def paint(shade: Shade) -> str:
        """Paint."""
        return "painted"

    def stamp(mark: Literal[b"x"]) -> str:
        """Stamp."""
        return "stamped"

    with pytest.raises(ConfigError, match=r"tool 'paint': the schema of its parameters is not JS"):
        sk.tool(paint)
    with pytest.raises(ConfigError, match=r"tool 'stamp': .*bytes is not JSON"):
        sk.tool(stamp)


def test_a_kernel_refuses_a_tool_whose_schema_cannot_check_arguments() -> None:
    broken = attrs.evolve(forecast, name="lookup", parameters={"$ref": "#/$defs/gone"})
    with pytest.raises(ConfigError, match=r"tool 'lookup': .*'#/\$defs/gone' resolves nowhere"):
        sk.Kernel("memory://", tools=[broken])


def test_name_and_description_overrides() -> None:
    @sk.tool(name="lookup_user", description="Find a user.", concurrency_safe=False)
    def find(user_id: str) -> str:
        """Ignored docstring."""
        return user_id

    assert find.spec.name == "lookup_user"
    assert find.spec.description == "Find a user."
    assert not find.concurrency_safe


async def test_sync_tools_run_off_the_event_loop() -> None:
    loop_ran = threading.Event()

    @sk.tool
    def wait_for_loop() -> bool:
        """Block until the event loop has run something else (or give up)."""
        return loop_ran.wait(60)

    async def other_work() -> None:
        await asyncio.sleep(0)
        loop_ran.set()

    other = asyncio.create_task(other_work())
    assert await wait_for_loop.invoke({}, sk.ToolContext("r", "c", 1, {})) is True
    await other


async def test_a_sync_tool_that_times_out_has_an_unknown_outcome() -> None:
    release = threading.Event()
    ended = threading.Event()

    @sk.tool(timeout=0.05)
    def pay(to: str) -> str:
        """Pay someone (not idempotent); blocks until released."""
        release.wait(60)
        ended.set()
        return f"paid {to}"

    with pytest.raises(ToolError) as info:
        await pay.invoke({"to": "Bob"}, sk.ToolContext("r", "c", 1, {}))
    assert str(info.value) == "outcome unknown: pay timed out after 0.05 s; it may have run"
    assert not ended.is_set()  # the thread is still running: the call may yet happen
    release.set()
    assert await asyncio.to_thread(ended.wait, 60)


async def test_a_timed_out_idempotent_tool_is_a_plain_timeout() -> None:
    release = threading.Event()

    @sk.tool(timeout=0.05, idempotent=True)
    def lookup(key: str) -> str:
        """Look something up; blocks until released."""
        release.wait(60)
        return key

    try:
        with pytest.raises(ToolError) as info:
            await lookup.invoke({"key": "k"}, sk.ToolContext("r", "c", 1, {}))
        assert str(info.value) == "lookup timed out after 0.05 s"
    finally:
        release.set()


async def test_an_async_non_idempotent_tool_that_times_out_has_an_unknown_outcome() -> None:
    @sk.tool(timeout=0.01)
    async def send_mail(to: str) -> str:
        """Send a mail (not idempotent)."""
        await asyncio.sleep(1)
        return "sent"

    with pytest.raises(ToolError, match=r"^outcome unknown: send_mail timed out after 0.01 s"):
        await send_mail.invoke({"to": "x"}, sk.ToolContext("r", "c", 1, {}))


async def test_cancelling_a_sync_call_waits_for_its_thread() -> None:
    release = threading.Event()
    started = threading.Event()
    ended = threading.Event()

    @sk.tool
    def transfer() -> str:
        """A blocking call that cannot be interrupted."""
        started.set()
        release.wait(60)
        ended.set()
        return "done"

    task = asyncio.create_task(transfer.invoke({}, sk.ToolContext("r", "c", 1, {})))
    assert await asyncio.to_thread(started.wait, 60)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.05)
    assert not done  # still waiting for the thread, though cancelled
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended.is_set()


async def test_a_sync_tool_reports_progress_from_its_thread(make_kernel: MakeKernel) -> None:
    @sk.tool
    def convert(name: str, ctx: sk.ToolContext) -> str:
        """Convert a file, reporting progress from the worker thread."""
        ctx.report({"step": 1, "thread": threading.current_thread() is threading.main_thread()})
        return f"converted {name}"

    kernel, _, _ = make_kernel([call("convert", {"name": "a"}), "ok"], tools=[convert])
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    progress = [e.data for e in events if e.type == "tool_output"]
    assert progress == [{"call_id": "call_0_0", "data": {"step": 1, "thread": False}}]
    final = await kernel.get(run.run_id)
    assert final.turns[0].completed[0].output == "converted a"


async def test_a_timed_out_call_is_recorded_as_outcome_unknown(make_kernel: MakeKernel) -> None:
    release = threading.Event()

    @sk.tool(timeout=0.05)
    def pay(to: str, amount: int) -> str:
        """Pay someone (not idempotent)."""
        release.wait(60)
        return "paid"

    kernel, _, _ = make_kernel([call("pay", {"to": "Bob", "amount": 50}), "ok"], tools=[pay])
    run = await start(kernel)
    try:
        await drain(kernel, run.run_id)
    finally:
        release.set()
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    record = final.turns[0].completed[0]
    assert record.error == "outcome unknown: pay timed out after 0.05 s; it may have run"


def test_a_lambda_needs_a_name_and_docstring_args_must_be_parameters() -> None:
    from statekernel.errors import ConfigError

    with pytest.raises(ConfigError, match="lambda needs a name"):
        sk.tool(lambda x: x)
    named = sk.tool(name="double", description="Double it.")(lambda x: 2 * x)
    assert named.name == "double"

    def search(query: str) -> str:
        """Search.

        Args:
            query: What to look for.
            limit: How many results.
        """
        return query

    with pytest.raises(ConfigError, match="'limit' under Args:, which is not a parameter"):
        sk.tool(search)


@attrs.frozen
class Picky(sk.Tool):
    """A tool whose own argument check fails with an exception of its own."""

    def validate(self, arguments: object) -> dict[str, object]:
        raise LookupError(f"no such entry: {arguments!r}")


async def test_an_argument_check_that_raises_is_an_error_result(make_kernel: MakeKernel) -> None:
    picky = Picky(
        name="picky",
        description="Picky.",
        parameters={"type": "object"},
        fn=lambda **_: "never",
        arguments_type=dict,
    )
    kernel, _, _ = make_kernel([call("picky", {"q": 1}), "done"], tools=[picky])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    record = final.turns[0].completed[0]
    assert record.error == "invalid arguments for picky: LookupError: no such entry: {'q': 1}"


async def test_a_sync_tool_runs_in_a_thread_unless_it_is_inline() -> None:
    threads: dict[str, int] = {}

    def threaded_fn() -> str:
        """Where it runs."""
        threads["threaded"] = threading.get_ident()
        return "threaded"

    def inline_fn() -> str:
        """Where it runs."""
        threads["inline"] = threading.get_ident()
        return "inline"

    threaded = sk.tool(threaded_fn)
    inline = sk.tool(inline=True)(inline_fn)
    ctx = sk.ToolContext("r", "c", 1, {})
    assert await threaded.invoke({}, ctx) == "threaded"
    assert await inline.invoke({}, ctx) == "inline"
    assert threads["inline"] == threading.get_ident() != threads["threaded"]


async def test_an_inline_tool_drives_a_run_and_sees_its_context(make_kernel: MakeKernel) -> None:
    seen: list[str] = []

    @sk.tool(inline=True)
    def note(text: str, ctx: sk.ToolContext) -> str:
        """Note quickly."""
        seen.append(f"{ctx.run_id}:{text}")
        return f"noted {text}"

    kernel, _, _ = make_kernel([call("note", {"text": "a"}), "done"], tools=[note])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert seen == [f"{run.run_id}:a"]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"inline": True, "timeout": 1.0}, "cannot time out"),
        ({"inline": "yes"}, "inline must be True or False"),
    ],
)
def test_inline_is_refused_where_it_cannot_hold(options: dict[str, object], problem: str) -> None:
    def quick() -> str:
        """Quick."""
        return "x"

    with pytest.raises(ConfigError, match=problem):
        sk.tool(**options)(quick)  # type: ignore[call-overload]


def test_an_async_tool_cannot_be_inline() -> None:
    async def quick() -> str:
        """Quick."""
        return "x"

    with pytest.raises(ConfigError, match="inline is for sync functions"):
        sk.tool(inline=True)(quick)


def test_a_tool_built_inline_with_a_timeout_is_refused() -> None:
    def quick() -> str:
        """Quick."""
        return "x"

    built = sk.tool(quick)
    with pytest.raises(ConfigError, match="cannot time out"):
        attrs.evolve(built, inline=True, timeout=1.0)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"idempotent": "no"}, r"tool 'charge': idempotent must be True or False, got 'no'"),
        ({"concurrency_safe": 0}, r"concurrency_safe must be True or False, got 0"),
        ({"timeout": -1}, r"timeout must be a finite number of seconds > 0, got -1"),
        ({"timeout": "5"}, r"timeout must be a number of seconds, got '5'"),
        ({"timeout": float("nan")}, r"timeout must be a finite number of seconds > 0"),
    ],
)
def test_a_tool_s_flags_are_checked_when_it_is_made(options: dict[str, Any], match: str) -> None:
    # idempotent="no" was truthy: a side effect re-run on resume; a timeout of "5" failed
    # each call with a TypeError after it had started
    def charge(amount: int) -> str:
        """Charge a card."""
        return f"charged {amount}"

    with pytest.raises(ConfigError, match=match):
        sk.tool(**options)(charge)
    with pytest.raises(ConfigError, match=match):  # every way of making one
        attrs.evolve(sk.tool(charge), **options)


def test_a_schema_cycle_met_at_any_stack_depth_is_a_violation_not_a_crash() -> None:
    """A ``$ref`` cycle reached through an argument exhausts the recursion limit; where
    the limit is met decides what comes out (a ``RecursionError``, or, inside the Rust
    maps referencing keeps resources in, a pyo3 panic: a ``BaseException``). Swept over
    stack depths, every call says the schema cannot be applied."""
    from statekernel._kernel.schema import schema_violation

    looping = {"type": "object", "properties": {"q": {"allOf": [{"$ref": "#/properties/q"}]}}}

    def at_depth(n: int) -> tuple[str, str] | None:
        return at_depth(n - 1) if n else schema_violation(looping, {"q": 1})

    for depth in range(0, 120, 3):
        found = at_depth(depth)
        assert found is not None
        assert found[1].startswith("the schema cannot be applied"), (depth, found)
