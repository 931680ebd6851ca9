"""Checks of the arguments and options of the public API, at the door.

Each check returns the value as it is used (an ``int`` stays an ``int``, seconds become
a ``float``) or raises ``InvalidArgument`` naming the argument and the value. Nothing
is converted from another type: ``"10"`` is not a number of turns, ``True`` is not a
count (a web form or a config file that hands over text must parse it first), and a
number of seconds is finite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from statekernel._records.values import INT_MAX
from statekernel._records.values import shown as _shown
from statekernel.errors import InvalidArgument

__all__ = [
    "callable_arg",
    "check_worker_options",
    "count",
    "deadline_in",
    "flag",
    "moment",
    "new_run_id_arg",
    "optional_count",
    "optional_text",
    "plain_id",
    "run_id_arg",
    "seconds",
    "text",
]


def _refuse(name: str, value: Any, wanted: str) -> InvalidArgument:
    return InvalidArgument(f"{name} must be {wanted}, got {_shown(value)}")


def count(name: str, value: Any, *, minimum: int = 0, maximum: int = INT_MAX) -> int:
    """An ``int`` (not a bool, not a float) from ``minimum`` to ``maximum``."""
    if type(value) is not int or not minimum <= value <= maximum:
        raise _refuse(name, value, _ints(minimum, maximum))
    return value


def optional_count(
    name: str, value: Any, *, minimum: int = 0, maximum: int = INT_MAX
) -> int | None:
    """None, or what ``count`` accepts."""
    if value is not None and (type(value) is not int or not minimum <= value <= maximum):
        raise _refuse(name, value, f"None or {_ints(minimum, maximum)}")
    return value


def _ints(minimum: int, maximum: int) -> str:
    if maximum == INT_MAX:
        return f"an int of at least {minimum}"
    return f"an int from {minimum} to {maximum}"


def seconds(name: str, value: Any, *, zero: bool = False) -> float:
    """A finite number of seconds above 0 (``zero``: or 0), as a ``float``."""
    kind = type(value)
    if kind is not int and kind is not float:
        raise _refuse(name, value, "a number of seconds")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise _refuse(name, value, "a finite number of seconds " + (">= 0" if zero else "> 0"))
    return float(value)


def moment(
    at: Any, timeout: Any, *, at_name: str = "deadline", zero: bool = False
) -> datetime | None:
    """A moment given as ``at`` (an aware ``datetime``, named ``at_name``) or ``timeout``
    seconds from now (finite, above 0; ``zero``: or 0), at most one of them, in UTC;
    None for neither."""
    if at is not None and timeout is not None:
        raise InvalidArgument(f"give a {at_name} or a timeout, not both")
    if timeout is not None:
        return deadline_in(seconds("timeout", timeout, zero=zero), "timeout")
    if at is None:
        return None
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidArgument(
            f"{at_name} must be a timezone-aware datetime (datetime.now(UTC) + ...), not {at!r}"
        )
    try:
        return at.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise InvalidArgument(f"{at_name} {at!r} is out of range: {exc}") from exc


def deadline_in(seconds_from_now: float, name: str) -> datetime:
    """The moment ``seconds_from_now`` from now; ``InvalidArgument`` naming ``name`` when
    it is beyond what a datetime holds."""
    try:
        return datetime.now(UTC) + timedelta(seconds=seconds_from_now)
    except (OverflowError, ValueError) as exc:
        raise InvalidArgument(f"{name} {seconds_from_now!r} is too large: {exc}") from exc


def flag(name: str, value: Any) -> bool:
    """``True`` or ``False``."""
    if type(value) is not bool:
        raise _refuse(name, value, "True or False")
    return value


def text(name: str, value: Any, *, empty: bool = False) -> str:
    """A ``str`` that UTF-8 can hold (no lone surrogates), not empty unless ``empty``."""
    if type(value) is not str:
        raise _refuse(name, value, "a str")
    if not value and not empty:
        raise _refuse(name, value, "a non-empty str")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _refuse(name, value, "text UTF-8 can hold (no lone surrogates)") from None
    return value


def optional_text(name: str, value: Any, *, empty: bool = False) -> str | None:
    """None, or what ``text`` accepts."""
    return None if value is None else text(name, value, empty=empty)


def run_id_arg(value: Any, name: str = "run_id") -> str:
    """A run id as a store takes it: a non-empty ``str`` UTF-8 can hold."""
    return text(name, value)


_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def plain_id(value: str) -> bool:
    """Whether ``value`` is, as a whole, 1-128 letters, digits, '.', '_', ':' and '-'
    beginning with a letter or a digit (``"r1\n"`` is not: no trailing newline slips
    past the end of the pattern)."""
    return _PLAIN_ID.fullmatch(value) is not None


def new_run_id_arg(value: Any) -> str:
    """The run id of a new run: a ``str`` that ``plain_id`` accepts, else
    ``InvalidArgument`` naming the value."""
    run_id = run_id_arg(value)
    if not plain_id(run_id):
        raise InvalidArgument(
            f"invalid run id {_shown(run_id)}: 1-128 characters of letters, digits,"
            " '.', '_', ':', '-'"
        )
    return run_id


def callable_arg(name: str, value: Any) -> Callable[..., Any]:
    """A function (or any callable)."""
    if not callable(value):
        raise _refuse(name, value, "a function")
    return value  # type: ignore[no-any-return]


def check_worker_options(
    concurrency: Any, lease_ttl: Any, grace: Any, block: Any, max_deliveries: Any
) -> tuple[int, float, float, float, int]:
    """The options of a ``Worker``, checked: at least one run in hand, a positive
    finite ``lease_ttl`` and ``block``, a finite ``grace`` of at least 0, at least one
    delivery."""
    return (
        count("concurrency", concurrency, minimum=1),
        seconds("lease_ttl", lease_ttl),
        seconds("grace", grace, zero=True),
        seconds("block", block),
        count("max_deliveries", max_deliveries, minimum=1),
    )
