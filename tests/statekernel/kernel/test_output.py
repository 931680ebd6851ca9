"""Typed final outputs (``start(output_type=...)``): the answer is checked against the
type's JSON Schema, one that does not fit is sent back with what is wrong, and after the
retries it allows the run fails with ``OutputInvalid``; on every store, the schema and the
answer persist with the run, so a reader in another kernel (or the CLI) sees the value."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import attrs
import pydantic
import pytest
from typing_extensions import TypedDict

import statekernel as sk
from statekernel.errors import ConfigError, InvalidArgument, OutputInvalid
from statekernel.testing import ScriptedProvider, call

from .console import EXE, runs_show

VALID = '{"city": "Paris", "days": [{"day": 1, "high": 21.5}]}'
FENCED = "```json\n" + VALID + "\n```"


class Day(pydantic.BaseModel):
    day: int
    high: float


class Forecast(pydantic.BaseModel):
    """A nested model: its schema has ``$defs`` and ``$ref`` keys, kept as stored data."""

    city: str
    days: list[Day]


@attrs.frozen
class Point:
    x: int
    y: int


@dataclasses.dataclass
class Pair:
    left: str
    right: str


class Named(TypedDict):
    name: str


@sk.tool
def lookup(city: str) -> str:
    """Look a city up.

    Args:
        city: Which.
    """
    return f"{city}: sunny"


def _kernel(url: str, script: list[object]) -> sk.Kernel:
    providers = {"scripted": ScriptedProvider(script)}
    return sk.Kernel(url, tools=[lookup], providers=providers)


async def _drive(kernel: sk.Kernel, **kw: Any) -> sk.Run:
    events = [e async for e in kernel.start_and_run(model="scripted/m", messages=["go"], **kw)]
    return await kernel.get(events[0].run_id)


async def test_an_answer_valid_at_once_completes_with_the_typed_value(
    every_store_url: str,
) -> None:
    kernel = _kernel(every_store_url, [call("lookup", {"city": "Paris"}), VALID])
    try:
        run = await _drive(kernel, output_type=Forecast)
        assert run.state == "completed"
        assert run.output == {"city": "Paris", "days": [{"day": 1, "high": 21.5}]}
        assert sk.output_as(run, Forecast) == Forecast(city="Paris", days=[Day(day=1, high=21.5)])
        spec = run.output_spec
        assert spec is not None
        assert spec.name == "Forecast"
        assert "$defs" in spec.schema
        # every request of the run asked for the answer's schema
        assert all(t.request is not None and t.request.output == spec for t in run.turns)
        assert len(run.messages) == 4  # go, call, result, answer: no message sent back
    finally:
        await kernel.aclose()
    if every_store_url == "memory://":
        return  # a store of its kernel alone
    reader = sk.Kernel(every_store_url)  # another kernel reads what the store keeps
    try:
        again = await reader.get(run.run_id)
        assert again.output == run.output
        assert again.output_spec == run.output_spec
    finally:
        await reader.aclose()


async def test_an_answer_valid_after_one_retry(every_store_url: str) -> None:
    kernel = _kernel(every_store_url, ['{"city": "Paris"}', FENCED])
    try:
        events = [
            e
            async for e in kernel.start_and_run(
                model="scripted/m", messages=["go"], output_type=Forecast
            )
        ]
        run = await kernel.get(events[0].run_id)
    finally:
        await kernel.aclose()
    assert run.state == "completed"
    assert sk.output_as(run, Forecast).city == "Paris"
    sent_back = run.messages[2]
    assert sent_back.role == "user"
    assert "not a valid Forecast" in sent_back.text
    assert "'days' is a required" in sent_back.text
    # the second request carried the answer sent back; a valid answer resets the count
    second = run.turns[1].request
    assert second is not None
    assert second.messages[-1] == sent_back
    assert run.output_spec is not None
    assert run.output_spec.failures == 0
    rejected = [e.data for e in events if e.type == "turn_completed"]
    assert rejected[0].get("output_rejected") == 1
    assert "output_rejected" not in rejected[1]


async def test_an_answer_never_valid_fails_the_run_and_retry_asks_again(
    every_store_url: str,
) -> None:
    script: list[object] = ["not json", '{"city": 3}', "[1]", VALID]
    kernel = _kernel(every_store_url, script)
    try:
        with pytest.raises(OutputInvalid) as info:
            async for _ in kernel.start_and_run(
                model="scripted/m",
                messages=["go"],
                output_type=Forecast,
                output_retries=2,
                raise_on_failure=True,
            ):
                pass
        assert info.value.error == "OutputInvalid"
        assert "3 final answer(s)" in info.value.message
        assert "not of type 'object'" in (info.value.message)
        run = await kernel.get(info.value.run_id)
        assert run.state == "failed"
        assert run.failure is not None
        assert run.failure.failed_in == "preparing_turn"
        assert run.output is None
        assert [m.role for m in run.messages] == ["user", *["assistant", "user"] * 3]
        await kernel.retry(run.run_id)  # the answers it allows, again
        async for _ in kernel.run(run.run_id):
            pass
        done = await kernel.get(run.run_id)
        assert done.state == "completed"
        assert done.output["city"] == "Paris"
    finally:
        await kernel.aclose()


@pytest.mark.parametrize(
    ("output_type", "answer", "expected"),
    [
        (Point, '{"x": 1, "y": 2}', Point(1, 2)),
        (Pair, '{"left": "a", "right": "b"}', Pair("a", "b")),
        (Named, '{"name": "n"}', {"name": "n"}),
    ],
)
async def test_attrs_classes_dataclasses_and_typed_dicts(
    output_type: Any, answer: str, expected: object
) -> None:
    kernel = _kernel("memory://", ['{"x": "1"}', answer])
    try:
        run = await _drive(kernel, output_type=output_type)
        assert sk.output_as(run, output_type) == expected
    finally:
        await kernel.aclose()


async def test_a_json_schema_is_an_output_type() -> None:
    schema = {
        "title": "Verdict",
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    kernel = _kernel("memory://", ['{"ok": "yes"}', '{"ok": true, "extra": 1}', '{"ok": false}'])
    try:
        run = await _drive(kernel, output_type=schema, output_retries=3)
        assert run.output == {"ok": False}
        assert run.output_spec is not None
        assert run.output_spec.name == "Verdict"
    finally:
        await kernel.aclose()


async def test_what_is_not_an_output_type_is_refused_before_a_run_exists() -> None:
    kernel = _kernel("memory://", ["x", '{"x": "no"}'])
    try:
        for bad, words in (
            (int, "must be a JSON object"),
            ({"type": "array"}, "must be a JSON object"),
            ({"type": "object", "properties": {"a": {"type": 7}}}, "not a usable JSON Schema"),
            (object(), "no JSON Schema describes it"),
        ):
            with pytest.raises(ConfigError, match=words):
                await kernel.start(model="scripted/m", output_type=bad)
        for retries in (-1, 1.5, True):
            with pytest.raises(ConfigError, match="output_retries"):
                await kernel.start(
                    model="scripted/m",
                    output_type=Point,
                    output_retries=retries,  # type: ignore[arg-type]
                )
        assert not (await kernel.store.list_runs()).runs
        plain = await _drive(kernel)
        assert plain.output == "x"  # a run without an output type answers text
        with pytest.raises(InvalidArgument, match="started without output_type"):
            sk.output_as(plain, Point)
        typed = await _drive(kernel, output_type={"type": "object"})
        with pytest.raises(InvalidArgument, match="output of run"):
            sk.output_as(typed, Point)  # a value that does not fit the type asked for
    finally:
        await kernel.aclose()


async def test_a_delegate_returns_its_childs_typed_output_to_the_parent() -> None:
    child_answer = '{"x": 3, "y": 4}'
    script: list[object] = [
        call("locate", {"task": "where?"}),  # the parent asks its child
        '{"x": "3"}',  # the child's first answer, sent back
        child_answer,
        "done",  # the parent's final answer
    ]
    locate = sk.delegate("locate", "Locate.", model="scripted/m", output_type=Point)
    providers = {"scripted": ScriptedProvider(script)}
    kernel = sk.Kernel("memory://", tools=[locate], providers=providers)
    try:
        run = await _drive(kernel)
        record = run.turns[0].completed[0]
        assert record.error is None, record.error
        assert record.output == {"x": 3, "y": 4}
        child = await kernel.get(sk.child_run_id(run.run_id, record.id))
        assert child.output_spec is not None
        assert child.output_spec.name == "Point"
    finally:
        await kernel.aclose()


@pytest.mark.skipif(EXE is None, reason="no console script")
def test_the_cli_shows_the_typed_output(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"

    async def typed_run() -> sk.Run:
        kernel = _kernel(url, [VALID])
        try:
            return await _drive(kernel, output_type=Forecast, run_id="typed")
        finally:
            await kernel.aclose()

    run = asyncio.run(typed_run())
    shown = runs_show(run.run_id, url, "--json")
    assert json.loads(shown)["output"] == run.output
    text = runs_show(run.run_id, url)
    assert "output type" in text
    assert "Forecast" in text
    assert '"city": "Paris"' in text
