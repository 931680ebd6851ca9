"""Tools written the way Python users write them: pydantic models, TypedDicts,
dataclasses, ``Annotated`` fields, datetimes, UUIDs, tuples, and docstrings in Google,
NumPy and Sphinx style."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

import statekernel as sk
from statekernel._kernel import typed
from statekernel.errors import ConfigError, ToolError
from statekernel.testing import call

from ..conftest import MakeKernel, drain, start


class Address(BaseModel):
    """A postal address."""

    street: str
    zip_code: int


class Window(TypedDict):
    start: datetime.datetime
    hours: int


@dataclasses.dataclass
class Parcel:
    weight: float
    fragile: bool = False


@sk.tool
def ship(
    to: Address,
    parcel: Parcel,
    window: Window,
    order: uuid.UUID,
    when: datetime.date,
    speed: Literal["slow", "fast"] = "slow",
    note: Annotated[str, Field(description="Said to the courier.", max_length=20)] = "",
) -> dict[str, Any]:
    """Ship a parcel.

    Args:
        to: Where it goes.
        parcel: What goes.
        note: Overridden by the Field.
    """
    return {
        "types": [type(v).__name__ for v in (to, parcel, window, order, when)],
        "to": to,
        "window": window,
        "when": when,
        "speed": speed,
        "note": note,
    }


GOOD = {
    "to": {"street": "1 rue de Rivoli", "zip_code": 75001},
    "parcel": {"weight": 2},
    "window": {"start": "2026-01-02T09:00:00Z", "hours": 3},
    "order": "12345678-1234-5678-1234-567812345678",
    "when": "2026-01-02",
}


def test_pydantic_types_get_a_json_schema() -> None:
    params = ship.spec.parameters
    props = params["properties"]
    assert params["required"] == ["to", "parcel", "window", "order", "when"]
    assert props["to"] == {"$ref": "#/$defs/Address", "description": "Where it goes."}
    assert params["$defs"]["Address"]["required"] == ["street", "zip_code"]
    assert props["parcel"]["description"] == "What goes."
    assert props["order"] == {"type": "string", "format": "uuid"}
    assert props["when"] == {"type": "string", "format": "date"}
    assert props["speed"] == {"enum": ["slow", "fast"]}
    assert props["note"]["description"] == "Said to the courier."
    assert props["note"]["maxLength"] == 20
    assert params["additionalProperties"] is False


def test_valid_arguments_reach_the_tool_as_the_declared_types() -> None:
    values = ship.validate(GOOD)
    assert values["to"] == Address(street="1 rue de Rivoli", zip_code=75001)
    assert values["parcel"] == Parcel(weight=2.0)
    assert values["window"]["start"] == datetime.datetime(2026, 1, 2, 9, tzinfo=datetime.UTC)
    assert values["order"] == uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert values["when"] == datetime.date(2026, 1, 2)
    assert values["speed"] == "slow"


async def test_typed_output_is_written_as_json() -> None:
    out = await ship.invoke(GOOD, sk.ToolContext("r", "c", 1, {}))
    assert out == {
        "types": ["Address", "Parcel", "dict", "UUID", "date"],
        "to": {"street": "1 rue de Rivoli", "zip_code": 75001},
        "window": {"start": "2026-01-02T09:00:00+00:00", "hours": 3},
        "when": "2026-01-02",
        "speed": "slow",
        "note": "",
    }


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"to": {"street": "x", "zip_code": "75001"}}, "valid integer @ $.to.zip_code"),
        ({"to": {"street": "x"}}, "Field required @ $.to.zip_code"),
        ({"parcel": {"weight": "2"}}, "valid number @ $.parcel.weight"),
        ({"window": {"start": "tomorrow", "hours": 1}}, "valid datetime"),
        ({"order": "not-a-uuid"}, "@ $.order"),
        ({"when": 20260102}, "@ $.when"),
        ({"note": "x" * 21}, "at most 20 characters @ $.note"),
        ({"speed": "warp"}, "$.speed"),
    ],
)
def test_bad_arguments_are_refused_naming_the_parameter(
    change: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ToolError, match=r"^invalid arguments for ship: ") as info:
        ship.validate({**GOOD, **change})
    assert problem in str(info.value)


def test_a_missing_typed_argument_is_named() -> None:
    arguments = {k: v for k, v in GOOD.items() if k != "to"}
    with pytest.raises(ToolError, match=r"required field missing @ \$\.to"):
        ship.validate(arguments)


def test_fixed_tuples_get_their_schema_and_take_their_arguments() -> None:
    @sk.tool
    def place(at: tuple[int, str], tags: tuple[str, ...] = ()) -> str:
        """Place something."""
        return f"{at[0]}:{at[1]}:{len(tags)}"

    props = place.spec.parameters["properties"]
    assert props["at"] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert place.validate({"at": [1, "a"], "tags": ["x"]}) == {"at": (1, "a"), "tags": ("x",)}
    for bad in (["1", "a"], [1, "a", 2], [1]):
        with pytest.raises(ToolError, match=r"\$\.at"):
            place.validate({"at": bad})


def test_without_pydantic_a_pydantic_type_asks_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(typed, "_installed", lambda: False)

    def remind(at: datetime.datetime) -> str:
        """Remind."""
        return "ok"

    with pytest.raises(ConfigError, match=r"parameter 'at': .*statekernel\[pydantic\]"):
        sk.tool(remind)

    def plain(n: Annotated[int, "a number"]) -> int:
        """Annotated without pydantic: the type as it is."""
        return n

    assert sk.tool(plain).spec.parameters["properties"]["n"] == {"type": "integer"}


def numpy_style(city: str, days: int = 1) -> str:
    """Forecast the weather.

    Uses the national service.

    Parameters
    ----------
    city : str
        Where to look.
    days : int
        How many days
        ahead.

    Returns
    -------
    str
        The forecast.
    """
    return city


def sphinx_style(city: str, days: int = 1) -> str:
    """Forecast the weather.

    Uses the national service.

    :param city: Where to look.
    :param days: How many days
        ahead.
    :returns: The forecast.
    """
    return city


def google_style(city: str, days: int = 1) -> str:
    """Forecast the weather.

    Uses the national service.

    Args:
        city (str): Where to look.
        days: How many days
            ahead.

    Returns:
        The forecast.
    """
    return city


@pytest.mark.parametrize("fn", [numpy_style, sphinx_style, google_style])
def test_docstrings_in_every_style_describe_the_tool(fn: Any) -> None:
    spec = sk.tool(fn).spec
    assert spec.description == "Forecast the weather. Uses the national service."
    props = spec.parameters["properties"]
    assert props["city"] == {"type": "string", "description": "Where to look."}
    assert props["days"] == {"type": "integer", "description": "How many days ahead."}


def test_a_numpy_docstring_describing_no_parameter_is_refused() -> None:
    def search(query: str) -> str:
        """Search.

        Parameters
        ----------
        query : str
            What to look for.
        limit : int
            How many.
        """
        return query

    with pytest.raises(ConfigError, match="'limit' under Parameters, which is not a parameter"):
        sk.tool(search)


async def test_a_resumed_call_gets_the_same_typed_values(make_kernel: MakeKernel) -> None:
    seen: list[tuple[Address, datetime.datetime]] = []
    gate = asyncio.Event()

    @sk.tool(idempotent=True)
    async def deliver(to: Address, at: datetime.datetime) -> str:
        """Deliver (idempotent): the first attempt waits until the run is cancelled."""
        seen.append((to, at))
        if len(seen) == 1:
            await gate.wait()
        return f"{to.street} at {at.isoformat()}"

    arguments = {"to": {"street": "Main St", "zip_code": 1}, "at": "2026-03-04T05:06:07+01:00"}
    kernel, _, _ = make_kernel([call("deliver", arguments), "done"], tools=[deliver])
    run = await start(kernel)
    task = asyncio.create_task(drain(kernel, run.run_id))
    while not seen:  # noqa: ASYNC110 - polls what the tool under test records
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    turn = (await kernel.get(run.run_id)).current_turn
    assert turn is not None
    stored = turn.in_flight[0]
    assert stored.input == arguments  # the run keeps JSON
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert len(seen) == 2
    assert seen[0] == seen[1]
    assert isinstance(seen[1][0], Address)
    assert seen[1][1] == datetime.datetime(2026, 3, 4, 4, 6, 7, tzinfo=datetime.UTC)
    assert final.turns[0].completed[0].output == "Main St at 2026-03-04T05:06:07+01:00"
