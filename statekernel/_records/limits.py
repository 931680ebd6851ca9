"""A run's usage limits (``Limits``) and the check made before each model or tool call.

A limit is *reached* when the figure used is at least the figure allowed. The drive
checks the token limits before it starts a model call (a new turn) and the tool-call
limit before it starts a tool call; a call that started always finishes and is
committed, so the last call may take a figure past its limit. Reaching one pauses the
run with reason ``limit_reached`` (``LimitReached`` names the limit, the figure used and
the one allowed); ``Kernel.resume(run_id, limits=...)`` raises it and the run goes on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias, get_args

import attrs

from statekernel._records.fallback import Fallback
from statekernel._records.messages import Usage
from statekernel._records.pauses import LimitReached
from statekernel.errors import ConfigError, InvalidArgument

__all__ = [
    "LIMIT_NAMES",
    "LimitName",
    "Limits",
    "check_limits",
    "check_priced",
    "model_limit_reached",
    "tool_limit_reached",
]

LimitName: TypeAlias = Literal[
    "input_tokens", "output_tokens", "total_tokens", "cost", "tool_calls"
]
"""The figures a run can be limited on."""

LIMIT_NAMES: tuple[LimitName, ...] = get_args(LimitName)


def _figure(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if type(value) is not int or value < 0:
        raise InvalidArgument(
            f"Limits.{attribute.name} must be None or an int of at least 0, got {value!r:.80}"
        )


def _amount(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise InvalidArgument(
            f"Limits.{attribute.name} must be None or a finite number of at least 0,"
            f" got {value!r:.80}"
        )


def _as_amount(value: Any) -> Any:
    return float(value) if type(value) is int else value


@attrs.frozen
class Limits:
    """What a run may use (None: no limit on that figure), checked before each call.

    ``input_tokens``: tokens sent (cache reads and writes included); ``output_tokens``:
    tokens generated; ``total_tokens``: both; ``cost``: what the model answers cost
    (``Run.usage.cost``, in the currency of the kernel's price table); ``tool_calls``:
    tool calls started (a call and its identical duplicates that run once count once; a
    re-run of an interrupted call does not count again). Token and cost limits are
    checked before each model call, the tool-call limit before each tool call: a limit
    reached (used >= allowed) pauses the run with reason ``limit_reached``. A call that
    started finishes, so the figures can end past a limit by what the last call used.

    A cost limit needs prices: a kernel that starts, resumes or drives a run with one
    must have the price of every model the run may call (its model and its
    ``Fallback`` chain) in ``Kernel(prices=...)``, else ``ConfigError`` names the
    models without one.

    Raises:
        InvalidArgument: a token or tool-call figure that is not None or an int of at
            least 0, or a cost that is not None or a finite number of at least 0.
    """

    input_tokens: int | None = attrs.field(default=None, validator=_figure)
    output_tokens: int | None = attrs.field(default=None, validator=_figure)
    total_tokens: int | None = attrs.field(default=None, validator=_figure)
    tool_calls: int | None = attrs.field(default=None, validator=_figure)
    cost: float | None = attrs.field(default=None, validator=_amount, converter=_as_amount)


def check_limits(value: Any, name: str = "limits") -> Limits | None:
    """``value`` if it is None or a ``Limits``; ``InvalidArgument`` naming ``name`` otherwise."""
    if value is not None and not isinstance(value, Limits):
        raise InvalidArgument(f"{name} must be None or a statekernel.Limits, got {value!r:.80}")
    return value


def _used(usage: Usage, name: LimitName, tool_calls: int) -> int | float:
    if name == "input_tokens":
        return usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    if name == "output_tokens":
        return usage.output_tokens
    if name == "total_tokens":
        return usage.total_tokens
    if name == "cost":
        return 0.0 if usage.cost is None else usage.cost
    return tool_calls


def model_limit_reached(limits: Limits | None, usage: Usage) -> LimitReached | None:
    """The first token or cost limit that ``usage`` has reached (checked before a model
    call)."""
    if limits is None:
        return None
    for name in LIMIT_NAMES[:4]:
        allowed = getattr(limits, name)
        if allowed is not None:
            used = _used(usage, name, 0)
            if used >= allowed:
                return LimitReached(name, used, allowed)
    return None


def tool_limit_reached(limits: Limits | None, tool_calls: int) -> LimitReached | None:
    """The tool-call limit, when ``tool_calls`` started have reached it (checked before a
    tool call starts)."""
    if limits is None or limits.tool_calls is None or tool_calls < limits.tool_calls:
        return None
    return LimitReached("tool_calls", tool_calls, limits.tool_calls)


def check_priced(
    limits: Limits | None, model: str, fallback: Fallback | None, prices: Mapping[str, Any]
) -> None:
    """``ConfigError`` when ``limits`` has a cost limit and ``prices`` lacks the price of
    ``model`` or of a model of the ``fallback`` chain."""
    if limits is None or limits.cost is None:
        return
    models = [model, *(fallback.models if fallback is not None else ())]
    missing = [m for m in dict.fromkeys(models) if m not in prices]
    if missing:
        raise ConfigError(
            f"a cost limit needs the price of every model the run may call: no price for"
            f" {', '.join(map(repr, missing))} in Kernel(prices=...)"
        )
