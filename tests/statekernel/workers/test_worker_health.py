"""A worker's health endpoint: alive and ready while it takes work, its queue's depth,
not ready once its store (a redis-server of the test's own) is gone, and closed with it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import ConfigError, InvalidArgument
from statekernel.testing import ScriptedProvider

from ...stores.conftest import free_port, serve, stop
from .test_worker import SUBMITTER, agent, note_then_done, until

pytestmark = pytest.mark.redis


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def get(worker: sk.Worker, path: str) -> tuple[int, dict[str, Any]]:
    """``GET path`` of the worker's endpoint, from another thread (it answers on this
    loop)."""
    url = f"http://{worker.health_host}:{worker.health_port}{path}"
    return await asyncio.to_thread(_get, url)


def answers(worker: sk.Worker, path: str, status: int) -> Callable[[], Any]:
    async def check() -> bool:
        return (await get(worker, path))[0] == status

    return check


async def test_ready_while_working_and_not_once_the_store_is_gone(
    redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = serve(tmp_path, ["--port", str(port)], url)
    try:
        gate = asyncio.Event()
        kernel = sk.Kernel(url, providers=SUBMITTER)
        await kernel.start(model="scripted/x", messages=["go"], run_id="busy")
        await kernel.submit("busy")
        for i in range(2):
            await kernel.start(model="scripted/x", messages=["go"], run_id=f"later-{i}")
            await kernel.submit(f"later-{i}", delay=3600)
        await kernel.aclose()
        worker = sk.Worker(
            url,
            agent=agent(note_then_done(), gate=gate),
            concurrency=1,
            lease_ttl=2.0,
            block=0.05,
            health_port=0,
        )
        serving = asyncio.create_task(worker.serve())
        await worker.health_listening.wait()
        assert worker.health_port != 0
        await until(answers(worker, "/readyz", 200))
        await until(lambda: _holding(worker))
        status, ready = await get(worker, "/readyz")
        assert (status, ready["ready"], ready["in_flight"]) == (200, True, 1)
        assert (await get(worker, "/livez"))[0] == 200
        status, depth = await get(worker, "/queue")
        assert status == 200
        assert (depth["name"], depth["waiting"], depth["taken"]) == ("default", 2, 1)
        assert (await get(worker, "/nothing"))[0] == 404
        stop(server)  # the store is gone
        await until(answers(worker, "/readyz", 503))
        status, ready = await get(worker, "/readyz")
        assert ready["problem"]
        assert (await get(worker, "/livez"))[0] == 200  # the loop goes on
        assert (await get(worker, "/queue"))[0] == 503
        worker.stop(now=True)
        gate.set()
        await serving
        with pytest.raises(urllib.error.URLError, match="refused"):  # closed with the worker
            await get(worker, "/livez")
    finally:
        stop(server)


async def _holding(worker: sk.Worker) -> bool:
    return len(worker.holding) == 1


async def test_health_options_are_checked(redis_store_url: str) -> None:
    for bad in (-1, 65536, "80", True):
        with pytest.raises(InvalidArgument, match="health_port"):
            sk.Worker(redis_store_url, health_port=bad)  # type: ignore[arg-type]
    taken = sk.Worker(redis_store_url, health_port=0, block=0.05)
    first = asyncio.create_task(taken.serve())
    await taken.health_listening.wait()
    again = sk.Worker(
        redis_store_url,
        health_port=taken.health_port,
        agent={"providers": {"scripted": ScriptedProvider([])}},
    )
    with pytest.raises(ConfigError, match="cannot listen"):
        await again.serve()
    taken.stop()
    await first


def test_the_worker_command_serves_the_endpoint(redis_store_url: str, tmp_path: Path) -> None:
    exe = shutil.which("statekernel")
    assert exe is not None
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    proc = subprocess.Popen(
        [exe, "worker", "--store", redis_store_url, "--health-port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        where = ""
        for line in proc.stderr:  # the worker says where it listens
            if line.startswith("health endpoint: "):
                where = line.split(": ", 1)[1].strip()
                break
        assert where.startswith("http://127.0.0.1:"), where
        deadline = time.monotonic() + 60
        while (answer := _get(f"{where}/readyz"))[0] != 200:
            assert time.monotonic() < deadline, answer
            time.sleep(0.05)
        assert answer[1]["queue"] == "default"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
