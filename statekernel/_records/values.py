"""The check every JSON value passes before a run stores it.

Context, resume values, tool inputs and outputs and resolutions are stored as JSON
by the durable stores and kept as Python objects by ``memory://``. So that a value
reloads the same from every store, only what round-trips exactly through all of
them is accepted:

* ``dict`` with ``str`` keys, ``list``, ``str``, ``bool``, ``None``;
* ``int`` within signed 64 bits (``INT_MIN`` .. ``INT_MAX``): the stores' JSON reader
  turns integers past 64 bits into floats, and signed 64 bits is also what SQLite
  and most other JSON readers hold exactly;
* finite ``float`` (NaN and infinities have no JSON form);
* ``tuple`` is accepted and stored as a ``list`` (every store, memory included,
  gives back a list).

Subclasses (``OrderedDict``, ``IntEnum``, ``str`` enums) are refused: JSON would give
back the base type on the durable stores only. Containers may nest at most
``MAX_DEPTH`` deep and may not contain themselves. The walk is iterative, so a
value nested far deeper than the limit is refused without exhausting the stack.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from statekernel._records.messages import (
    JSON,
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
)
from statekernel.errors import InvalidArgument

__all__ = [
    "shown",
    "INT_MAX",
    "as_stored",
    "INT_MIN",
    "MAX_DEPTH",
    "check_messages",
    "checked",
    "json_problem",
    "merge_patch",
    "message_problem",
    "parse_json",
]

INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
MAX_DEPTH = 100
"""How many containers (dicts, lists) deep a stored value may nest."""

_LEAVES = frozenset((str, bool, type(None)))
_CONTAINERS = frozenset((dict, list, tuple))
_LEAVE = object()
_Path = tuple[Any, ...] | None
"""A path as a linked list (parent, key): rendered only when something is wrong."""


def _render(root: str, path: _Path) -> str:
    keys: list[Any] = []
    while path is not None:
        path, key = path
        keys.append(key)
    parts = [root]
    for key in reversed(keys):
        parts.append(f"[{key}]" if type(key) is int else f"[{json.dumps(key, ensure_ascii=False)}]")
    return "".join(parts)


def _scalar_problem(value: Any) -> str | None:
    kind = type(value)
    if kind is int:
        if INT_MIN <= value <= INT_MAX:
            return None
        return "integer outside the signed 64-bit range is not stored exactly"
    if kind is float:
        return None if math.isfinite(value) else f"{value!r} is not JSON"
    return f"{kind.__name__} is not JSON"


def _walk(value: Any, root: str) -> tuple[str | None, bool]:
    """(what is wrong with ``value`` or None, whether it holds tuples).

    Only containers go on the stack; leaves are checked where they are met, and a
    path is built only for containers and for what is wrong.
    """
    if type(value) not in _CONTAINERS:
        problem = None if type(value) in _LEAVES else _scalar_problem(value)
        return (None if problem is None else f"{root}: {problem}"), False
    tuples = False
    on_path: set[int] = set()
    stack: list[tuple[Any, _Path, int]] = [(value, None, 1)]
    while stack:
        item, path, depth = stack.pop()
        if item is _LEAVE:
            on_path.discard(depth)
            continue
        ident = id(item)
        if ident in on_path:
            return f"{_render(root, path)}: refers to itself", tuples
        if depth > MAX_DEPTH:
            return f"{_render(root, path)}: nested deeper than {MAX_DEPTH} levels", tuples
        on_path.add(ident)
        stack.append((_LEAVE, None, ident))
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    where = _render(root, path)
                    return f"{where}: key {key!r} is {type(key).__name__}, not str", tuples
            pairs: Iterable[tuple[Any, Any]] = item.items()
        else:
            tuples = tuples or kind is tuple
            pairs = enumerate(item)
        for key, child in pairs:
            child_kind = type(child)
            if child_kind in _LEAVES:
                continue
            if child_kind in _CONTAINERS:
                stack.append((child, (path, key), depth + 1))
                continue
            problem = _scalar_problem(child)
            if problem is not None:
                return f"{_render(root, (path, key))}: {problem}", tuples
    return None, tuples


def _plain(value: Any) -> Any:
    """``value`` with tuples as lists (only called on values already checked)."""
    kind = type(value)
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_plain(v) for v in value]
    return value


def json_problem(value: Any, root: str) -> str | None:
    """What keeps ``value`` from being stored exactly, naming its path, or None."""
    return _walk(value, root)[0]


def as_stored(value: Any, root: str) -> tuple[Any, str | None]:
    """(``value`` as it is stored, None), or (None, what is wrong with it)."""
    problem, tuples = _walk(value, root)
    if problem is not None:
        return None, problem
    return (_plain(value) if tuples else value), None


def checked(value: Any, root: str) -> Any:
    """``value`` as it is stored (tuples become lists); raises ``InvalidArgument`` naming
    the path of the first part that is not JSON (e.g. ``context["a"][3]: set is not JSON``).
    """
    stored, problem = as_stored(value, root)
    if problem is not None:
        raise InvalidArgument(problem)
    return stored


def parse_json(text: str, root: str) -> tuple[Any, str | None]:
    """Parse JSON text a model wrote: (value, None), or (None, what is wrong)."""
    try:
        value = json.loads(text)
    except RecursionError:
        return None, f"{root}: nested too deeply to parse"
    except ValueError as exc:
        return None, f"{root}: not valid JSON ({exc})"
    problem = json_problem(value, root)
    return (None, problem) if problem is not None else (value, None)


_PART_FIELDS: dict[type, tuple[tuple[str, tuple[type, ...]], ...]] = {
    TextPart: (("text", (str,)),),
    ImagePart: (
        ("url", (str, type(None))),
        ("data", (str, type(None))),
        ("media_type", (str, type(None))),
    ),
    ReasoningPart: (("text", (str,)), ("signature", (str, type(None))), ("redacted", (bool,))),
    ToolCall: (("id", (str,)), ("name", (str,)), ("arguments", (str,))),
    ToolResult: (
        ("tool_call_id", (str,)),
        ("name", (str,)),
        ("content", (str,)),
        ("is_error", (bool,)),
    ),
}
_ROLES = ("system", "user", "assistant", "tool")


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field_problem(obj: Any, name: str, kinds: tuple[type, ...], where: str) -> str | None:
    value = getattr(obj, name)
    if type(value) in kinds:
        return None
    wanted = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
    return f"{where}.{name}: {type(value).__name__} is not {wanted}"


def _message_problem(message: Any, where: str) -> str | None:
    if type(message) is not Message:
        return f"{where}: {type(message).__name__} is not a Message"
    if message.role not in _ROLES:
        return f"{where}.role: {message.role!r} is not one of {', '.join(_ROLES)}"
    problem = _field_problem(message, "name", (str, type(None)), where)
    if problem is not None:
        return problem
    for i, part in enumerate(message.content):
        fields = _PART_FIELDS.get(type(part))
        if fields is None:
            return f"{where}.content[{i}]: {type(part).__name__} is not a content part"
        for name, kinds in fields:
            problem = _field_problem(part, name, kinds, f"{where}.content[{i}]")
            if problem is not None:
                return problem
    return None


def message_problem(message: Any, where: str) -> str | None:
    """What keeps ``message`` from being stored (a field of the wrong type, an unknown
    role or content part), naming the field as ``where.field``; or None."""
    return _message_problem(message, where)


def check_messages(messages: Iterable[Any], root: str = "messages") -> None:
    """Raise ``InvalidArgument`` naming the first message field of the wrong type
    (e.g. ``messages[1].content[0].text: int is not str``)."""
    for i, message in enumerate(messages):
        problem = _message_problem(message, f"{root}[{i}]")
        if problem is not None:
            raise InvalidArgument(problem)


def merge_patch(target: JSON, patch: JSON) -> JSON:
    """``target`` with the JSON Merge Patch ``patch`` applied (RFC 7396), as a new value:
    an object patch sets its keys (objects merged recursively, ``None`` removes a key)
    on ``target`` (an empty object when ``target`` is not one); any other patch
    replaces ``target``."""
    if type(patch) is not dict:
        return patch
    out = dict(target) if type(target) is dict else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out
