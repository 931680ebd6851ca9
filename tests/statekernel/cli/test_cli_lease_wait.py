"""``statekernel runs resume`` on a run another process holds says, on stderr, that it
waits for the lease: who holds it and for how long at most, even when the application
(``--agent``) set its logging to errors only (``stall_driver.py`` holds the run; on Redis
it is killed with SIGKILL, and its lease lives on until it expires)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..kernel.test_stalled_owner import created, url_of
from .test_cli_runs import EXE

DRIVER = Path(__file__).parents[1] / "kernel" / "stall_driver.py"

PAYER = '''
import logging

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool
async def pay(to: str, amount: int) -> str:
    """Pay someone (not idempotent)."""
    return f"paid {amount} to {to}"


logging.basicConfig(level=logging.ERROR)  # an application that keeps its logs quiet


def options():
    script = [call("pay", {"to": "bob", "amount": 5}), "paid"]
    return {"tools": [pay], "providers": {"scripted": ScriptedProvider(script)}}
'''

pytestmark = pytest.mark.skipif(
    EXE is None or sys.platform == "win32", reason="console script, POSIX signals"
)


def _resume(run_id: str, url: str, cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    env.update(NO_COLOR="1", PYTHONUNBUFFERED="1", COLUMNS="200")
    argv = [str(EXE), "runs", "resume", run_id, "--store", url, "--agent", "payer:options"]
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _waiting_line(proc: subprocess.Popen[str]) -> str:
    """The first line of stderr that says the command waits (read as it is printed)."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        if "waiting" in line:
            return line
        seen.append(line)
    raise AssertionError(f"no waiting line (exit {proc.wait()}): {''.join(seen)}")


@pytest.mark.parametrize(
    ("kind", "kill"),
    [
        ("sqlite", False),
        pytest.param("redis", True, marks=pytest.mark.redis),
        pytest.param("postgres", False, marks=pytest.mark.postgres),
    ],
)
def test_resume_says_it_waits_for_the_owner(
    kind: str, kill: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "payer.py").write_text(PAYER)
    url = url_of(kind, tmp_path, request)
    run_id = asyncio.run(created(url))
    ttl = "8" if kill else "30"  # a killed owner's lease lives on this long (Redis)
    holder = subprocess.Popen(
        [sys.executable, str(DRIVER), "hold", url, str(tmp_path / "ledger"), run_id, ttl, "5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None
    assert holder.stdout is not None
    resume = None
    try:
        assert holder.stdout.readline().strip() == "INTENT"  # it holds the run, mid-call
        if kill:
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
        resume = _resume(run_id, url, tmp_path)
        said = _waiting_line(resume)
        assert f"run {run_id} is held by " in said, said
        assert "waiting up to 20 s for it" in said, said
        if not kill:
            holder.stdin.write("go\n")
            holder.stdin.flush()
        out, err = resume.communicate(timeout=120)
        assert resume.returncode == 0, (out, err)
        assert "Traceback" not in err
        # the live owner finished the run; the dead one's call is left uncertain
        assert ("paused at revision" in out) if kill else ("completed at revision" in out), out
    finally:
        for proc in (holder, resume):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    if not kill:
        assert json.loads(holder.stdout.read().strip().splitlines()[-1])["state"] == "completed"
