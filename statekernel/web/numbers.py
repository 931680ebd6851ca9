"""Numbers a request gives (a query parameter, a form field, a header): one strict rule
for all of them, ASCII digits only and at most ``MAX_DIGITS`` of them.

Python's ``int`` takes much more than that: other scripts' digits (``"٣"``), signs,
spaces, underscores, and thousands of digits (whose conversion is slow, then refused
with a ``ValueError``). What a request gives is read here instead, and anything else
is a ``BadNumber`` naming the parameter, which the view answers with a 400.
"""

from __future__ import annotations

import math
import re

from starlette.requests import Request

from statekernel.errors import InvalidArgument

__all__ = [
    "MAX_DIGITS",
    "BadNumber",
    "decimal_number",
    "query_number",
    "signed_number",
    "whole_number",
]

MAX_DIGITS = 18
"""The most digits a number of a request may have (any such number fits in 64 bits)."""

_DIGITS = rf"[0-9]{{1,{MAX_DIGITS}}}"
_WHOLE = re.compile(_DIGITS)
_DECIMAL = re.compile(rf"-?{_DIGITS}(\.{_DIGITS})?([eE][-+]?[0-9]{{1,3}})?")

WHOLE = f"a whole number of at most {MAX_DIGITS} digits (0-9)"
SIGNED = f"an integer of at most {MAX_DIGITS} digits (0-9, a - before a negative one)"
DECIMAL = f"a number (digits 0-9, at most {MAX_DIGITS} before and after a '.', an exponent)"


class BadNumber(InvalidArgument):
    """A request's ``name`` is not a number as the view reads them (``expected`` says
    which kind)."""

    def __init__(self, name: str, text: str, expected: str = WHOLE) -> None:
        shown = text if len(text) <= 24 else text[:20] + "..."
        super().__init__(f"{name} must be {expected}, got {shown!r}")
        self.name = name


def whole_number(text: str, name: str) -> int:
    """``text`` as a whole number: ASCII digits only, at most ``MAX_DIGITS`` of them.

    Raises:
        BadNumber: anything else (naming ``name``).
    """
    if _WHOLE.fullmatch(text) is None:
        raise BadNumber(name, text)
    return int(text)


def signed_number(text: str, name: str) -> int:
    """``text`` as an integer: an optional ``-`` then what ``whole_number`` takes.

    Raises:
        BadNumber: anything else (naming ``name``).
    """
    negative = text.startswith("-")
    if _WHOLE.fullmatch(text[1:] if negative else text) is None:
        raise BadNumber(name, text, SIGNED)
    return int(text)


def decimal_number(text: str, name: str) -> float:
    """``text`` as a finite number: JSON's syntax with ASCII digits, at most
    ``MAX_DIGITS`` before and after the point and three in the exponent.

    Raises:
        BadNumber: anything else, or a number too large for a float (naming ``name``).
    """
    if _DECIMAL.fullmatch(text) is None or not math.isfinite(value := float(text)):
        raise BadNumber(name, text, DECIMAL)
    return value


def query_number(request: Request, name: str) -> int | None:
    """The query parameter ``name`` as a whole number; None when absent or empty.

    Raises:
        BadNumber: it is given and is not a whole number (see ``whole_number``).
    """
    text = request.query_params.get(name)
    return None if not text else whole_number(text, name)
