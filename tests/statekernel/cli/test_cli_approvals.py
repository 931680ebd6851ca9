"""Approvals and input from the command line: ``runs list --state paused`` says what
each run waits for, ``runs resume --value`` answers it, ``runs send`` adds a message."""

from __future__ import annotations

import asyncio
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_cli_runs import EXE, as_json, ok, sk

pytestmark = pytest.mark.skipif(
    EXE is None, reason="the statekernel console script is not installed"
)

AGENT_MODULE = '''
import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool
def transfer(amount: int) -> str:
    """Move money."""
    return f"moved {amount}"


class Approvals(sk.Hooks):
    def on_tool_call_started(self, run, call):
        if run.resume_value != {"approve": call.id}:
            return sk.Pause("approval", {"call": call.id, "input": call.input})
        return None


def kernel_options():
    script = [call("transfer", {"amount": 50}), "transferred", "nothing else to move"]
    return {
        "tools": [transfer],
        "hooks": Approvals(),
        "providers": {"scripted": ScriptedProvider(script)},
    }
'''


def _start(folder: Path, module: str, store: str, run_id: str) -> None:
    """Start run ``run_id`` with the agent of ``folder/module.py`` and drive it to rest."""
    sys.path.insert(0, str(folder))
    try:
        options = importlib.import_module(module).kernel_options

        async def start() -> None:
            import statekernel as statek

            async with statek.Kernel(store, **options()) as kernel:
                run = await kernel.start(model="scripted/app", messages=["go"], run_id=run_id)
                async for _ in kernel.run(run.run_id):
                    pass

        asyncio.run(start())
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(module, None)


def _with_agent(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("STATEKERNEL_STORE", None)
    return subprocess.run(
        [str(EXE), *args, "--agent", "approvals_agent:kernel_options"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_paused_run_is_listed_answered_and_sent_to(tmp_path: Path) -> None:
    (tmp_path / "approvals_agent.py").write_text(AGENT_MODULE)
    store = f"sqlite:///{tmp_path / 'app.db'}"
    _start(tmp_path, "approvals_agent", store, "pay-1")

    listed = ok(sk("runs", "list", "--state", "paused", "--store", store, cwd=tmp_path))
    assert "waiting for" in listed
    assert "approval: call call_0_0" in listed
    rows = as_json(
        sk("runs", "list", "--state", "paused", "--store", store, "--json", cwd=tmp_path)
    )
    assert [r["pause"]["reason"] for r in rows] == ["approval"]
    assert rows[0]["pause"]["metadata"] == {"call": "call_0_0", "input": {"amount": 50}}

    wrong = _with_agent(tmp_path, "runs", "resume", "pay-1", "--value", '{"approve": "x"}',
                        "--store", store)  # fmt: skip
    assert wrong.returncode == 0, wrong.stderr
    assert "paused" in wrong.stderr + wrong.stdout, "a wrong answer pauses it again"

    done = _with_agent(tmp_path, "runs", "resume", "pay-1", "--value",
                       '{"approve": "call_0_0"}', "--store", store)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = as_json(sk("runs", "show", "pay-1", "--store", store, "--json", cwd=tmp_path))
    assert shown["state"] == "completed"
    assert shown["turns"][0]["completed"][0]["output"] == "moved 50"

    sent = _with_agent(tmp_path, "runs", "send", "pay-1", "anything else?", "--store", store)
    assert sent.returncode == 0, sent.stderr
    assert "nothing else to move" in sent.stdout + sent.stderr
    shown = as_json(sk("runs", "show", "pay-1", "--store", store, "--json", cwd=tmp_path))
    assert shown["state"] == "completed"
    assert [m["role"] for m in shown["messages"]][-2:] == ["user", "assistant"]

    not_paused = _with_agent(tmp_path, "runs", "resume", "pay-1", "--value", "1",
                             "--store", store)  # fmt: skip
    assert not_paused.returncode == 2
    assert "Traceback" not in not_paused.stderr
    assert "completed" in not_paused.stderr


ASKING_MODULE = """
import statekernel as sk
from statekernel.testing import ScriptedProvider, call


def kernel_options():
    script = [call("ask_user", {"question": "How many seats?"}), "booked"]
    return {
        "tools": [sk.ask_user(answer_schema={"type": "integer", "minimum": 1})],
        "providers": {"scripted": ScriptedProvider(script)},
    }
"""


def test_a_question_is_listed_and_answered_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "asking_agent.py").write_text(ASKING_MODULE)
    store = f"sqlite:///{tmp_path / 'app.db'}"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200", "NO_COLOR": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(EXE), *args, "--store", store, "--agent", "asking_agent:kernel_options"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    _start(tmp_path, "asking_agent", store, "q-1")
    listed = ok(sk("runs", "list", "--state", "paused", "--store", store, cwd=tmp_path))
    assert "input_required: ask_user asks 'How many seats?'" in listed
    unanswered = cli("runs", "resume", "q-1")
    assert unanswered.returncode == 2
    assert "waits for an answer to 'How many seats?'" in unanswered.stderr
    wrong = cli("runs", "resume", "q-1", "--value", '"two"')
    assert wrong.returncode == 2
    assert "'two' is not of type 'integer'" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    done = cli("runs", "resume", "q-1", "--value", "2")
    assert done.returncode == 0, done.stderr
    shown = as_json(sk("runs", "show", "q-1", "--store", store, "--json", cwd=tmp_path))
    assert shown["state"] == "completed"
    assert shown["turns"][0]["completed"][0]["output"] == 2
