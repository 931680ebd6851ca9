"""Raising a run's limits from the command line and the web view: a limit's name is a field
of ``statekernel.Limits`` (read from the class, so a new field is taken as it comes), its
value a whole number, or any finite number for a field whose type is ``float``; the run's
other limits are kept as they are. ``kind`` is the class the limits are fields of
(``Limits``)."""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Mapping
from typing import Any

import attrs

from statekernel import Limits, Run
from statekernel.errors import InvalidArgument
from statekernel.pauses import LimitReached

__all__ = [
    "check_raised",
    "limit_is_float",
    "limit_names",
    "limit_reached",
    "limits_text",
    "parse_limit",
    "parse_limit_value",
    "raised_limits",
    "suggested_limit",
]

_WHOLE = re.compile(r"[0-9]{1,18}")


def limit_names(kind: type[Any] = Limits) -> tuple[str, ...]:
    """The names of the limits a run can have (the fields of ``Limits``)."""
    return tuple(field.name for field in attrs.fields(kind))


def limit_is_float(name: str, kind: type[Any] = Limits) -> bool:
    """Whether the limit ``name`` holds a float (its field's type names ``float``)."""
    hint = typing.get_type_hints(kind)[_name(name, kind)]
    return hint is float or float in typing.get_args(hint)


def _name(name: str, kind: type[Any]) -> str:
    names = limit_names(kind)
    if name not in names:
        raise InvalidArgument(f"no limit {name!r}: a limit is one of {', '.join(names)}")
    return name


def parse_limit_value(name: str, text: str, kind: type[Any] = Limits) -> int | float:
    """The value ``text`` gives the limit ``name``: a whole number (at most 18 digits), or a
    finite number of at least 0 for a float limit. ``InvalidArgument`` naming both."""
    text = text.strip()
    if limit_is_float(name, kind):
        try:
            value: int | float = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument(f"limit {name}: {text!r} is not a number of at least 0")
    else:
        if _WHOLE.fullmatch(text) is None:
            raise InvalidArgument(f"limit {name}: {text!r} is not a whole number of at least 0")
        value = int(text)
    kind(**{name: value})  # what the class itself refuses, refused now
    return value


def parse_limit(text: str, kind: type[Any] = Limits) -> tuple[str, int | float]:
    """``NAME=VALUE`` (as ``runs resume --limit`` takes it) as a pair."""
    name, sep, value = text.partition("=")
    if not sep:
        raise InvalidArgument(f"{text!r} must look like NAME=VALUE (such as tool_calls=20)")
    name = name.strip()
    return name, parse_limit_value(name, value, kind)


def raised_limits(current: Limits | None, changes: Mapping[str, int | float]) -> Limits:
    """``current`` (None: no limit) with the limits of ``changes`` set, the others kept."""
    fields: dict[str, Any] = {_name(name, Limits): value for name, value in changes.items()}
    return attrs.evolve(current if current is not None else Limits(), **fields)


def limit_reached(run: Run) -> LimitReached | None:
    """The limit a paused run reached, if it is paused for one."""
    pause = run.pause if run.state == "paused" else None
    details = pause.details if pause is not None else None
    return details if isinstance(details, LimitReached) else None


def check_raised(run: Run, changes: Mapping[str, int | float]) -> None:
    """Refuse a new value of the limit ``run`` reached that would pause it again at once
    (not above what it used): ``InvalidArgument`` saying what it used."""
    reached = limit_reached(run)
    if reached is None or reached.limit not in changes:
        return
    value = changes[reached.limit]
    if value <= reached.used:
        raise InvalidArgument(
            f"run {run.run_id} has used {reached.used} of limit {reached.limit}: a limit of"
            f" {value} pauses it again at once; give more than {reached.used}"
        )


def suggested_limit(reached: LimitReached) -> int | float:
    """A new value for the limit ``reached`` that lets the run go on: twice what it
    allowed, and more than it used."""
    more = max(reached.allowed * 2, reached.used + 1)
    return more if limit_is_float(reached.limit) else math.ceil(more)


def limits_text(limits: Limits | None) -> str:
    """The limits set, ``name=value`` each, by field (``none`` when nothing is limited)."""
    if limits is None:
        return "none"
    values = {f.name: getattr(limits, f.name) for f in attrs.fields(Limits)}
    return " ".join(f"{k}={v}" for k, v in values.items() if v is not None) or "none"
