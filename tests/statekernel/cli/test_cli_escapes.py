"""Model output is data in the terminal too: escape sequences a model (or a tool's
result) writes are shown escaped by every human-readable command, never sent raw."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from statekernel._front.visible import visible

from .test_cli_runs import EXE, as_json, ok, sk

pytestmark = pytest.mark.skipif(
    EXE is None, reason="the statekernel console script is not installed"
)

CLEAR = "\x1b[2J"
TITLE = "\x1b]0;title\x07"
LINK = "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\"
EVIL = f"a{CLEAR}b{TITLE}c{LINK}d\x9b31me\u202ef [bold]markup[/bold] :smile:"
"""Clears the screen, retitles the window, links elsewhere than it says, a C1 CSI, a
right-to-left override, rich markup and an emoji code."""

AGENT_MODULE = f"""
import statekernel as sk
from statekernel.testing import ScriptedProvider, call
from statekernel.providers import Reply

EVIL = {EVIL!r}


@sk.tool
def look(q: str, ctx: sk.ToolContext) -> str:
    \"\"\"Look something up.\"\"\"
    ctx.report(EVIL)
    return "found " + EVIL


@sk.tool
def boom(q: str) -> str:
    \"\"\"Fail.\"\"\"
    raise RuntimeError(EVIL)


@sk.tool
def ask(q: str) -> str:
    \"\"\"Ask someone.\"\"\"
    return "asked"


class Asking(sk.Hooks):
    def on_tool_call_started(self, run, call):
        if call.name == "ask" and run.resume_value is None:
            return sk.Pause("approval", {{"name": EVIL, "question": EVIL, "call": call.id}})
        return None


def kernel_options():
    script = [
        Reply(
            reasoning=EVIL,
            text=EVIL,
            tool_calls=(
                call("look", {{"q": EVIL}}, id="id" + EVIL),
                call("boom", {{"q": EVIL}}),
                call("no" + EVIL, {{"q": EVIL}}),
            ),
            chunk=5,
        ),
        call("ask", {{"q": EVIL}}),
        Reply(text="done " + EVIL, chunk=5),
        Reply(reasoning=EVIL, text=EVIL + "\\nline two", chunk=5),
    ]
    return {{
        "tools": [look, boom, ask],
        "hooks": Asking(),
        "providers": {{"scripted": ScriptedProvider(script)}},
    }}
"""

_RAW = {*range(0x00, 0x20), *range(0x7F, 0xA0), 0x202E} - {0x0A}
"""What no human-readable output may hold (newlines may stay as layout)."""


def _shown_safely(text: str) -> str:
    raw = sorted({hex(ord(c)) for c in text if ord(c) in _RAW})
    assert not raw, f"raw control characters printed: {raw}\n{text!r}"
    assert "\\x1b" in text
    return text


def _agent(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("STATEKERNEL_STORE", None)
    done = subprocess.run(
        [str(EXE), *args, "--agent", "evil_agent:kernel_options"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout + done.stderr


def _start(tmp_path: Path, store: str) -> None:
    async def start() -> None:
        import statekernel as statek
        from statekernel.testing import ScriptedProvider

        providers = {"scripted": ScriptedProvider([])}
        async with statek.Kernel(store, providers=providers) as kernel:
            await kernel.start(model="scripted/app", messages=[EVIL], run_id="evil")

    asyncio.run(start())


def test_visible_escapes_what_moves_the_cursor() -> None:
    assert visible(EVIL) == (
        "a\\x1b[2Jb\\x1b]0;title\\x07c\\x1b]8;;http://evil\\x1b\\click\\x1b]8;;\\x1b\\"
        "d\\x9b31me\\u202ef [bold]markup[/bold] :smile:"
    )
    assert visible("one\ntwo\tthree\r") == "one\\x0atwo\\x09three\\x0d"
    assert visible("one\ntwo\tthree\r", layout=True) == "one\ntwo\tthree\\x0d"
    assert visible("\u2067\u2028\x7f\x85") == "\\u2067\\u2028\\x7f\\x85"
    assert visible("caf\u00e9 \u2192 \U0001f600") == "caf\u00e9 \u2192 \U0001f600"


def test_model_output_is_shown_escaped_by_every_command(tmp_path: Path) -> None:
    (tmp_path / "evil_agent.py").write_text(AGENT_MODULE)
    store = f"sqlite:///{tmp_path / 'app.db'}"
    _start(tmp_path, store)

    live = _shown_safely(_agent(tmp_path, "runs", "resume", "evil", "--store", store))
    assert "[bold]markup[/bold] :smile:" in live  # rich markup and emoji codes stay text
    assert "paused" in live

    listed = _shown_safely(ok(sk("runs", "list", "--store", store, cwd=tmp_path)))
    assert "approval" in listed
    shown = _shown_safely(ok(sk("runs", "show", "evil", "--store", store, cwd=tmp_path)))
    for word in ("look", "boom", "unknown tool", "[bold]markup[/bold]", "\\u202e"):
        assert word in shown

    answered = _agent(tmp_path, "runs", "resume", "evil", "--value", "1", "--store", store)
    assert "done a\\x1b[2J" in _shown_safely(answered)  # the answer in the summary line
    sent = _shown_safely(_agent(tmp_path, "runs", "send", "evil", "again", "--store", store))
    assert "line two" in sent

    events = _shown_safely(ok(sk("runs", "events", "evil", "--store", store, cwd=tmp_path)))
    assert "tool_call_started" in events
    full = ok(sk("runs", "show", "evil", "--full", "--store", store, cwd=tmp_path))
    _shown_safely(full)
    tree = ok(sk("runs", "tree", "evil", "--store", store, cwd=tmp_path))
    assert "evil" in tree

    # --json keeps the data exactly as stored
    data = as_json(sk("runs", "show", "evil", "--store", store, "--json", cwd=tmp_path))
    assert data["messages"][0]["content"][0]["text"] == EVIL
    names = [c["name"] for t in data["turns"] for c in t.get("completed", [])]
    assert "no" + EVIL in names
    lines = ok(sk("runs", "events", "evil", "--store", store, "--json", cwd=tmp_path))
    assert any(json.loads(line)["data"].get("name") == "no" + EVIL for line in lines.splitlines())
    assert "\\u001b" in lines  # JSON's own escape
    # and what JSON leaves raw that a terminal acts on (a C1 CSI, a bidi override) is
    # escaped too: the same JSON value, safe to print
    shown_json = ok(sk("runs", "show", "evil", "--store", store, "--json", cwd=tmp_path))
    for printed in (lines, shown_json):
        assert "\x9b" not in printed, "a raw C1 CSI in --json"
        assert "\u202e" not in printed, "a raw right-to-left override in --json"
        assert "\\u009b" in printed
        assert "\\u202e" in printed
    assert json.loads(shown_json)["messages"][0]["content"][0]["text"] == EVIL
