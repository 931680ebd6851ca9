"""Reading the fields of a vendor's response: a missing or malformed one is a
``ProviderUnavailable`` naming the field (as the vendor's JSON spells its path), never a
default that would be committed as if the model had said it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statekernel._records.checks import count_problem
from statekernel.errors import ProviderUnavailable

__all__ = [
    "content_text",
    "index_of",
    "malformed",
    "need_list",
    "need_object",
    "need_text",
    "optional_list",
    "optional_object",
    "optional_text",
    "shown",
    "tool_call_id",
    "token_count",
]


def malformed(provider: str, field: str, problem: str) -> ProviderUnavailable:
    """The error for a response whose ``field`` has ``problem`` (retryable, like any
    other unreadable response)."""
    return ProviderUnavailable(
        f"{provider}: malformed response: {field} {problem}", provider=provider
    )


def shown(value: Any) -> str:
    """How a bad field's value reads in an error (``missing (or null)``, ``is 42``)."""
    return "missing (or null)" if value is None else f"is {value!r:.80}"


def need_object(provider: str, value: Any, field: str) -> dict[str, Any]:
    """``value`` if it is a JSON object."""
    if not isinstance(value, dict):
        raise malformed(provider, field, f"{shown(value)}, not an object")
    return value


def optional_object(provider: str, value: Any, field: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, ``{}`` if it is missing or null."""
    return {} if value is None else need_object(provider, value, field)


def need_list(provider: str, value: Any, field: str) -> list[Any]:
    """``value`` if it is a JSON array."""
    if not isinstance(value, list):
        raise malformed(provider, field, f"{shown(value)}, not a list")
    return value


def optional_list(provider: str, value: Any, field: str) -> list[Any]:
    """``value`` if it is a JSON array, ``[]`` if it is missing or null."""
    return [] if value is None else need_list(provider, value, field)


def optional_text(provider: str, value: Any, field: str) -> str:
    """``value`` if it is a string, ``""`` if it is missing or null."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise malformed(provider, field, f"{shown(value)}, not a string")
    return value


def content_text(provider: str, value: Any, field: str) -> tuple[str, str]:
    """A message content and the reasoning it carries: a string, null, or a list of
    content parts whose ``text`` parts are joined as the text and whose ``thinking``
    parts (Mistral's reasoning models: ``{"type": "thinking", "thinking": [text
    parts]}``) as the reasoning; parts of other types (images) are not the answer's text
    and are left out.

    Returns:
        The text and the reasoning (each possibly empty).
    """
    if not isinstance(value, list):
        if value is not None and not isinstance(value, str):
            raise malformed(provider, field, f"{shown(value)}, not text or a list of parts")
        return value or "", ""
    texts: list[str] = []
    thoughts: list[str] = []
    for index, item in enumerate(value):
        part = need_object(provider, item, f"{field}[{index}]")
        where = f"{field}[{index}]"
        if part.get("type") == "text":
            texts.append(_part_text(provider, part, where))
        elif part.get("type") == "thinking":
            inner = part.get("thinking")
            if isinstance(inner, str):
                thoughts.append(inner)
                continue
            for number, piece in enumerate(need_list(provider, inner, f"{where}.thinking")):
                thought = need_object(provider, piece, f"{where}.thinking[{number}]")
                if thought.get("type") == "text":
                    thoughts.append(_part_text(provider, thought, f"{where}.thinking[{number}]"))
    return "".join(texts), "".join(thoughts)


def _part_text(provider: str, part: dict[str, Any], where: str) -> str:
    text = part.get("text")
    if not isinstance(text, str):
        raise malformed(provider, f"{where}.text", f"{shown(text)}, not a string")
    return text


def need_text(provider: str, value: Any, field: str) -> str:
    """``value`` if it is a non-empty string (a tool call's name, say: a call without
    one names no tool)."""
    if not isinstance(value, str) or not value:
        raise malformed(provider, field, f"{shown(value)}, not a non-empty string")
    return value


def tool_call_id(provider: str, value: Any, field: str) -> str | None:
    """A tool call's id, or None when the server left it out (an id is then made)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise malformed(provider, field, f"{shown(value)}, not a string")
    return value


def token_count(provider: str, usage: Mapping[str, Any], key: str, where: str) -> int:
    """``usage[key]``: a non-negative int (``bool`` refused); 0 when missing or null.
    ``where`` is the path of ``usage`` in the response ("" at the top level)."""
    return _count(provider, usage, key, where, "a token count")


def index_of(provider: str, data: Mapping[str, Any], key: str, where: str) -> int:
    """``data[key]``, a block's or call's position: a non-negative int; 0 when missing."""
    return _count(provider, data, key, where, "an index")


def _count(provider: str, data: Mapping[str, Any], key: str, where: str, what: str) -> int:
    value = data.get(key)
    if value is None:
        return 0
    field = f"{where}.{key}" if where else key
    if count_problem(value, field) is not None:
        raise malformed(provider, field, f"{shown(value)}, not {what}")
    return int(value)
