"""The agent of the tests of ``statekernel runs resume --limit`` (``--agent
limits_agent:kernel_options``): a tool the model calls twice, then its answer."""

from __future__ import annotations

from typing import Any

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool
def note(text: str) -> str:
    """Note something down."""
    return f"noted {text}"


def kernel_options() -> dict[str, Any]:
    """Tools and providers: the ``scripted`` model notes twice, then answers ``done``."""
    script = [call("note", {"text": "a"}), call("note", {"text": "b"}), "done"]
    return {"tools": [note], "providers": {"scripted": ScriptedProvider(script)}}
