"""``statekernel ui``: serves the web view of a store on loopback, read-only without
--agent, and refuses a store that does not exist."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from statekernel._cli.ui import _loopback

from ..web.runs_made import make_runs
from ..web.serving import free_port
from .test_cli_runs import EXE, sk

pytestmark = pytest.mark.skipif(
    EXE is None, reason="the statekernel console script is not installed"
)
WEB_TESTS = Path(__file__).resolve().parent.parent / "web"


def serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """``statekernel ui ARGS`` on a free port; the process and its base URL, once it
    answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    env["PYTHONPATH"] = str(WEB_TESTS)
    proc = subprocess.Popen(
        [str(EXE), "ui", *args, "--port", str(port)],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            httpx.get(base + "/", timeout=5)
            return proc, base
        except httpx.TransportError:
            assert time.monotonic() < deadline, "statekernel ui did not answer in 60 s"
            time.sleep(0.1)


def stop(proc: subprocess.Popen[str]) -> str:
    """Stop the server; what it printed on stderr."""
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    return err


def test_ui_serves_the_store_read_only_without_an_agent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    proc, base = serve(tmp_path, "--store", url)
    try:
        listed = httpx.get(base + "/").text
        assert "asking" in listed
        page = httpx.get(base + "/runs/asking").text
        assert "read-only: no agent was given" in page
        rebound = httpx.get(base + "/", headers={"host": "attacker.example"})
        assert rebound.status_code == 400, "a name another site resolves to loopback"
        assert httpx.get(f"http://localhost:{base.rsplit(':', 1)[1]}/").status_code == 200
    finally:
        err = stop(proc)
    assert f"on {base}/ (read-only: no --agent)" in err
    assert "warning" not in err


def test_ui_acts_with_an_agent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    proc, base = serve(tmp_path, "--store", url, "--agent", "web_agent:kernel_options")
    try:
        page = httpx.get(base + "/runs/asking").text
        assert "read-only" not in page
        assert 'action="' + base + '/runs/asking/answer"' in page
    finally:
        err = stop(proc)
    assert "read-only" not in err


def test_ui_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    done = sk("ui", "--store", f"sqlite:///{tmp_path}/nothing.db", cwd=tmp_path)
    assert done.returncode == 2
    assert "no SQLite store" in done.stderr
    assert not (tmp_path / "nothing.db").exists()


def test_only_loopback_addresses_count_as_loopback() -> None:
    assert _loopback("127.0.0.1")
    assert _loopback("::1")
    assert _loopback("localhost")
    assert not _loopback("0.0.0.0")
    assert not _loopback("192.168.1.2")
    assert not _loopback("example.org")
