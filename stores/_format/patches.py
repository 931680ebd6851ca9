"""Head patches: how the commit log keeps every revision of a run's head small.

A commit log entry holds the head as a patch of the head before it, and a full head
every ``SNAPSHOT_EVERY`` revisions (``statekernel.stores._format.codec``). A patch
is ``{key: value}`` to set, ``{"-": [keys]}`` to delete and ``{"~key": patch}`` to
patch a nested record document (the current turn, its request and result).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SNAPSHOT_EVERY", "apply_patch", "diff", "same"]

SNAPSHOT_EVERY = 32
"""Every revision divisible by this is logged as a full head, the others as patches."""

_NESTED = frozenset({"current_turn", "request", "result"})
_NOT_LOGGED = "revision"
_MISSING = object()


def same(a: Any, b: Any) -> bool:
    """Equality of JSON values that also tells ``1``, ``1.0`` and ``True`` apart."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is dict:
        if len(a) != len(b):
            return False
        for key, value in a.items():
            other = b.get(key, _MISSING)
            if other is _MISSING or not (value is other or same(value, other)):
                return False
        return True
    if kind is list:
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):  # noqa: SIM110 - a plain loop is faster here
            if x is not y and not same(x, y):
                return False
        return True
    return bool(a == b)


def diff(old: dict[str, Any], new: dict[str, Any], *, top: bool = True) -> dict[str, Any]:
    """A patch turning head document ``old`` into ``new`` (revision excluded).

    ``{key: value}`` sets, ``{"-": [keys]}`` deletes, ``{"~key": patch}`` patches a
    nested record document (the current turn, its request and result).
    """
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if top and key == _NOT_LOGGED:
            continue
        prior = old.get(key, _MISSING)
        if prior is value:
            continue
        if key in _NESTED and type(prior) is dict and type(value) is dict:
            sub = diff(prior, value, top=False)
            if sub:
                patch["~" + key] = sub
        elif not same(prior, value):
            patch[key] = value
    gone = [k for k in old if k not in new and not (top and k == _NOT_LOGGED)]
    if gone:
        patch["-"] = gone
    return patch


def apply_patch(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``patch`` applied (``doc`` is not modified)."""
    out = dict(doc)
    for key, value in patch.items():
        if key == "-":
            for gone in value:
                out.pop(gone, None)
        elif key[:1] == "~":
            out[key[1:]] = apply_patch(out[key[1:]], value)
        else:
            out[key] = value
    return out
