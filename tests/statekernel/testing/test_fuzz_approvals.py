"""``check_crash_resume`` on an agent whose hook pauses before a tool until approved:
an ``approve=`` that never satisfies the pause fails fast, one that does passes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.testing import CrashAt, ScriptedProvider, call, check_crash_resume


@sk.tool
def transfer_money(to: str, amount: int) -> str:
    """Send money (not idempotent)."""
    return f"sent {amount} to {to}"


class Approvals(sk.Hooks):
    """The approvals guide's hook: pause before a transfer until it is approved."""

    def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> Any:
        if call.name == "transfer_money" and run.resume_value != {"approve": call.id}:
            return sk.Pause("approval", {"call": call.id, "input": call.input})
        return None


def agent() -> Mapping[str, Any]:
    script = [call("transfer_money", {"to": "Bob", "amount": 50}), "Sent."]
    return {
        "tools": [transfer_money],
        "hooks": Approvals(),
        "providers": {"scripted": ScriptedProvider(script)},
    }


def approve_the_call(run: sk.Run) -> Any:
    assert run.pause is not None
    return {"approve": run.pause.metadata["call"]}


START = {"model": "scripted/bank", "messages": ["Pay Bob 50."]}


async def test_an_approve_that_never_satisfies_the_pause_fails_fast(tmp_path: Path) -> None:
    check = check_crash_resume(
        agent, start=START, schedule=[], store=f"sqlite:///{tmp_path}/fuzz.db"
    )
    with pytest.raises(AssertionError) as caught:
        await asyncio.wait_for(check, timeout=60)  # a hang is a failure, not a stuck suite
    message = str(caught.value)
    assert "paused again with no progress" in message
    assert "'approval'" in message
    assert "'input': {'to': 'Bob', 'amount': 50}" in message
    assert "approve=" in message


async def test_an_approve_that_answers_the_pause_completes(tmp_path: Path) -> None:
    report = await check_crash_resume(
        agent,
        start=START,
        schedule=[CrashAt("after_commit", 2), CrashAt("tool_after_effect", 1)],
        store=f"sqlite:///{tmp_path}/fuzz.db",
        approve=approve_the_call,
    )
    assert report.final.state == "completed"
    assert report.final.output == "Sent."
