"""What a run looks like as one line of text, the same in the command line and the web
view: a value cut short, a moment, what a pause waits for."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from statekernel._front.visible import visible
from statekernel._records.messages import JSON
from statekernel._records.pauses import ChildWait, LimitReached, Question, Uncertain
from statekernel._records.run import PauseInfo

__all__ = ["short", "stamp", "waiting_for"]


def short(value: JSON, limit: int = 120) -> str:
    """Compact one-line JSON (or the string itself), cut to ``limit`` characters, with
    its control characters escaped (``visible``)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = visible(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def stamp(at: datetime) -> str:
    """A moment as every command shows it: ISO 8601 in UTC, to the second."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting_for(pause: PauseInfo) -> str:
    """A pause's reason and what it waits for, in one short line."""
    details = pause.details
    meta = pause.metadata
    if isinstance(details, Uncertain):
        detail = "calls " + ", ".join(f"{c.id} ({c.name})" for c in details.calls)
    elif isinstance(details, ChildWait):
        why = details.child_pause
        detail = f"child run {details.child}" + (f" ({why.reason})" if why else "")
    elif isinstance(details, Question):
        ask = details.asked
        question = ask.question
        text = question if isinstance(question, str) else json.dumps(question, ensure_ascii=False)
        detail = f"{ask.name} asks {text!r} (call {ask.calls[0]})"
    elif isinstance(details, LimitReached):
        detail = f"{details.limit} used {details.used} of {details.allowed}"
    elif isinstance(meta, dict) and "call" in meta:  # a hook's pause about one call
        name = meta.get("name")
        detail = f"call {meta['call']}" + (f" ({name})" if isinstance(name, str) else "")
    elif meta in ({}, None):
        detail = ""
    else:
        detail = json.dumps(meta, separators=(",", ":"), ensure_ascii=False)
    return short(f"{pause.reason}: {detail}" if detail else pause.reason, 80)
