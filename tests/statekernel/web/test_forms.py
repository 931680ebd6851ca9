"""A question's answer form from its JSON schema, and the answer read back and checked."""

from __future__ import annotations

from typing import Any

import pytest

from statekernel.errors import InvalidArgument
from statekernel.web.forms import answer_fields, read_answer


def kinds(schema: Any) -> list[tuple[str, str, bool]]:
    return [(f.name, f.kind, f.required) for f in answer_fields(schema)]


def test_scalars_get_an_input_of_their_kind() -> None:
    assert kinds({"type": "integer", "minimum": 1}) == [("value", "integer", True)]
    assert kinds({"type": "number"}) == [("value", "number", True)]
    assert kinds({"type": "string"}) == [("value", "text", True)]
    assert kinds({"type": "boolean"}) == [("value", "boolean", True)]
    assert kinds({"enum": ["yes", "no"]}) == [("value", "choice", True)]
    assert answer_fields({"enum": ["yes", "no"]})[0].choices == ('"yes"', '"no"')
    assert kinds(None) == [("value", "json", True)]
    assert kinds({"type": "array", "items": {"type": "integer"}}) == [("value", "json", True)]


def test_an_object_gets_one_input_per_property() -> None:
    schema = {
        "type": "object",
        "properties": {
            "seats": {"type": "integer", "minimum": 1},
            "name": {"type": "string"},
            "window": {"type": "boolean"},
        },
        "required": ["seats", "name"],
    }
    assert kinds(schema) == [
        ("f.seats", "integer", True),
        ("f.name", "text", True),
        ("f.window", "boolean", False),
    ]
    answer = read_answer(schema, {"f.seats": "2", "f.name": "Ada", "f.window": "on"})
    assert answer == {"seats": 2, "name": "Ada", "window": True}
    with pytest.raises(InvalidArgument, match="'name' is a required property"):
        read_answer(schema, {"f.seats": "2"})


def test_answers_are_read_by_kind_and_checked_against_the_schema() -> None:
    assert read_answer({"type": "integer"}, {"value": "3"}) == 3
    assert read_answer({"type": "number"}, {"value": "2.5"}) == 2.5
    assert read_answer({"enum": [1, "two"]}, {"value": '"two"'}) == "two"
    assert read_answer(None, {"value": '{"a": [1]}'}) == {"a": [1]}
    assert read_answer(None, {"value": "plain words"}) == "plain words"
    assert read_answer({"type": "boolean"}, {}) is False
    with pytest.raises(InvalidArgument, match="answer must be an integer of at most 18 digits"):
        read_answer({"type": "integer"}, {"value": "two"})
    with pytest.raises(InvalidArgument, match="less than the minimum of 1"):
        read_answer({"type": "integer", "minimum": 1}, {"value": "0"})
    with pytest.raises(InvalidArgument, match="the answer is empty"):
        read_answer({"type": "integer"}, {"value": ""})
    with pytest.raises(InvalidArgument, match="not one of"):
        read_answer({"enum": ["a"]}, {"value": '"b"'})


@pytest.mark.parametrize(
    "text", ["\u00b2", "\u0663", "9" * 5000, "1_000", " 5", "+5", "--5", "5.0"]
)
def test_an_integer_answer_is_ascii_digits_only(text: str) -> None:
    # int() takes all of these but the last three, or spends its time on 5,000 digits
    with pytest.raises(InvalidArgument, match="answer must be an integer of at most 18"):
        read_answer({"type": "integer"}, {"value": text})
    assert read_answer({"type": "integer"}, {"value": "-12"}) == -12


@pytest.mark.parametrize("text", ["nan", "inf", "1e999", "\u0663.5", "1" * 19, ".5", "1."])
def test_a_number_answer_is_finite_and_written_in_ascii(text: str) -> None:
    with pytest.raises(InvalidArgument, match="answer must be a number"):
        read_answer({"type": "number"}, {"value": text})
    assert read_answer({"type": "number"}, {"value": "-1.5e3"}) == -1500.0
