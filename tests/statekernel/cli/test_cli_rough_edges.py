"""The command line tried as a new user would: suggested commands that work as printed,
JSON errors with --json, values that must be JSON, ids never cut, a taken run id named."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import socket
import subprocess
import sys
from pathlib import Path

import statekernel as sk
from statekernel.testing import ScriptedProvider, call

from .test_cli_runs import sk as command


def _shell(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a printed command line as a shell would, with this venv's console script."""
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(COLUMNS="200", NO_COLOR="1")
    return subprocess.run(
        line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_uncertain_pause_hint_works_as_printed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    crash = ("--crash-after", "tool_call_started:2", "--run-id", "r1")
    command("demo", "--model", "scripted/demo", *crash, "--store", url, cwd=tmp_path)
    paused = command("runs", "resume", "r1", "--store", url, cwd=tmp_path)
    assert "uncertain_tool_calls" in paused.stdout, paused.stderr
    again = command("runs", "resume", "r1", "--store", url, cwd=tmp_path)
    assert again.returncode == 2
    hint = again.stderr
    assert "CALL_ID" not in hint
    assert " | " not in hint
    lines = [line.strip().split("   #")[0] for line in hint.splitlines()]
    resolves = [line for line in lines if line.startswith("statekernel runs resolve")]
    assert len(resolves) == 3
    assert all("--agent" not in line and f"--store {url}" in line for line in resolves)
    assert "call_1_0" in resolves[0]
    error_line = next(line for line in resolves if "--error" in line)
    resolved = _shell(error_line, tmp_path)
    assert resolved.returncode == 0, resolved.stderr
    resume_line = hint.splitlines()[-1].split(": ", 1)[1]
    resumed = _shell(resume_line, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "completed" in resumed.stdout


def test_a_value_that_is_not_json_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    command("demo", "--model", "scripted/demo", "--run-id", "r1", "--store", url, cwd=tmp_path)
    refused = command("runs", "resume", "r1", "--value", "yes", "--store", url, cwd=tmp_path)
    assert refused.returncode == 2
    assert """--value 'yes' is not JSON: give text as a JSON string, --value '"yes"'""" in (
        refused.stderr
    )


def test_a_taken_run_id_already_exists_and_json_errors_are_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    args = ("demo", "--model", "scripted/demo", "--run-id", "r1", "--store", url)
    assert command(*args, cwd=tmp_path).returncode == 0
    taken = command(*args, cwd=tmp_path)
    assert taken.returncode == 2
    assert "error: run 'r1' already exists (at revision" in taken.stderr
    as_json = command(*args, "--json", cwd=tmp_path)
    assert as_json.returncode == 2
    error = json.loads(as_json.stderr.strip().splitlines()[-1])
    assert error["exit_code"] == 2
    assert error["error"].startswith("run 'r1' already exists")
    missing = command("runs", "show", "nope", "--json", "--store", url, cwd=tmp_path)
    assert json.loads(missing.stderr) == {"error": "run 'nope' not found", "exit_code": 2}
    usage = command("runs", "list", "--limit", "0", "--json", "--store", url, cwd=tmp_path)
    assert usage.returncode == 2
    assert "--limit" in json.loads(usage.stderr)["error"]


def test_runs_list_never_cuts_a_run_id_at_80_columns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    long_id = "customer-4711-support-conversation-" + "x" * 30
    command("demo", "--model", "scripted/demo", "--run-id", long_id, "--store", url, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    env.update(COLUMNS="80", LINES="24", NO_COLOR="1", TERM="xterm")
    exe = Path(sys.executable).parent / "statekernel"
    leader, follower = pty.openpty()  # a terminal 80 columns wide, as people have
    try:
        listed = subprocess.run(
            [str(exe), "runs", "list", "--store", url],
            cwd=tmp_path,
            env=env,
            stdin=follower,
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=120,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    assert listed.returncode == 0, listed.stderr
    assert long_id in b"".join(chunks).decode()


def test_a_run_of_unknown_tools_is_refused_without_leaving_a_kernel_open(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"

    @sk.tool
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    async def made() -> None:
        provider = ScriptedProvider([call("shout", {"text": "hi"}), "done"])
        async with sk.Kernel(url, tools=[shout], providers={"scripted": provider}) as kernel:
            await kernel.start(model="scripted/x", messages=["go"], run_id="app-1")
            async for _ in kernel.run("app-1"):
                pass

    asyncio.run(made())
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    args = ["runs", "send", "app-1", "more", "--store", url]
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-m", "statekernel", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "pass --agent package.module:function" in done.stderr
    assert "unclosed" not in done.stderr


def test_an_unknown_local_model_is_refused_before_a_run_exists(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    args = ("demo", "--model", "local/nonexistent", "--run-id", "r1", "--store", url)
    refused = command(*args, cwd=tmp_path)
    assert refused.returncode == 2
    assert "error: unknown local model 'nonexistent'" in refused.stderr
    shown = command("runs", "show", "r1", "--store", url, cwd=tmp_path)
    assert shown.returncode == 2  # no run (here not even a store: nothing was written)
    assert "run 'r1' not found" in shown.stderr or "does not exist" in shown.stderr


def test_an_unreachable_model_server_is_named_with_what_sets_it(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    env.update(OPENAI_API_KEY="k", OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", NO_COLOR="1")
    exe = Path(sys.executable).parent / "statekernel"
    args = ["demo", "--model", "openai/gpt-4o", "--store", f"sqlite:///{tmp_path}/runs.db"]
    done = subprocess.run(
        [str(exe), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    said = f"openai: cannot reach http://127.0.0.1:{port}/v1 (set by OPENAI_BASE_URL or base_url=)"
    assert said in " ".join(done.stdout.split())
