"""Live pages: a run page streams the events of a run another process drives (Server-
Sent Events), the list hears of every commit, and however many pages stream, the view
holds one watch of the store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import statekernel as sk
from statekernel.stores import MemoryStore
from statekernel.web import create_app
from statekernel.web.live import Hub

from .clients import local_client
from .serving import served
from .web_agent import kernel_options

HERE = Path(__file__).resolve().parent

DRIVER = """
import asyncio, sys
import statekernel as sk
from web_agent import kernel_options

async def main(url):
    async with sk.Kernel(url, **kernel_options()) as kernel:
        async for _ in kernel.run("gated"):
            pass

asyncio.run(main(sys.argv[1]))
"""


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) of a Server-Sent Events stream."""
    name, data = "", []
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and name:
            yield name, "\n".join(data)
            name, data = "", []


def test_a_run_driven_by_another_process_streams_live(web_store_url: str, tmp_path: Path) -> None:
    async def start() -> None:
        async with sk.Kernel(web_store_url, **kernel_options()) as kernel:
            await kernel.start(model="gated/m", messages=["through"], run_id="gated")

    asyncio.run(start())
    env = {**os.environ, "PYTHONPATH": str(HERE), "WEB_GATE_DIR": str(tmp_path)}
    driver = subprocess.Popen([sys.executable, "-P", "-c", DRIVER, web_store_url], env=env)
    try:
        with (
            served(create_app(web_store_url)) as base,
            httpx.stream("GET", f"{base}/runs/gated/stream?until=rest", timeout=60) as answer,
        ):
            assert answer.headers["content-type"].startswith("text/event-stream")
            seen: list[str] = []
            states: list[str] = []
            for name, data in sse_events(answer.iter_lines()):
                if name == "events":
                    seen.append(data)
                    if "tool_call_started" in data and not (tmp_path / "go").exists():
                        (tmp_path / "go").touch()  # the other process waits at the gate
                elif name == "run":
                    states.append(data)
                elif name == "rest":
                    states.append(data)
                    break
        text = "\n".join(seen)
        assert "tool_call_started" in text  # seen while the other process held the run
        assert text.index("tool_call_started") < text.index("run_completed")
        assert '"state": "completed"' in states[-1]  # the stream ended with the run at rest
        assert len(seen) >= 2  # the events came in more than one push
    finally:
        driver.wait(60)
    assert driver.returncode == 0


def test_the_list_hears_of_commits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"

    async def start(run_id: str) -> None:
        async with sk.Kernel(url, **kernel_options()) as kernel:
            await kernel.start(model="chat/m", messages=["hi"], run_id=run_id)

    asyncio.run(start("first"))
    with served(create_app(url)) as base, httpx.stream("GET", f"{base}/stream", timeout=60) as s:
        events = sse_events(s.iter_lines())
        assert next(events)[0] == "hello"
        asyncio.run(start("second"))
        for name, data in events:
            if name == "changed" and data == "second":
                break
        fragment = httpx.get(f"{base}/?fragment=1").text
        assert "second" in fragment
        assert "<html" not in fragment


async def test_every_streaming_page_shares_one_watch() -> None:
    store = MemoryStore()
    hub = Hub(store)
    async with hub.subscribe() as first, hub.subscribe() as second:
        assert hub.subscribers == 2
        assert hub.watches == 1
        async with sk.Kernel(store, **kernel_options()) as kernel:
            await kernel.start(model="chat/m", messages=["hi"], run_id="r")
        one = await asyncio.wait_for(first.get(), 10)
        two = await asyncio.wait_for(second.get(), 10)
        assert one is not None
        assert two is not None
        assert one.run_id == two.run_id == "r"
    assert hub.subscribers == 0
    async with hub.subscribe():
        assert hub.watches == 2  # stopped after the last page left, started again
    await hub.aclose()


@pytest.mark.parametrize("path", ["/stream", "/runs/r/stream"])
def test_streams_are_authorized(tmp_path: Path, path: str) -> None:

    url = f"sqlite:///{tmp_path}/runs.db"
    with local_client(create_app(url, authorize=lambda request, action, run_id: False)) as c:
        assert c.get(path).status_code == 403


def test_a_reconnecting_stream_goes_on_after_the_last_event_id(tmp_path: Path) -> None:

    url = f"sqlite:///{tmp_path}/runs.db"

    async def drive() -> list[int]:
        async with sk.Kernel(url, **kernel_options()) as kernel:
            await kernel.start(model="chat/m", messages=["hi"], run_id="r")
            async for _ in kernel.run("r"):
                pass
            return [e.revision for e in await kernel.events("r")]

    revisions = sorted(set(asyncio.run(drive())))
    assert len(revisions) >= 2
    middle = revisions[-2]
    with local_client(create_app(url)) as client:
        whole = client.get("/runs/r/stream?until=rest").text
        assert f"id: {revisions[-1]}\n" in whole  # the id of the last events sent
        again = client.get("/runs/r/stream?until=rest", headers={"Last-Event-ID": str(middle)}).text
        bad = [
            client.get("/runs/r/stream?until=rest", headers={b"Last-Event-ID": text})
            for text in (b"x", b"--5", b"\xb2", b"9" * 30)  # \xb2: a latin-1 superscript 2
        ]
    sent = [data for name, data in sse_events(iter(again.splitlines())) if name == "events"]
    assert sent, "the events after the last one taken"
    assert f'"num">r{middle}<' not in "".join(sent)
    assert f'"num">r{revisions[-1]}<' in "".join(sent)
    assert f'"num">r{middle}<' in whole
    for answer in bad:  # not a revision: as if none was sent, never an error
        assert answer.status_code == 200
        assert answer.text.count("event: events") == whole.count("event: events")
