"""Every command the CLI suggests runs as printed: it carries the ``--store``, ``--agent``
and ``--queue`` the command was given, shell-quoted (the store's folder has a space in
its name here). Each hint is made to appear by a real process, then run by a shell."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import statekernel as sk
from statekernel.testing import ScriptedProvider

from .test_cli_runs import EXE

pytestmark = pytest.mark.skipif(
    EXE is None or sys.platform == "win32", reason="console script, POSIX signals"
)

GATE = '''
import os
import time

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


def _wait_for_gate() -> None:
    while not os.path.exists("gate"):  # the test opens the gate when it wants the call to end
        time.sleep(0.02)


@sk.tool(idempotent=True)
def fetch(what: str) -> str:
    """Fetch something (safe to run again)."""
    _wait_for_gate()
    return f"fetched {what}"


@sk.tool
def charge(amount: int) -> str:
    """Charge a card (must not run twice)."""
    _wait_for_gate()
    return f"charged {amount}"


def fetching():
    script = [call("fetch", {"what": "page"}), "Fetched."]
    return {"tools": [fetch, charge], "providers": {"scripted": ScriptedProvider(script)}}


def charging():
    script = [call("charge", {"amount": 5}), "Charged."]
    return {"tools": [fetch, charge], "providers": {"scripted": ScriptedProvider(script)}}
'''


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    env.update(NO_COLOR="1", PYTHONUNBUFFERED="1", COLUMNS="400")
    env["PATH"] = f"{Path(str(EXE)).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120
    )


def _popen(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(EXE), *args],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _shell(hint: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``hint`` as a person would paste it into a shell."""
    return subprocess.run(
        ["/bin/sh", "-c", hint], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120
    )


def _state(url: str, run_id: str) -> str:
    async def go() -> str:
        async with sk.Kernel(url) as kernel:
            return (await kernel.get(run_id)).state

    return asyncio.run(go())


def _started(url: str, run_id: str, tool: str) -> None:
    async def go() -> None:
        providers = {"scripted": ScriptedProvider(["unused"])}
        async with sk.Kernel(url, providers=providers) as kernel:
            await kernel.start(model="scripted/m", messages=[f"Use {tool}."], run_id=run_id)

    asyncio.run(go())


def _until_event(proc: subprocess.Popen[str], event_type: str) -> None:
    """Read the JSON lines of a drive until ``event_type`` (the event, not the clock)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line).get("type") == event_type:
            return
    assert proc.stderr is not None
    raise AssertionError(f"no {event_type}: {proc.stderr.read()}")


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, str]:
    """A working folder holding the agent module, and a store in a folder whose name
    needs quoting in a shell."""
    (tmp_path / "gate_agent.py").write_text(GATE)
    folder = tmp_path / "my runs"
    folder.mkdir()
    return tmp_path, f"sqlite:///{folder / 'runs.db'}"


def test_ctrl_c_hint_carries_store_and_agent(place: tuple[Path, str]) -> None:
    cwd, url = place
    _started(url, "r1", "fetch")
    argv = ["runs", "resume", "r1", "--store", url, "--agent", "gate_agent:fetching", "--json"]
    proc = _popen(*argv, cwd=cwd)
    try:
        _until_event(proc, "tool_call_started")
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        said = ""
        while "interrupted" not in said:
            said = proc.stderr.readline()
            assert said, "stderr ended before the interruption was told"
        (cwd / "gate").touch()  # the sync tool ends; the drive stops
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    hint = re.search(r"the run resumes with: (.*)\)$", said.strip())
    assert hint is not None, said
    assert "--agent gate_agent:fetching" in hint.group(1)
    done = _shell(hint.group(1), cwd)
    assert done.returncode == 0, (hint.group(1), done.stdout, done.stderr)
    assert _state(url, "r1") == "completed"


def test_uncertain_resolve_and_resume_hints_chain(place: tuple[Path, str]) -> None:
    cwd, url = place
    _started(url, "r2", "charge")
    argv = ["runs", "resume", "r2", "--store", url, "--agent", "gate_agent:charging", "--json"]
    proc = _popen(*argv, cwd=cwd)
    try:
        _until_event(proc, "tool_call_started")  # the charge's intent is committed
        proc.send_signal(signal.SIGKILL)  # a crash mid-call: the charge is uncertain
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    paused = _cli("runs", "resume", "r2", "--store", url, "--agent", "gate_agent:charging", cwd=cwd)
    assert paused.returncode == 0, paused.stderr
    rerun = [line.split("#")[0].strip() for line in paused.stdout.splitlines() if "--rerun" in line]
    assert len(rerun) == 1, paused.stdout
    assert "--agent gate_agent:charging" in rerun[0]
    resolved = _shell(rerun[0], cwd)
    assert resolved.returncode == 0, (rerun[0], resolved.stderr)
    resume = resolved.stdout.strip().rpartition("continue it with: ")[2]
    assert "--agent gate_agent:charging" in resume, resolved.stdout
    (cwd / "gate").touch()
    done = _shell(resume, cwd)
    assert done.returncode == 0, (resume, done.stdout, done.stderr)
    assert _state(url, "r2") == "completed"


@pytest.mark.parametrize("event", ["tool_call_started", "run_completed"])
def test_demo_crash_hint_runs_as_printed(place: tuple[Path, str], event: str) -> None:
    cwd, url = place
    crashed = _cli(
        "demo", "--model", "scripted/demo", "--crash-after", event, "--run-id", "d1",
        "--store", url, cwd=cwd,
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    flat = " ".join(crashed.stderr.split())
    if event == "run_completed":
        hint = flat.rpartition("nothing is left to resume (")[2].rpartition(").")[0]
        assert hint.startswith("statekernel runs show d1 --store "), flat
    else:
        hint = flat.rpartition("Finish the run with: ")[2]
    done = _shell(hint, cwd)
    assert done.returncode == 0, (hint, done.stdout, done.stderr)
    assert _state(url, "d1") == "completed"


def test_fork_hint_runs_as_printed(place: tuple[Path, str]) -> None:
    cwd, url = place
    demo = _cli("demo", "--model", "scripted/demo", "--run-id", "d2", "--store", url, cwd=cwd)
    assert demo.returncode == 0, demo.stderr
    forked = _cli("runs", "fork", "d2", "--at", "1", "--store", url, cwd=cwd)
    assert forked.returncode == 0, forked.stderr
    hint = forked.stdout.strip().rpartition("continue it with: ")[2]
    new_id = forked.stdout.split("-> ")[1].split()[0]
    done = _shell(hint, cwd)
    assert done.returncode == 0, (hint, done.stdout, done.stderr)
    assert _state(url, new_id) == "completed"


@pytest.mark.redis
def test_submit_hint_starts_a_worker_that_drives_the_run(
    tmp_path: Path, redis_store_url: str
) -> None:
    (tmp_path / "gate_agent.py").write_text(GATE)
    (tmp_path / "gate").touch()  # calls end at once here
    _started(redis_store_url, "q1", "fetch")
    given = ["--store", redis_store_url, "--queue", "nightly", "--agent", "gate_agent:fetching"]
    submitted = _cli("runs", "submit", "q1", *given, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted run q1" in submitted.stdout
    hint = submitted.stdout.strip().rpartition("a worker drives it: ")[2]
    assert "--queue nightly" in hint, hint
    worker = subprocess.Popen(
        ["/bin/sh", "-c", f"exec {hint}"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while _state(redis_store_url, "q1") != "completed":  # the worker's commits
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            assert time.monotonic() < deadline, "the worker never completed the run"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@pytest.mark.redis
def test_submit_refuses_an_unknown_run_and_a_bad_queue(
    tmp_path: Path, redis_store_url: str
) -> None:
    unknown = _cli("runs", "submit", "nope", "--store", redis_store_url, cwd=tmp_path)
    assert unknown.returncode == 2
    assert "'nope' not found" in unknown.stderr
    _started(redis_store_url, "q2", "fetch")
    bad = _cli("runs", "submit", "q2", "--queue", "a b", "--store", redis_store_url, cwd=tmp_path)
    assert bad.returncode == 2
    assert "invalid queue name" in bad.stderr


@pytest.mark.redis
def test_submit_with_a_delay_and_a_key_keeps_the_entry_aside(
    tmp_path: Path, redis_store_url: str
) -> None:
    _started(redis_store_url, "q3", "fetch")
    how = ["--delay", "3600", "--key", "tenant-1", "--key-limit", "2", "--json"]
    submitted = _cli("runs", "submit", "q3", "--store", redis_store_url, *how, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["entry"].startswith("waiting-")
    said = _cli("runs", "submit", "q3", "--store", redis_store_url, "--delay", "9", cwd=tmp_path)
    assert "to be taken in 9 s" in said.stdout
    bad = _cli("runs", "submit", "q3", "--store", redis_store_url, "--key-limit", "0", cwd=tmp_path)
    assert bad.returncode == 2


def test_submit_needs_a_store_with_queues(place: tuple[Path, str]) -> None:
    cwd, url = place
    _started(url, "s1", "fetch")
    refused = _cli("runs", "submit", "s1", "--store", url, cwd=cwd)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: the store ")
    assert "has no run queues" in refused.stderr
    assert "Traceback" not in refused.stderr
