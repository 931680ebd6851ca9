"""``statekernel ui``: serves the web view of a store on loopback, read-only without
--agent, answering only the names it was given; off loopback it acts only with an
authorize hook or when told anyone may; it refuses a store that does not exist."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from statekernel._cli.ui import _loopback
from statekernel.web.security import COOKIE

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
        assert 'action="/runs/asking/answer?csrf_token=' in page, "a path, not the Host's URL"
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


def test_ui_refuses_to_let_anyone_act_off_loopback(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    for host in ("0.0.0.0", "::", "192.168.1.2"):
        done = sk(
            "ui", "--store", url, "--agent", "web_agent:kernel_options", "--host", host,
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert f"--host {host} is not a loopback address" in done.stderr
        assert "--authorize package.module:function" in done.stderr
        assert "--allow-anyone-to-act" in done.stderr


def test_ui_off_loopback_acts_as_its_authorize_hook_says(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    proc, base = serve(
        tmp_path, "--store", url, "--agent", "web_agent:kernel_options", "--host", "0.0.0.0",
        "--authorize", "web_agent:only_viewing", "--allowed-host", "runs.test",
    )  # fmt: skip
    try:
        with httpx.Client(base_url=base) as browser:
            assert "asking" in browser.get("/runs/asking").text
            named = browser.get("/", headers={"host": "runs.test:8000"})
            assert named.status_code == 200
            other = browser.get("/", headers={"host": "other.test"})
            assert other.status_code == 400
            token = browser.cookies[COOKIE]
            refused = browser.post(f"/runs/asking/answer?csrf_token={token}", data={"value": "2"})
            assert refused.status_code == 403
            assert "not allowed: answer on run asking" in refused.text
    finally:
        err = stop(proc)
    assert "--authorize web_agent:only_viewing decides each page and action" in err
    assert "answering requests addressed to: localhost, 127.0.0.1, [::1], runs.test" in err
    assert "warning" not in err


def test_ui_lets_anyone_act_when_told_and_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    proc, base = serve(
        tmp_path, "--store", url, "--agent", "web_agent:kernel_options", "--host", "0.0.0.0",
        "--allow-anyone-to-act",
    )  # fmt: skip
    try:
        assert 'action="/runs/asking/answer?csrf_token=' in httpx.get(base + "/runs/asking").text
    finally:
        err = stop(proc)
    assert "warning: listening on 0.0.0.0, not on loopback" in err
    assert "act on them (--allow-anyone-to-act)" in err
    assert "refused (400) until given with --allowed-host" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--allowed-host", "*"), "--allowed-host: '*' is not a host name"),
        (("--allowed-host", "runs.test:80"), "is not a host name or address"),
        (("--authorize", "nothing_here"), "--authorize must look like package.module:function"),
        (("--authorize", "no_such_module:f"), "cannot load --authorize 'no_such_module:f'"),
    ],
)
def test_ui_refuses_options_it_cannot_use(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    done = sk("ui", "--store", url, *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr


def test_ui_limits_the_connections_it_serves_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    proc, base = serve(tmp_path, "--store", url)
    try:
        with (  # live pages hold a connection each: well within the default
            httpx.stream("GET", base + "/stream", timeout=60) as first,
            httpx.stream("GET", base + "/stream", timeout=60) as second,
        ):
            assert next(first.iter_lines()) == "event: hello"
            assert next(second.iter_lines()) == "event: hello"
            assert httpx.get(base + "/").status_code == 200
    finally:
        stop(proc)
    proc, base = serve(tmp_path, "--store", url, "--limit-concurrency", "1")
    try:  # one connection at a time: the one asking is already one
        busy = httpx.get(base + "/")
        assert busy.status_code == 503
        assert "asking" not in busy.text
    finally:
        stop(proc)
