"""Typed final outputs: the ``OutputSpec`` of an ``output_type``, the check of a final
answer against it, and the answer as a Python value (``output_as``).

An output type is a pydantic model, a dataclass or a ``TypedDict`` (described by
pydantic, the ``pydantic`` extra), an attrs class (described here), or a JSON Schema
given as a dict. Its schema is stored with the run, so whichever process drives the run
checks the answer against it without the Python type; the type is needed only to turn
the stored JSON value back into an instance (``output_as``).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar, cast, overload

import attrs
import cattrs

from statekernel._kernel import typed
from statekernel._kernel.schema import (
    schema_for,
    schema_problem,
    schema_violation,
    strict_converter,
)
from statekernel._records.messages import JSON, Message, OutputSpec
from statekernel._records.run import Run, answer_json
from statekernel._records.values import as_stored
from statekernel.errors import ConfigError, InvalidArgument

__all__ = [
    "DEFAULT_RETRIES",
    "output_as",
    "output_decision",
    "output_problem",
    "output_spec_for",
    "retry_prompt",
]

DEFAULT_RETRIES = 1
"""How many times a final answer that does not satisfy the output schema is sent back."""

_T = TypeVar("_T")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def output_spec_for(output_type: object, retries: object = DEFAULT_RETRIES) -> OutputSpec:
    """The ``OutputSpec`` of ``output_type`` (see the module; an ``OutputSpec`` is kept as
    it is); ``ConfigError`` naming what is wrong for a type no schema describes, a schema
    that is not an object's, or a ``retries`` that is not a count."""
    if type(retries) is not int or retries < 0:
        raise ConfigError(f"output_retries must be an int >= 0, got {retries!r}")
    if isinstance(output_type, OutputSpec):  # made already (a delegate tool's child)
        return output_type
    if isinstance(output_type, dict):
        schema, _ = as_stored(output_type, "output_type")
        problem = schema_problem(schema) if schema is not None else "it is not JSON"
        if problem is not None:
            raise ConfigError(f"output_type: not a usable JSON Schema: {problem}")
        name = str(output_type.get("title") or "output")
    else:
        schema = _schema_of(output_type)
        name = getattr(output_type, "__name__", "output")
    if schema.get("type") != "object":
        raise ConfigError(
            f"output_type {name!r}: the final answer must be a JSON object (a model,"
            f" dataclass, TypedDict, attrs class or an object's schema), its schema says"
            f" type {schema.get('type')!r}"
        )
    safe = "".join(c if c in _NAME_CHARS else "_" for c in name)[:64] or "output"
    return OutputSpec(safe, schema, retries)


def _schema_of(output_type: object) -> dict[str, Any]:
    if attrs.has(cast(type, output_type)):
        try:
            return schema_for(output_type)
        except TypeError as exc:
            raise ConfigError(f"output_type {output_type!r}: {exc}") from exc
    adapter, why = typed.adapter_for(output_type)
    if adapter is None:
        raise ConfigError(f"output_type {output_type!r}: no JSON Schema describes it; {why}")
    schema: dict[str, Any] = adapter.json_schema()
    return schema


def output_problem(spec: OutputSpec, text: str) -> str | None:
    """What is wrong with ``text`` as a final answer of ``spec`` (None: it satisfies it)."""
    try:
        value = answer_json(text)
    except ValueError as exc:
        return f"the answer is not JSON ({exc})"
    if _not_finite(value):
        return "the answer holds a number JSON cannot carry (NaN or infinity)"
    violation = schema_violation(spec.schema, value)
    if violation is None:
        return None
    where, message = violation
    return f"at ${where}: {message}" if where else message


def _not_finite(value: JSON) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_not_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_not_finite(v) for v in value)
    return False


def retry_prompt(spec: OutputSpec, problem: str) -> str:
    """The user message that sends an invalid final answer back to the model."""
    return (
        f"Your final answer is not a valid {spec.name}: {problem}. Answer again with only"
        f" the JSON object, satisfying the {spec.name} schema."
    )


def output_decision(
    run: Run, answer: Message | None, finish: str | None, then_pause: object
) -> tuple[str | None, str | None, str | None]:
    """What a turn that ``finish``es the run does with its ``answer`` (the assistant
    message, None: none): (finish, reask, refused). An answer that does not satisfy the
    run's ``output_spec`` does not finish it: ``reask`` is the message that sends it
    back, and once the spec's retries are spent ``refused`` says why the run fails
    (``OUTPUT_INVALID``)."""
    spec = run.output_spec
    if spec is None or finish is None or then_pause is not None:
        return finish, None, None
    problem = output_problem(spec, answer.text if answer is not None else "")
    if problem is None:
        return finish, None, None
    refused = None
    if spec.failures >= spec.retries:
        answers = spec.failures + 1
        refused = f"no valid {spec.name} in {answers} final answer(s); the last: {problem}"
    return None, retry_prompt(spec, problem), refused


@overload
def output_as(run: Run, output_type: type[_T]) -> _T: ...


@overload
def output_as(run: Run, output_type: Any) -> Any: ...


def output_as(run: Run, output_type: Any) -> Any:
    """The final output of a completed run as an instance of ``output_type`` (the type
    given to ``start(output_type=...)``: a pydantic model, dataclass, ``TypedDict`` or
    attrs class).

    Raises:
        InvalidArgument: the run has not completed, was started without an output type,
            or its output does not fit ``output_type``.
    """
    if run.state != "completed":
        raise InvalidArgument(f"run {run.run_id!r} has no output: it is {run.state}")
    if run.output_spec is None:
        raise InvalidArgument(
            f"run {run.run_id!r} has no typed output: it was started without output_type"
        )
    value = run.output
    if attrs.has(output_type):
        try:
            return _ATTRS.structure(value, output_type)
        except (cattrs.BaseValidationError, TypeError, ValueError, AttributeError) as exc:
            why = (
                "; ".join(cattrs.transform_error(exc))
                if isinstance(exc, cattrs.BaseValidationError)
                else str(exc)
            )
            raise InvalidArgument(f"output of run {run.run_id!r}: {why}") from exc
    adapter, why = typed.adapter_for(output_type)
    if adapter is None:
        raise InvalidArgument(f"output_as: {output_type!r} is not an output type ({why})")
    result, problems = typed.check(adapter, "output", value)
    if problems:
        raise InvalidArgument(f"output of run {run.run_id!r}: {'; '.join(problems)}")
    return result


_ATTRS = strict_converter()
