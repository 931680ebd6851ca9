"""``@statekernel.tool``: schemas from hints and docstrings, strict validation, flags."""

from __future__ import annotations

import asyncio
import enum
from typing import Literal

import attrs
import pytest

import statekernel as sk
from statekernel.errors import ConfigError, ToolError


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


def test_name_and_description_overrides() -> None:
    @sk.tool(name="lookup_user", description="Find a user.", concurrency_safe=False)
    def find(user_id: str) -> str:
        """Ignored docstring."""
        return user_id

    assert find.spec.name == "lookup_user"
    assert find.spec.description == "Find a user."
    assert not find.concurrency_safe
