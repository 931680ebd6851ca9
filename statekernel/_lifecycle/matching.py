"""What a tool call asks for, independent of how the model wrote it: the tool's name
and its arguments as parsed JSON, in a canonical form (object keys sorted, no
whitespace, a whole float written as an integer). Two calls with the same key ask for
the same thing, whatever their ids or the text of their arguments."""

from __future__ import annotations

import json
from typing import Any

from statekernel._records.values import parse_json

__all__ = ["call_key"]


def call_key(name: str, arguments: str) -> tuple[str, str] | None:
    """(tool name, canonical JSON of the ``arguments`` text), or None when they are not
    a JSON object (such a call asks for nothing another call can be said to repeat)."""
    text = arguments if arguments.strip() else "{}"
    value, problem = parse_json(text, "arguments")
    if problem is not None or not isinstance(value, dict):
        return None
    canonical = json.dumps(
        _numbers(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return name, canonical


def _numbers(value: Any) -> Any:
    """``value`` with every float that is a whole number as an int (``5.0`` is ``5``);
    booleans stay booleans."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value
