"""The checked-in lifecycle diagrams match the lifecycle class; run traces count right."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import statekernel as sk
from statekernel._lifecycle.diagram import (
    can_render_svg,
    lifecycle_dot,
    lifecycle_graph,
    lifecycle_mermaid,
    write_diagrams,
)
from statekernel._lifecycle.trace import trace_events
from statekernel.testing import ScriptedProvider, call

DIAGRAMS = Path(__file__).resolve().parents[3] / "diagrams"
HAS_DOT = can_render_svg()  # graphviz's dot, or the pygraphviz wheel


@pytest.mark.parametrize("fmt", ["mmd", "dot"])
def test_checked_in_diagrams_do_not_drift(tmp_path: Path, fmt: str) -> None:
    (fresh,) = write_diagrams(tmp_path, [fmt])
    checked_in = DIAGRAMS / fresh.name
    assert checked_in.is_file(), f"{checked_in} is missing: run `statekernel diagram`"
    assert fresh.read_text() == checked_in.read_text(), (
        f"{checked_in.name} is out of date: run `statekernel diagram` and commit diagrams/"
    )


def test_checked_in_svg_parses() -> None:
    root = ET.parse(DIAGRAMS / "run_lifecycle.svg").getroot()
    assert root.tag.endswith("svg")
    assert "PreparingTurn" in ET.tostring(root, encoding="unicode")


def test_generation_is_deterministic() -> None:
    assert lifecycle_dot() == lifecycle_dot()
    assert lifecycle_mermaid() == lifecycle_mermaid()


def test_graph_has_every_state_and_transition() -> None:
    graph = lifecycle_graph()
    assert [sid for sid, _ in graph.states] == list(sk.STATE_IDS)
    assert graph.initial == "init"
    events = {t.event for t in graph.transitions}
    assert events == {
        "start", "turn_prepared", "model_started", "early_call_started", "model_completed",
        "answer_cut_off", "tool_call_started", "tool_call_completed", "tools_completed",
        "pause", "resume", "fail", "cancel", "retry", "input",
    }  # fmt: skip
    internal = {t.event for t in graph.transitions if t.internal}
    assert internal == {
        "model_started", "early_call_started", "tool_call_started", "tool_call_completed"
    }  # fmt: skip


@pytest.mark.skipif(not HAS_DOT or shutil.which("statekernel") is None, reason="needs dot")
def test_diagram_command_writes_and_checks(tmp_path: Path) -> None:
    exe = str(shutil.which("statekernel"))
    out = tmp_path / "d"
    done = subprocess.run([exe, "diagram", "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "run_lifecycle.dot", "run_lifecycle.mmd", "run_lifecycle.svg",
    ]  # fmt: skip
    ET.parse(out / "run_lifecycle.svg")
    check = subprocess.run([exe, "diagram", "--check", "-o", str(out)], capture_output=True)
    assert check.returncode == 0
    (out / "run_lifecycle.mmd").write_text("stale\n")
    stale = subprocess.run([exe, "diagram", "--check", "-o", str(out)], capture_output=True)
    assert stale.returncode == 1


@pytest.mark.skipif(shutil.which("statekernel") is None, reason="needs the installed command")
def test_without_graphviz_the_command_writes_the_text_formats_and_says_so(
    tmp_path: Path,
) -> None:
    """No dot on PATH and no pygraphviz: .mmd and .dot are written, .svg is skipped
    with a note, and the command succeeds."""
    exe = str(shutil.which("statekernel"))
    bare = tmp_path / "bin"  # a PATH with the command and without graphviz's dot
    bare.mkdir()
    (bare / "statekernel").symlink_to(exe)
    hiding = tmp_path / "hide"  # and no pygraphviz wheel either
    hiding.mkdir()
    (hiding / "pygraphviz.py").write_text("raise ImportError('hidden')\n")
    out = tmp_path / "d"
    done = subprocess.run(
        [exe, "diagram", "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        env={"PATH": str(bare), "PYTHONPATH": str(hiding)},
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["run_lifecycle.dot", "run_lifecycle.mmd"]
    assert json.loads(done.stdout)["skipped"] == ["svg"]
    assert "skipped run_lifecycle.svg: graphviz's 'dot' is not installed" in done.stderr


@sk.tool(idempotent=True)
def echo(text: str) -> str:
    """Echo the text."""
    return text


async def test_trace_counts_a_run_with_a_pause_and_a_resume() -> None:
    model = ScriptedProvider([call("echo", {"text": "a"}), [call("echo", {"text": "b"})], "done"])
    async with sk.Kernel("memory://", tools=[echo], providers={"s": model}, max_turns=2) as k:
        run = await k.start(model="s/m", messages=["go"])
        _ = [e async for e in k.run(run.run_id)]
        assert (await k.get(run.run_id)).pause is not None  # max_turns
        await k.resume(run.run_id, max_turns=5)
        _ = [e async for e in k.run(run.run_id)]
        final = await k.get(run.run_id)
        trace = trace_events(await k.events(run.run_id), current=final.state)
    assert trace.current == "completed"
    assert trace.transitions[("init", "preparing_turn", "start")] == 1
    assert trace.transitions[("preparing_turn", "calling_model", "turn_prepared")] == 3
    assert trace.transitions[("calling_model", "calling_model", "model_started")] == 3
    assert trace.transitions[("dispatching_tools", "dispatching_tools", "tool_call_started")] == 2
    assert trace.transitions[("preparing_turn", "paused", "pause")] == 1
    assert trace.transitions[("paused", "preparing_turn", "resume")] == 1
    assert trace.transitions[("calling_model", "completed", "model_completed")] == 1
    assert trace.state_visits["preparing_turn"] == 4  # start, two tools_completed, resume
    assert trace.state_visits["completed"] == 1
    assert "failed" not in trace.state_visits
