"""The migration of stored documents from schema version 1 to 2.

Version 1 kept what a paused run waits for in ``PauseInfo.metadata`` (free JSON, read
by its reason) and a call that a hook's ``Finish`` skipped only in its error text
(``"not run: the run finished (REASON)"``). Version 2 stores the pause's typed details
(``statekernel._records.pauses``, tagged with ``"kind"``) and the skipped call's
reason in ``ToolCallRecord.skipped``. Documents are the converter's (values may be
escaped, ``{"$e": ...}``, in a store's documents: they move as they are).
"""

from __future__ import annotations

from typing import Any

from statekernel._records.run import CHILD_PAUSED, INPUT_REQUIRED, MAX_TURNS, UNCERTAIN

__all__ = ["SKIPPED_PREFIX", "from_v1"]

SKIPPED_PREFIX = "not run: the run finished ("
"""How version 1 wrote the error of a call a hook's ``Finish`` skipped."""

_RECORD_LISTS = ("pending", "in_flight", "completed")


def from_v1(kind: str, doc: Any) -> Any:
    """``doc`` (a ``"head"``, ``"run"``, ``"turn"`` or ``"message"`` document) at
    version 1, as it is at version 2."""
    if kind in ("head", "run"):
        for key in ("pause", "pending_pause"):
            if isinstance(doc.get(key), dict):
                doc[key] = _pause(doc[key])
    if kind == "run":
        if isinstance(doc.get("current_turn"), dict):
            _turn(doc["current_turn"])
        for turn in doc.get("turns", ()):
            _turn(turn)
    elif kind == "turn":
        _turn(doc)
    return doc


def _turn(doc: dict[str, Any]) -> dict[str, Any]:
    for key in _RECORD_LISTS:
        for record in doc.get(key, ()):
            error = record.get("error")
            if type(error) is str and error.startswith(SKIPPED_PREFIX) and error[-1:] == ")":
                record["skipped"] = error[len(SKIPPED_PREFIX) : -1]
    return doc


def _pause(doc: dict[str, Any]) -> dict[str, Any]:
    if "metadata" not in doc:
        return doc
    out = {k: v for k, v in doc.items() if k != "metadata"}
    meta = doc["metadata"]
    details = _details(doc.get("reason"), meta) if type(meta) is dict else None
    if details is None:
        details = {"kind": "hook", "metadata": meta}
    out["details"] = details
    return out


def _details(reason: Any, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The typed details of a pause of a built-in reason (None: a hook's own pause)."""
    if reason == UNCERTAIN and type(meta.get("calls")) is list:
        out: dict[str, Any] = {"kind": "uncertain", "calls": meta["calls"]}
        resolutions = meta.get("resolutions")
        if type(resolutions) is dict and resolutions:
            out["resolutions"] = {k: _resolution(r) for k, r in resolutions.items()}
        return out
    if reason == INPUT_REQUIRED and "question" in meta:
        asks = [_ask(meta), *(_ask(w) for w in meta.get("waiting", ()))]
        return {"kind": "question", "asks": asks}
    if reason == CHILD_PAUSED and "child" in meta:
        out = {"kind": "child", "calls": _calls(meta), "name": meta["name"]}
        out["child"] = meta["child"]
        why = meta.get("child_pause")
        if type(why) is dict and "reason" in why:
            out["child_pause"] = {"reason": why["reason"], "metadata": why.get("metadata", {})}
        return out
    if reason == MAX_TURNS and set(meta) == {"max_turns", "turns"}:
        return {"kind": "max_turns", **meta}
    return None


def _calls(meta: dict[str, Any]) -> list[Any]:
    return list(meta.get("calls", [meta.get("call")]))


def _ask(meta: dict[str, Any]) -> dict[str, Any]:
    out = {"calls": _calls(meta), "name": meta["name"], "question": meta["question"]}
    if meta.get("schema") is not None:
        out["schema"] = meta["schema"]
    return out


def _resolution(doc: dict[str, Any]) -> dict[str, Any]:
    attempt = doc["attempt"]
    if doc.get("rerun"):
        return {"kind": "rerun", "attempt": attempt}
    if type(doc.get("error")) is str:
        return {"kind": "error", "attempt": attempt, "error": doc["error"]}
    return {"kind": "output", "attempt": attempt, "output": doc.get("output")}
