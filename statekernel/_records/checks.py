"""Checks of the records a hook, a provider or middleware hands the kernel.

A ``ModelRequest`` or ``ModelResult`` built by product code is checked before it enters
a run, field by field, against what a store writes and a load accepts: strings are
``str``, token counts are ``int`` (never ``bool`` or ``float``) from 0 to ``INT_MAX``,
finish reasons and roles are the known ones, options are JSON. A wrong value raises
``InvalidArgument`` naming the field and the value (``on_model_completed: result.usage
.input_tokens: 1.5 is not an int``), so it fails the drive that got it instead of
landing in a commit that every later load refuses.
"""

from __future__ import annotations

import math
from typing import Any, get_args

import attrs

from statekernel._records.lazy import LazyTuple
from statekernel._records.messages import (
    FinishReason,
    Message,
    ModelRequest,
    ModelResult,
    Role,
    ToolSpec,
    Usage,
)
from statekernel._records.values import (
    INT_MAX,
    as_stored,
    json_problem,
    message_problem,
    shown,
)
from statekernel.errors import InvalidArgument

__all__ = [
    "FINISH_REASONS",
    "ROLES",
    "checked_request",
    "checked_result",
    "checked_usage",
    "cost_problem",
    "count_problem",
    "kind_problem",
    "usage_problem",
]

FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)
"""The normalized finish reasons a result may carry."""
ROLES: tuple[str, ...] = get_args(Role)
"""The roles a message may have."""

_NONE: LazyTuple[Message] = LazyTuple()
_USAGE_FIELDS = tuple(field.name for field in attrs.fields(Usage) if field.name != "cost")


def _shown(value: Any) -> str:
    return shown(value, 60)


def kind_problem(value: Any, kinds: tuple[type, ...], where: str) -> str | None:
    """What is wrong when ``value``'s type is not exactly one of ``kinds``, or None."""
    if type(value) in kinds:
        return None
    wanted = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
    return f"{where}: {_shown(value)} is not {wanted}"


def count_problem(value: Any, where: str) -> str | None:
    """What is wrong when ``value`` is not an ``int`` from 0 to ``INT_MAX``, or None."""
    if type(value) is not int:
        return f"{where}: {_shown(value)} is not an int"
    if not 0 <= value <= INT_MAX:
        return f"{where}: {value} is not from 0 to {INT_MAX}"
    return None


def usage_problem(usage: Any, where: str) -> str | None:
    """What is wrong when ``usage`` is not a ``Usage`` of counts from 0 to ``INT_MAX``
    and a cost that is None or a finite float of at least 0."""
    if type(usage) is not Usage:
        return f"{where}: {_shown(usage)} is not a Usage"
    for name in _USAGE_FIELDS:
        problem = count_problem(getattr(usage, name), f"{where}.{name}")
        if problem is not None:
            return problem
    return cost_problem(usage.cost, f"{where}.cost")


def cost_problem(value: Any, where: str) -> str | None:
    """What is wrong when ``value`` is not None or a finite ``float`` of at least 0."""
    if value is None:
        return None
    if type(value) is not float:
        return f"{where}: {_shown(value)} is not a float"
    if not (math.isfinite(value) and value >= 0):
        return f"{where}: {value} is not a finite amount of at least 0"
    return None


def checked_usage(usage: Any, where: str) -> Usage:
    """``usage`` if every count is an int from 0 to ``INT_MAX``; else ``InvalidArgument``."""
    problem = usage_problem(usage, where)
    if problem is not None:
        raise InvalidArgument(problem)
    return usage  # type: ignore[no-any-return]


def _spec_problem(spec: Any, where: str) -> str | None:
    if type(spec) is not ToolSpec:
        return f"{where}: {_shown(spec)} is not a ToolSpec"
    return (
        kind_problem(spec.name, (str,), f"{where}.name")
        or kind_problem(spec.description, (str,), f"{where}.description")
        or json_problem(spec.parameters, f"{where}.parameters")
    )


def _request_problem(request: ModelRequest, where: str, known: LazyTuple[Message]) -> str | None:
    problem = kind_problem(request.model, (str,), f"{where}.model")
    messages = request.messages
    shared = known.shares_prefix(messages) if isinstance(messages, LazyTuple) else 0
    for i in range(shared, len(messages)):  # the shared ones were checked on their way in
        problem = problem or message_problem(messages[i], f"{where}.messages[{i}]")
    for i, spec in enumerate(request.tools):
        problem = problem or _spec_problem(spec, f"{where}.tools[{i}]")
    for i, stop in enumerate(request.stop):
        problem = problem or kind_problem(stop, (str,), f"{where}.stop[{i}]")
    choice = request.tool_choice
    problem = problem or kind_problem(choice, (str, type(None)), f"{where}.tool_choice")
    if problem is None and request.max_tokens is not None:
        problem = count_problem(request.max_tokens, f"{where}.max_tokens")
    temperature = request.temperature
    if problem is None and temperature is not None:
        problem = kind_problem(temperature, (int, float), f"{where}.temperature")
        if problem is None and not math.isfinite(temperature):
            problem = f"{where}.temperature: {temperature!r} is not a finite number"
    return problem


def checked_request(
    request: Any, where: str, transcript: LazyTuple[Message] | None = None
) -> ModelRequest:
    """``request`` as a run stores it (its options' tuples as lists) if every field can be
    stored and read back; else ``InvalidArgument`` naming the field and the value. The
    messages it shares with ``transcript`` (the run's, checked when they entered it) are
    not checked again, so a request that extends the transcript costs what it adds."""
    if type(request) is not ModelRequest:
        raise InvalidArgument(f"{where}: {_shown(request)} is not a ModelRequest")
    problem = _request_problem(request, where, transcript if transcript is not None else _NONE)
    options, options_problem = as_stored(request.options, f"{where}.options")
    problem = problem or options_problem
    if problem is not None:
        raise InvalidArgument(problem)
    return request if options is request.options else attrs.evolve(request, options=options)


def checked_result(result: Any, where: str, total: Usage | None = None) -> ModelResult:
    """``result`` if a run can store it: an assistant message whose parts have fields of
    the right types, a valid usage, a known finish reason, a model name that is None or
    a str; with ``total`` (the run's usage so far), a sum that stays within ``INT_MAX``.
    Else ``InvalidArgument`` naming the field and the value."""
    if type(result) is not ModelResult:
        raise InvalidArgument(f"{where}: {_shown(result)} is not a ModelResult")
    message = result.message
    problem = message_problem(message, f"{where}.message")
    if problem is None and message.role != "assistant":
        problem = f"{where}.message.role: {message.role!r} is not 'assistant'"
    problem = problem or usage_problem(result.usage, f"{where}.usage")
    reason = result.finish_reason
    if problem is None and (type(reason) is not str or reason not in FINISH_REASONS):
        known = ", ".join(FINISH_REASONS)
        problem = f"{where}.finish_reason: {_shown(reason)} is not one of {known}"
    problem = problem or kind_problem(result.model, (str, type(None)), f"{where}.model")
    if problem is None and total is not None:
        for name in _USAGE_FIELDS:
            if getattr(total, name) + getattr(result.usage, name) > INT_MAX:
                problem = f"{where}.usage.{name}: the run's total would pass {INT_MAX}"
                break
    if problem is not None:
        raise InvalidArgument(problem)
    return result
