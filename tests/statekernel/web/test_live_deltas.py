"""A run page's stream carries the live events (text deltas) of a run that another
process drives, on the stores with a feed (Redis, PostgreSQL), before its commits."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import httpx

from statekernel.web import create_app

from .serving import served
from .test_live import sse_events

DRIVER = Path(__file__).resolve().parent.parent / "storage" / "live_driver.py"
ANSWER: str = runpy.run_path(str(DRIVER))["ANSWER"]


def test_a_run_page_streams_the_deltas_of_a_run_driven_elsewhere(
    feed_store_url: str, tmp_path: Path
) -> None:
    pipe = tmp_path / "go"
    os.mkfifo(pipe)
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    driver = subprocess.Popen(
        [sys.executable, "-P", str(DRIVER), feed_store_url, "paged", str(pipe), "6"],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline() == b"HOLDING\n"
        with (
            served(create_app(feed_store_url)) as base,
            httpx.stream("GET", f"{base}/runs/paged/stream?until=rest", timeout=60) as answer,
        ):
            order: list[str] = []
            texts: list[str] = []
            for name, data in sse_events(answer.iter_lines()):
                if name == "hello":
                    pipe.write_text("go\n")  # the page listens: the run goes on
                elif name == "live":
                    event = json.loads(data)
                    if event["type"] == "text_delta":
                        texts.append(event["data"]["text"])
                        order.append("delta")
                elif name == "events":
                    order.append("run_completed" if "run_completed" in data else "events")
                elif name == "rest":
                    break
        assert driver.stdout.readline().startswith(b"DONE completed")
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait(60)
    assert "".join(texts) == ANSWER
    assert order.index("run_completed") > max(i for i, o in enumerate(order) if o == "delta")
