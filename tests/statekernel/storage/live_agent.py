"""The agent of the live-events worker test, loaded by ``statekernel worker --agent
live_agent:make`` (with this folder on ``PYTHONPATH``): the run's first turn calls
``hold``, which waits for a line on the named pipe ``SK_LIVE_PIPE``; the second streams
``live_driver.ANSWER`` in deltas of 4 characters."""

from __future__ import annotations

import asyncio
import os
import runpy
from pathlib import Path
from typing import Any

import statekernel as sk
from statekernel.testing import Reply, ScriptedProvider, call

ANSWER: str = runpy.run_path(str(Path(__file__).with_name("live_driver.py")))["ANSWER"]


def make() -> dict[str, Any]:
    """Kernel options for the worker."""
    pipe = Path(os.environ["SK_LIVE_PIPE"])

    @sk.tool
    async def hold() -> str:
        """Wait for the test's line on the pipe."""
        return (await asyncio.to_thread(pipe.read_text)).strip()

    provider = ScriptedProvider([call("hold", {}), Reply(text=ANSWER, chunk=4)])
    return {"tools": [hold], "providers": {"scripted": provider}}
