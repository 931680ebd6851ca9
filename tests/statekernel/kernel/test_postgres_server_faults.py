"""The PostgreSQL server dies under running drivers: SIGKILLed with all its processes (a
host crash, as far as the server knows) or stopped at once (``pg_ctl stop -m
immediate``), then started again on the same data. Driver processes (``kill_worker.py``)
drive runs whose tools append to an fsynced ledger; a driver that the outage stopped is
started again once the server is back. Checked from outside: no acknowledged revision
lost, no non-idempotent call executed twice, every run completes (the driver resolves a
run paused ``uncertain_tool_calls`` from the ledger, as an operator would).

The server is the test's own (fsync on), from ``initdb``/``pg_ctl`` on ``PATH`` or in
``/usr/lib/postgresql/*/bin`` (run as root: as the ``postgres`` user); without them the
test is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from statekernel.testing._servers import free_port

from ...conftest import _pg_ready
from .test_process_kills import _check_ledger, _check_run, _load, read_acks, spawn, wait_ready

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

DRIVERS = 4
"""Runs driven at once, each by a process of its own."""


def _binaries() -> tuple[str, str] | None:
    """``initdb`` and ``pg_ctl``: on ``PATH``, else the newest of the machine's
    PostgreSQL installations."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return initdb, pg_ctl
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(f"{folder}/initdb", os.X_OK) and os.access(f"{folder}/pg_ctl", os.X_OK):
            return f"{folder}/initdb", f"{folder}/pg_ctl"
    return None


class OwnedServer:
    """A PostgreSQL server of this test alone, in ``folder``, that it can kill and start."""

    def __init__(self, folder: Path, initdb: str, pg_ctl: str, prefix: list[str]) -> None:
        self.folder, self.pg_ctl, self.prefix = folder, pg_ctl, prefix
        self.data = folder / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        args = [*prefix, initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust"]
        subprocess.run([*args, "-E", "UTF8"], check=True, capture_output=True)

    def start(self) -> None:
        """Start the server (recovering from its WAL after a crash); return once it answers."""
        options = f"-p {self.port} -h 127.0.0.1 -k {self.folder} -c fsync=on"
        options += " -c synchronous_commit=on -c max_connections=100"
        log = str(self.folder / "log")
        start = [*self.prefix, self.pg_ctl, "-D", str(self.data), "-l", log, "-o", options]
        subprocess.run([*start, "-w", "start"], check=True, capture_output=True)
        _pg_ready(self.url)

    def stop_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: every server process quits without a checkpoint."""
        stop = [*self.prefix, self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        subprocess.run(stop, check=False, capture_output=True)

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, at once."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [postmaster, *_children(postmaster)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() < deadline, "the server's processes outlived SIGKILL"
            time.sleep(0.02)


def _children(parent: int) -> list[int]:
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.split("/")[2]))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def owned_server() -> Iterator[OwnedServer]:
    """A fresh server of the test's own, started (in a folder the server's user can
    reach: pytest's own temporary folders are the test user's alone)."""
    found = _binaries()
    if found is None:
        pytest.skip("no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin")
    prefix: list[str] = []
    with tempfile.TemporaryDirectory(prefix="statekernel-pgfaults-") as name:
        folder = Path(name)
        os.chmod(folder, 0o755)
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("run as root without a postgres user to run the server as")
            if runuser is None:
                pytest.skip("run as root without runuser")
            prefix = [runuser, "-u", "postgres", "--"]
            os.chown(folder, user.pw_uid, user.pw_gid)
        server = OwnedServer(folder, *found, prefix)
        server.start()
        try:
            yield server
        finally:
            server.stop_immediately()


def _ledger_lines(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("fault", ["sigkill", "immediate_stop"])
def test_the_server_dies_under_running_drivers(
    fault: str, owned_server: OwnedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SK_KILL_MODEL_DELAY", "0.05")  # the drivers' runs last 0.35 s or more
    url = f"{owned_server.url}?schema=faults"
    runs = {uuid.uuid4().hex: tmp_path / f"ledger-{n}.log" for n in range(DRIVERS)}
    acked = dict.fromkeys(runs, -1)
    procs = {run_id: spawn(url, run_id, log) for run_id, log in runs.items()}
    early = {run_id: wait_ready(proc) for run_id, proc in procs.items()}
    # every driver has executed a tool: runs are mid-way (the bound only ends a failing
    # test: four drivers starting on a loaded machine may take long)
    deadline = time.monotonic() + 300
    while not all(_ledger_lines(log) >= 1 for log in runs.values()):
        assert time.monotonic() < deadline, "the drivers made no progress"
        time.sleep(0.01)
    if fault == "sigkill":
        owned_server.kill()
    else:
        owned_server.stop_immediately()
    outcomes = {}
    for run_id, proc in procs.items():  # each driver ends: done already, or failed
        out, err = proc.communicate(timeout=300)
        acked[run_id] = read_acks("".join(early[run_id]) + out)
        outcomes[run_id] = proc.returncode
    assert any(code != 0 for code in outcomes.values()), "the outage stopped no driver"
    owned_server.start()
    for run_id, log in runs.items():
        head = asyncio.run(_load(url, run_id))
        assert head.revision >= acked[run_id], (
            f"acknowledged r{acked[run_id]} lost: the head is at r{head.revision}"
        )
        for _ in range(5):  # a driver started again finishes the run
            if head.state == "completed":
                break
            proc = spawn(url, run_id, log)
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            head = asyncio.run(_load(url, run_id))
        asyncio.run(_check_run(url, run_id, log))
        _check_ledger(run_id, log)
