"""The stores on one host where Python has no ``fcntl`` (Windows, a POSIX Python built
without it): ``statekernel.stores._host.oslock`` takes byte-range locks there, and keeps the
promises of ``flock`` that the owner proofs and the file store's commit lock rest on.

Each check runs in a child process whose ``sitecustomize`` makes ``fcntl`` unimportable
before anything else is imported (its own children inherit that), so the locks are
``os.lockf``'s: the same code path as ``msvcrt``'s on Windows but for the OS call.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SEMANTICS = r"""
import os, subprocess, sys, tempfile, threading
from statekernel.stores._host import oslock as _oslock

PROBE = (
    "import os, sys\n"
    "from statekernel.stores._host import oslock as _oslock\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "print(_oslock.locked_elsewhere(fd))\n"
    "_oslock.close(fd)\n"
)

def seen(path):
    "Whether another process finds the file locked."
    done = subprocess.run(
        [sys.executable, "-c", PROBE, path], capture_output=True, text=True, check=True
    )
    return done.stdout.strip() == "True"

def opened(path):
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

path = os.path.join(tempfile.mkdtemp(), "lock")
a, b = opened(path), opened(path)
assert not seen(path)
assert _oslock.try_lock(a)
assert not _oslock.try_lock(b), "another open file of this process is excluded"
assert _oslock.locked_elsewhere(b)
assert seen(path), "and every other process"
reader = os.open(path, os.O_RDONLY)
assert _oslock.locked_elsewhere(reader), "a file opened read-only can test it"
_oslock.close(reader)
assert seen(path), "closing another open file of the file keeps the lock"
_oslock.close(a)
assert not seen(path), "closing the holder gives it back"

assert _oslock.try_lock(b, shared=True)
c = opened(path)
assert _oslock.try_lock(c, shared=True), "shared locks share"
d = opened(path)
assert not _oslock.locked_elsewhere(d), "no exclusive holder"
assert not _oslock.try_lock(d), "an exclusive taker is excluded by shared holders"
_oslock.close(b)
assert not _oslock.try_lock(d), "by each of them"
_oslock.unlock(c)
assert _oslock.try_lock(d)

events = []
def waiter():
    e = opened(path)
    _oslock.lock(e)
    events.append("taken")
    _oslock.close(e)
thread = threading.Thread(target=waiter)
thread.start()
events.append("released")
_oslock.unlock(d)
thread.join()
assert events == ["released", "taken"], events
assert not seen(path)
_oslock.close(c)
_oslock.close(d)
print(_oslock.BACKEND)
"""
"""Checks of the lock seam, run the same under ``flock`` and without ``fcntl``."""

SUITES = [
    "tests/stores/test_conformance.py",
    "tests/stores/test_holders.py",
    "tests/stores/test_processes.py",
]
SELECTED = "(file or sqlite) and not sigkill"
"""The conformance suite of the file and SQLite stores, a read-only reader that sees
another process's owner live then dead, and processes that race on one revision."""


def _without_fcntl(tmp_path: Path) -> dict[str, str]:
    """The environment of a child process that cannot import ``fcntl``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\n\nsys.modules['fcntl'] = None\n")
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**_SAFE_PATH, "PYTHONPATH": os.pathsep.join(paths)}


_SAFE_PATH = {**os.environ, "PYTHONSAFEPATH": "1"}
"""The environment of a child process run in the checkout: it and its own children
import the installed package, never the checkout's ``statekernel/`` folder (which lacks
``statekernel.stores`` and ``.providers``, installed from the top-level folders)."""


@pytest.mark.parametrize("fcntl", [True, False], ids=["flock", "no-fcntl"])
def test_the_locks_keep_flocks_promises(tmp_path: Path, fcntl: bool) -> None:
    env = dict(_SAFE_PATH) if fcntl else _without_fcntl(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", SEMANTICS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("flock" if fcntl else "lockf")


def test_the_file_and_sqlite_stores_pass_their_suites_without_fcntl(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", SELECTED]
    command += ["--basetemp", str(tmp_path / "runs"), *SUITES]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=_without_fcntl(tmp_path),
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    summary = re.search(r"(\d+) passed", output)
    assert summary is not None, output[-5000:]
    assert int(summary.group(1)) == 7, output[-2000:]
    assert "skipped" not in output.splitlines()[-1], output[-2000:]
