"""``Kernel.cancel`` between real processes, on every store that processes share.

A process drives a run (``cancel_driver.py``) and waits inside a model call, a tool that
is not idempotent or an idempotent one; the test process cancels the run by id. The
driver stops at once: nothing starts after the cancel (the ledger its model calls and
tools append to says what began and what saw its cancellation), the run ends failed
with the ``Cancelled`` failure, and a retry never runs the non-idempotent call again.
A paused run is cancelled through the CLI, from a third process, at once; a queued run
is cancelled at once and no worker drives it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import statekernel as sk
from statekernel.stores import open_store
from statekernel.testing import ScriptedProvider, call

from .test_ownership_processes import STORES, store_url

DRIVER = Path(__file__).with_name("cancel_driver.py")


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cancel_driver = _load(DRIVER)


def _lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


async def _ledger_has(ledger: Path, line: str, proc: subprocess.Popen[str]) -> None:
    """Wait until ``line`` is in the ledger (the driver wrote it, fsynced)."""
    while line not in await asyncio.to_thread(_lines, ledger):
        assert proc.poll() is None, f"the driver ended before {line!r}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("where", ["model", "pay", "lookup"])
@pytest.mark.parametrize("kind", STORES)
async def test_a_run_cancelled_from_another_process_stops_where_it_waits(
    kind: str, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    ledger = tmp_path / "ledger"
    run_id = f"cancel-{where}"
    async with sk.Kernel(url, **cancel_driver.agent(str(ledger), where)) as kernel:
        await kernel.start(model="scripted/m", messages=["go"], run_id=run_id)
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-P", str(DRIVER), url, str(ledger), run_id, where],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        waits = "start model 1" if where == "model" else f"start {where} 1"
        await _ledger_has(ledger, waits, proc)
        async with sk.Kernel(url) as other:
            asked = await other.cancel(run_id, "the operator stops it", by="ops")
        assert asked.outcome == "requested", asked
        out, _ = await asyncio.to_thread(proc.communicate, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    failed_in = "calling_model" if where == "model" else "dispatching_tools"
    final = json.loads(out.strip().splitlines()[-1])
    assert final == {"state": "failed", "error": "Cancelled", "by": "ops", "failed_in": failed_in}
    began = ["start model 1"] if where == "model" else ["start model 1", f"start {where} 1"]
    assert _lines(ledger) == [*began, f"cancelled {where}"]
    store = open_store(url)
    try:
        run = await store.load(run_id)
        events = [e.type for e in await store.events(run_id)]
    finally:
        await store.aclose()
    assert run.failure is not None
    assert run.failure.message == "the operator stops it"
    assert events[-2:] == ["run_cancelled", "run_failed"]
    if where != "pay":
        return
    async with sk.Kernel(url, **cancel_driver.agent(str(ledger), where)) as again:
        await again.retry(run_id)
        async for _ in again.run(run_id):
            pass
        retried = await again.get(run_id)
    assert retried.state == "paused"
    assert retried.pause is not None
    assert retried.pause.reason == "uncertain_tool_calls"  # never run a second time
    assert _lines(ledger) == [*began, "cancelled pay"]


class AskFirst(sk.Hooks):
    """Pauses the run for an approval once its tool turn is done."""

    def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision:
        return sk.Pause("approval", {"ask": "go on?"})


@sk.tool
def note(text: str) -> str:
    """Take a note.

    Args:
        text: What to note.
    """
    return text


@pytest.mark.parametrize("kind", STORES)
async def test_a_paused_run_is_cancelled_at_once_from_the_command_line(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    script = ScriptedProvider([call("note", {"text": "a"}), "done"])
    agent: dict[str, Any] = {
        "tools": [note],
        "hooks": AskFirst(),
        "providers": {"scripted": script},
    }
    async with sk.Kernel(url, **agent) as kernel:
        run = await kernel.start(model="scripted/m", messages=["go"], run_id="held")
        async for _ in kernel.run(run.run_id):
            pass
        assert (await kernel.get("held")).state == "paused"
    cli = [sys.executable, "-P", "-m", "statekernel", "runs", "cancel", "held"]
    args = ["--store", url, "--reason", "not needed", "--by", "cli", "--json"]
    done = await asyncio.to_thread(
        subprocess.run,
        [*cli, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["outcome"] == "cancelled"
    async with sk.Kernel(url, **agent) as kernel:
        cancelled = await kernel.get("held")
        assert cancelled.state == "failed"
        assert cancelled.failure is not None
        assert cancelled.failure.failed_in == "paused"
        assert cancelled.failure.cancellation is not None
        assert cancelled.failure.cancellation.by == "cli"
        again = await kernel.cancel("held")
        assert again.outcome == "unchanged"
        assert "already cancelled" in again.detail
        back = await kernel.retry("held")
        assert back.state == "paused"  # where it was: the approval it waited for
        assert back.pause is not None
        assert back.pause.reason == "approval"


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
async def test_a_queued_run_is_cancelled_at_once_and_no_worker_drives_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    asked: list[str] = []

    async def record(invocation: object, proceed: Callable[[object], object]) -> object:
        asked.append(type(invocation).__name__)
        return await proceed(invocation)  # type: ignore[misc]

    agent: dict[str, Any] = {
        "tools": [note],
        "providers": {"scripted": ScriptedProvider(["done"])},
        "middleware": [record],
    }
    async with sk.Kernel(url, **agent) as kernel:
        await kernel.start(model="scripted/m", messages=["go"], run_id="queued")
        await kernel.submit("queued", queue="cancel-q")
        result = await kernel.cancel("queued", "changed my mind")
        assert result.outcome == "cancelled", result
    worker = sk.Worker(url, agent=agent, queue="cancel-q", concurrency=1)
    serving = asyncio.ensure_future(worker.serve())
    store = open_store(url)
    try:
        queue = store.run_queue("cancel-q")  # type: ignore[attr-defined]
        while await queue.waiting() or await queue.pending():
            assert not serving.done(), serving
            await asyncio.sleep(0.05)
    finally:
        worker.stop(now=True)
        await serving
        await store.aclose()
    assert asked == []  # the worker called no model: the run stayed cancelled
    async with sk.Kernel(url) as kernel:
        run = await kernel.get("queued")
    assert run.state == "failed"
    assert run.failure is not None
    assert run.failure.error == "Cancelled"
