"""``statekernel runs prune``: old runs deleted as asked, with a dry run, a confirmation
and plain refusals of what it cannot read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import statekernel as sk
from statekernel.testing import ScriptedProvider

from ..kernel.test_prune import _done, _exists, _kernel
from .test_cli_runs import sk as command


def _made(url: str, *run_ids: str) -> None:
    async def go() -> None:
        kernel = sk.Kernel(url, providers={"plain": ScriptedProvider(["an answer"])})
        async with kernel:
            for run_id in run_ids:
                await kernel.start(model="plain/x", messages=["ask"], run_id=run_id)
                async for _ in kernel.run(run_id):
                    pass

    asyncio.run(go())


def _left(url: str, *run_ids: str) -> set[str]:
    async def go() -> set[str]:
        async with sk.Kernel(url) as kernel:
            return {r for r in run_ids if await _exists(kernel, r)}

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_prune_deletes_old_runs_after_a_dry_run(kind: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db" if kind == "sqlite" else f"file://{tmp_path}/runs"
    _made(url, "a", "b")
    dry = command("runs", "prune", "--older-than", "0s", "--dry-run", "--store", url, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert set(dry.stdout.split()[:2]) == {"a", "b"}
    assert "would delete 2 run(s): runs in state completed,failed" in dry.stdout
    assert _left(url, "a", "b") == {"a", "b"}

    kept = command("runs", "prune", "--older-than", "30d", "--yes", "--store", url, cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    assert "deleted 0 run(s)" in kept.stdout

    done = command(
        "runs", "prune", "--older-than", "0s", "--state", "completed", "--yes", "--json",
        "--store", url, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result["deleted"]) == {"a", "b"}
    assert result["held"] == []
    assert result["dry_run"] is False
    assert _left(url, "a", "b") == set()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--older-than", "30 days"], "--older-than '30 days' is not an age"),
        (["--older-than", "30d", "--state", "finished"], "unknown state 'finished'"),
        (["--older-than", "30d"], "nobody can confirm it here"),
        (["--older-than", "30d", "--json"], "nobody can confirm it here"),
    ],
)
def test_prune_refuses_what_it_cannot_do(args: list[str], problem: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    _made(url, "a")
    refused = command("runs", "prune", *args, "--store", url, cwd=tmp_path)
    assert refused.returncode == 2
    assert problem in refused.stderr
    assert "Traceback" not in refused.stderr
    assert _left(url, "a") == {"a"}


async def test_prune_names_a_run_a_process_holds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    kernel = _kernel(url, [], [])
    async with kernel:  # this process holds the run while the command runs
        await _done(kernel, "plain")
        await kernel.store.acquire("plain", "someone-else", ttl=3600)
        args = ("runs", "prune", "--older-than", "0s", "--yes", "--store", url)
        done = await asyncio.to_thread(command, *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "deleted 0 run(s)" in done.stdout
        assert "skipped run plain: a process holds it" in done.stderr
        assert await _exists(kernel, "plain")
