"""``runs events --follow`` prints the live events (text deltas) of a run that another
process drives, on the stores with a feed (Redis, PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

from .test_cli_runs import EXE

DRIVER = Path(__file__).resolve().parent.parent / "storage" / "live_driver.py"
ANSWER: str = runpy.run_path(str(DRIVER))["ANSWER"]


async def test_follow_prints_the_deltas_of_a_run_driven_elsewhere(
    feed_store_url: str, tmp_path: Path
) -> None:
    pipe = tmp_path / "go"
    os.mkfifo(pipe)
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    driver = await asyncio.create_subprocess_exec(
        sys.executable,
        "-P",
        str(DRIVER),
        feed_store_url,
        "told",
        str(pipe),
        "5",
        env=env,
        stdout=PIPE,
    )
    command = ["runs", "events", "told", "-f", "--interval", "3600", "--json"]
    follow = None
    try:
        assert driver.stdout is not None
        assert await asyncio.wait_for(driver.stdout.readline(), 120) == b"HOLDING\n"
        follow = await asyncio.create_subprocess_exec(
            str(EXE), *command, "--store", feed_store_url, env=env, stdout=PIPE
        )
        assert follow.stdout is not None
        first = await asyncio.wait_for(follow.stdout.readline(), 120)  # it listens by now
        assert json.loads(first)["type"] == "run_started"
        await asyncio.to_thread(pipe.write_text, "go\n")
        rest, _ = await asyncio.wait_for(follow.communicate(), 120)
        assert (await asyncio.wait_for(driver.stdout.readline(), 120)).startswith(b"DONE completed")
    finally:
        for process in (driver, follow):
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()
    assert follow.returncode == 0
    printed = [json.loads(line) for line in rest.decode().splitlines()]
    deltas = [e for e in printed if e["type"] == "text_delta"]
    assert "".join(e["data"]["text"] for e in deltas) == ANSWER
    assert all(e["seq"] == -1 for e in deltas)
    assert printed[-1]["type"] == "run_completed"
