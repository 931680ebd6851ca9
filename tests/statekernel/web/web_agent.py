"""The agent of the web view's tests (also loaded by name, ``web_agent:kernel_options``,
by the processes the tests start): a model per kind of run and the tools they call.

- ``ask/m`` asks how many seats (an integer of at least 1), then answers "booked N";
- ``inject/m`` calls ``lookup``, whose result holds a ``<script>`` tag, then ends;
- ``book/m`` calls ``book`` (not idempotent: a crash in it leaves it uncertain);
- ``chat/m`` answers "hello" to anything.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import statekernel as sk
from statekernel.testing import ScriptedProvider, call

INJECTED = "<script>window.pwned = 1</script><b>bold?</b>"


@sk.tool
def lookup(q: str) -> str:
    """Look something up (the result is an injection attempt)."""
    return INJECTED


@sk.tool
def book(seats: int) -> str:
    """Book seats (not idempotent)."""
    return f"booked {seats}"


@sk.tool(idempotent=True)
async def gate(name: str) -> str:
    """Wait until the file ``name`` of ``WEB_GATE_DIR`` exists (a test opens it)."""
    folder = Path(os.environ.get("WEB_GATE_DIR", "."))
    while not (folder / name).exists():  # noqa: ASYNC110 (another process makes it)
        await asyncio.sleep(0.05)
    return "open"


def kernel_options() -> dict[str, Any]:
    """Kernel keyword arguments: the tools and one scripted provider per run kind."""
    return {
        "tools": [
            lookup,
            book,
            gate,
            sk.ask_user(answer_schema={"type": "integer", "minimum": 1}),
        ],
        "providers": {
            "ask": ScriptedProvider(
                [call("ask_user", {"question": "How many seats?"}), "booked for you"]
            ),
            "inject": ScriptedProvider([call("lookup", {"q": "<i>x</i>"}), "looked it up"]),
            "book": ScriptedProvider([call("book", {"seats": 2}), "booked"]),
            "gated": ScriptedProvider([call("gate", {"name": "go"}), "through the gate"]),
            "chat": ScriptedProvider(["hello"], repeat_last=True),
        },
    }


def only_viewing(request: Any, action: str, run_id: str | None) -> bool:
    """An ``authorize`` hook (``--authorize web_agent:only_viewing``): pages, no action."""
    return action == "view"
