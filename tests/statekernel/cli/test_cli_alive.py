"""``statekernel runs list`` and ``runs show`` say who drives a run that is not at rest:
the live owner while its process lives, and that the owner is gone once the process
is SIGKILLed (with the revision it was lost after); read without writing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from asyncio.subprocess import PIPE, Process
from pathlib import Path

import pytest

from statekernel.stores import SQLiteStore

from .test_cli_runs import EXE, ok, sk

DRIVER = Path(__file__).with_name("follow_driver.py")
WAIT = 60.0
"""Seconds the driver may take to reach its tool (a bound, never a pause)."""

pytestmark = pytest.mark.skipif(
    EXE is None, reason="the statekernel console script is not installed"
)


async def _until(proc: Process, word: str) -> None:
    """Read ``proc``'s stdout until a line starts with ``word``."""
    assert proc.stdout is not None
    while line := await proc.stdout.readline():
        if line.decode().startswith(word):
            return
    raise AssertionError(f"the driver ended before {word}")


async def _head_revision(url: str, run_id: str) -> int:
    store = SQLiteStore(url, read_only=True)
    try:
        return (await store.load(run_id)).revision
    finally:
        await store.aclose()


async def command(*args: str, cwd: Path) -> str:
    """The output of ``statekernel *args`` (status 0), run off the test's loop."""
    return ok(await asyncio.to_thread(sk, *args, cwd=cwd))


async def test_list_and_show_tell_a_live_owner_from_a_gone_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    pipe = tmp_path / "go"
    os.mkfifo(pipe)  # never written: the driver's tool waits until it is killed
    args = [str(DRIVER), url, "held", str(pipe)]
    driver = await asyncio.create_subprocess_exec(sys.executable, *args, stdout=PIPE)
    owner = f"{socket.gethostname()}/{driver.pid}/"
    try:
        await asyncio.wait_for(_until(driver, "HOLDING"), WAIT)
        listed = await command("runs", "list", "--store", url, cwd=tmp_path)
        assert "owner" in listed
        assert f"driven by {owner}" in listed
        shown = await command("runs", "show", "held", "--store", url, cwd=tmp_path)
        assert f"driven by {owner}" in shown
        assert "lost after" not in shown

        driver.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(driver.wait(), WAIT) == -signal.SIGKILL
        revision = await _head_revision(url, "held")
        listed = await command("runs", "list", "--store", url, cwd=tmp_path)
        assert f"owner gone: {owner}" in listed
        assert "(its process is gone)" in listed
        assert "driven by" not in listed
        shown = await command("runs", "show", "held", "--store", url, cwd=tmp_path)
        assert f"owner gone: {owner}" in shown
        assert f"lost after revision {revision} (its process is gone)" in shown
        assert f"statekernel runs resume held --store {url}" in shown
        old = await command("runs", "show", "held", "--revision", "0", "--store", url, cwd=tmp_path)
        assert "owner gone" not in old  # an old revision: what is alive now is the head's
        rows = json.loads(await command("runs", "list", "--store", url, "--json", cwd=tmp_path))
        assert [r["run_id"] for r in rows] == ["held"]
    finally:
        if driver.returncode is None:
            driver.kill()
            await driver.wait()


def test_a_run_at_rest_has_no_owner_column(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    ok(sk("demo", "--model", "scripted/demo", "--store", url, "--run-id", "done", cwd=tmp_path))
    listed = ok(sk("runs", "list", "--store", url, cwd=tmp_path))
    assert "done" in listed
    assert "owner" not in listed
    assert "owner" not in ok(sk("runs", "show", "done", "--store", url, cwd=tmp_path))
