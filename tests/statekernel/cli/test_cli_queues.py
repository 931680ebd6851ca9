"""``statekernel queues list|show|requeue|drop`` on every store with run queues: the
depth and entries as stored, a dead letter put back and then driven by a worker, an
entry dropped, and plain refusals."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import statekernel as sk
from statekernel._cli.queues import waited
from statekernel._storage.queues import RunQueue, RunQueues
from statekernel.testing import ScriptedProvider

from .test_cli_runs import ok
from .test_cli_runs import sk as command

SUBMITTER = {"scripted": ScriptedProvider([])}


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis_cluster", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_store_url"))


def _queue(kernel: sk.Kernel, name: str) -> RunQueue:
    assert isinstance(kernel.store, RunQueues)
    return kernel.store.run_queue(name)


def _filled(url: str) -> None:
    """Queue ``jobs``: ``dead-1`` and ``dead-2`` dead letters, ``held`` taken by worker
    ``w1``, ``waits`` waiting."""

    async def go() -> None:
        async with sk.Kernel(url, providers=SUBMITTER) as kernel:
            queue = _queue(kernel, "jobs")
            await queue.prepare()
            for run_id in ("dead-1", "dead-2", "held", "waits"):
                await kernel.start(model="scripted/m", messages=["go"], run_id=run_id)
                await kernel.submit(run_id, queue="jobs")
            for entry in await queue.read("w1", 3, 0):
                if entry.run_id != "held":
                    await queue.dead(entry, "failed", "the model gave up", "w1")

    asyncio.run(go())


def _driven(url: str, run_id: str) -> str:
    """Serve queue ``jobs`` with a worker until ``run_id`` is at rest; its state."""

    async def go() -> str:
        agent = {"providers": {"scripted": ScriptedProvider(["done"] * 4)}}
        worker = sk.Worker(url, queue="jobs", agent=agent, lease_ttl=2.0, block=0.05)
        serving = asyncio.create_task(worker.serve())
        async with sk.Kernel(url, providers=SUBMITTER) as kernel:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while (run := await kernel.get(run_id)).state not in ("completed", "failed"):
                assert not serving.done(), serving
                assert loop.time() < deadline, "the worker never drove the run to rest"
                await asyncio.sleep(0.02)
        worker.stop()
        await serving
        return run.state

    return asyncio.run(go())


def test_list_and_show_say_what_the_queues_hold(url: str, tmp_path: Path) -> None:
    _filled(url)
    listed = json.loads(ok(command("queues", "list", "--store", url, "--json", cwd=tmp_path)))
    (jobs,) = listed
    assert (jobs["name"], jobs["waiting"], jobs["taken"], jobs["dead"]) == ("jobs", 1, 1, 2)
    assert jobs["oldest_ms"] > 0
    assert jobs["oldest_wait_s"] >= 0
    table = ok(command("queues", "list", "--store", url, cwd=tmp_path))
    assert "oldest wait" in table
    assert "jobs" in table
    shown = json.loads(
        ok(command("queues", "show", "jobs", "--store", url, "--json", cwd=tmp_path))
    )
    states = {e["run_id"]: (e["state"], e["consumer"]) for e in shown["entries"]}
    assert states == {"held": ("taken", "w1"), "waits": ("waiting", None)}
    assert [(d["run_id"], d["reason"]) for d in shown["dead_letters"]] == [
        ("dead-1", "failed"),
        ("dead-2", "failed"),
    ]
    text = ok(command("queues", "show", "jobs", "--store", url, cwd=tmp_path))
    assert "failed: the model gave up" in text
    assert "held" in text
    assert "taken" in text


def test_a_dead_letter_put_back_is_driven_by_a_worker(url: str, tmp_path: Path) -> None:
    _filled(url)
    again = ok(command("queues", "requeue", "jobs", "dead-1", "--store", url, cwd=tmp_path))
    assert "put run dead-1 back on queue jobs" in again
    twice = command("queues", "requeue", "jobs", "dead-1", "--store", url, cwd=tmp_path)
    assert twice.returncode == 2
    assert "no dead letter of run 'dead-1'" in twice.stderr
    shown = json.loads(
        ok(command("queues", "show", "jobs", "--store", url, "--json", cwd=tmp_path))
    )
    assert [d["run_id"] for d in shown["dead_letters"]] == ["dead-2"]
    assert _driven(url, "dead-1") == "completed"
    every = ok(
        command("queues", "requeue", "jobs", "--all-dead", "--json", "--store", url, cwd=tmp_path)
    )
    assert json.loads(every)["requeued"] == 1
    assert _driven(url, "dead-2") == "completed"


def test_drop_removes_an_entry_after_confirmation(url: str, tmp_path: Path) -> None:
    _filled(url)
    unasked = command("queues", "drop", "jobs", "waits", "--store", url, cwd=tmp_path)
    assert unasked.returncode == 2
    assert "pass --yes" in unasked.stderr
    dropped = ok(command("queues", "drop", "jobs", "waits", "--yes", "--store", url, cwd=tmp_path))
    assert "dropped 1 from queue jobs: run waits" in dropped
    held = command("queues", "drop", "jobs", "held", "--yes", "--store", url, cwd=tmp_path)
    assert held.returncode == 2
    assert "no entry of run 'held'" in held.stderr
    dead = json.loads(
        ok(
            command(
                "queues", "drop", "jobs", "dead-2", "-y", "--json", "--store", url, cwd=tmp_path
            )
        )
    )
    assert dead["dropped"] == 1
    shown = json.loads(
        ok(command("queues", "show", "jobs", "--store", url, "--json", cwd=tmp_path))
    )
    assert [e["run_id"] for e in shown["entries"]] == ["held"]
    assert [d["run_id"] for d in shown["dead_letters"]] == ["dead-1"]


def test_mistakes_are_refused_plainly(redis_store_url: str, tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path / 'runs.db'}"
    ok(command("demo", "--model", "scripted/demo", "--store", sqlite, cwd=tmp_path))
    none = command("queues", "list", "--store", sqlite, cwd=tmp_path)
    assert none.returncode == 2
    assert "has no run queues" in none.stderr
    bad = command("queues", "show", "no spaces", "--store", redis_store_url, cwd=tmp_path)
    assert bad.returncode == 2
    assert "invalid queue name" in bad.stderr
    both = command(
        "queues", "requeue", "q", "r", "--all-dead", "--store", redis_store_url, cwd=tmp_path
    )
    assert both.returncode == 2
    assert "not both" in both.stderr
    neither = command("queues", "requeue", "q", "--store", redis_store_url, cwd=tmp_path)
    assert neither.returncode == 2
    empty = ok(command("queues", "list", "--store", redis_store_url, cwd=tmp_path))
    assert "no queues" in empty


def test_waited_reads_like_a_person_would_say_it() -> None:
    assert waited(None) == "-"
    assert waited(1_000, 43_000) == "42s"
    assert waited(0, 3 * 60_000 + 5_000) == "3m"
    assert waited(0, 5 * 3_600_000) == "5h"
    assert waited(0, 2 * 86_400_000) == "2d"
    assert waited(10_000, 0) == "0s"
