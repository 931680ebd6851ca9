"""Ctrl-C while a drive waits for a long tool: it says what it waits for; a second exits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import statekernel as sk
from statekernel.testing import ScriptedProvider

AGENT = '''
import time

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool
def slow_export(seconds: int) -> str:
    """Export, slowly."""
    time.sleep(seconds)
    return "exported"


def options():
    model = ScriptedProvider([call("slow_export", {"seconds": 600}), "Exported."])
    return {"tools": [slow_export], "providers": {"scripted": model}}
'''


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_says_what_it_waits_for_and_a_second_exits(tmp_path: Path) -> None:
    (tmp_path / "exporter.py").write_text(AGENT)
    store = f"sqlite:///{tmp_path / 'runs.db'}"

    async def start() -> str:
        providers = {"scripted": ScriptedProvider(["unused"])}
        async with sk.Kernel(store, providers=providers) as kernel:
            run = await kernel.start(model="scripted/m", messages=["Export."], run_id="exp")
            return run.run_id

    run_id = asyncio.run(start())
    exe = Path(sys.executable).with_name("statekernel")
    env = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
    argv = [str(exe), "runs", "resume", run_id, "--store", store]
    argv += ["--agent", "exporter:options", "--json"]
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        for line in proc.stdout:  # wait for the event, not for the clock
            if json.loads(line).get("type") == "tool_call_started":
                break
        else:
            raise AssertionError(f"no tool_call_started: {proc.stderr.read()}")
        proc.send_signal(signal.SIGINT)
        said = ""
        while "interrupted" not in said:  # what it printed before (resuming ...) first
            said = proc.stderr.readline()
            assert said, "stderr ended before it said what it waits for"
        assert f"interrupted: stopping run {run_id}" in said
        assert "slow_export" in said, said
        assert f"statekernel runs resume {run_id}" in said
        assert proc.poll() is None, "the first Ctrl-C waits for the tool"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
