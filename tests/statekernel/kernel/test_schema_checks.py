"""A declared JSON Schema is checked once per process: a kernel built again and again
(one per request, one per test case) does not check its tools' schemas again, and what
a check found is the same whether it was remembered or not."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from statekernel._kernel import schema


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The schemas checked against their metaschema from now on."""
    seen: list[Any] = []
    real = schema._problem

    def counted(stored: Any) -> str | None:
        seen.append(stored)
        return real(stored)

    monkeypatch.setattr(schema, "_problem", counted)
    return seen


def _unique(**more: Any) -> dict[str, Any]:
    return {"type": "object", "title": uuid.uuid4().hex, **more}


def test_a_schema_is_checked_once(checks: list[Any]) -> None:
    good = _unique(properties={"x": {"type": "integer"}})
    assert schema.schema_problem(good) is None
    assert schema.schema_problem(dict(good)) is None  # an equal schema: remembered
    assert len(checks) == 1
    bad = _unique(properties={"x": {"type": 5}})
    first = schema.schema_problem(bad)
    assert first is not None
    assert "not a valid JSON Schema" in first
    assert schema.schema_problem(bad) == first
    assert len(checks) == 2


def test_a_changed_schema_is_checked_again(checks: list[Any]) -> None:
    declared = _unique(properties={"x": {"type": "integer"}})
    assert schema.schema_problem(declared) is None
    declared["properties"] = {"x": {"type": "no such type"}}
    problem = schema.schema_problem(declared)
    assert problem is not None
    assert "no such type" in problem
    assert len(checks) == 2


def test_a_huge_schema_is_checked_every_time(checks: list[Any]) -> None:
    huge = _unique(description="x" * (schema._CACHED_UP_TO + 1))
    assert schema.schema_problem(huge) is None
    assert schema.schema_problem(huge) is None
    assert len(checks) == 2


def test_a_schema_that_is_not_json_is_named_without_a_check(checks: list[Any]) -> None:
    problem = schema.schema_problem(_unique(default=float("nan")))
    assert problem is not None
    assert problem.startswith("not JSON")
    assert checks == []
