"""Group commit: durable throughput of many concurrent runs in one process.

``--runs`` runs (default 500) are driven at once by one kernel, each ``--turns``
turns (default 5): every model answer takes ``--latency`` seconds (default 50 ms, a
scripted model that sleeps), every turn but the last calls a tool that returns about
1 KB. Prints turns per second on ``memory://`` and on ``sqlite://`` with
``synchronous=FULL`` (and their ratio), commits per turn, and how the SQLite commits
were grouped (batches by size, commits per transaction).

fsyncs per turn: with ``--fsyncs`` (needs ``strace``) the SQLite pass runs again in a
child process under ``strace -f -ttt -e trace=fsync,fdatasync``, which logs the fsync
and fdatasync calls of every thread with their time; the calls made while the runs
were driven (not while they were created) are divided by the turns.

Run: ``python bench/group_commit.py [--fsyncs] [--runs 500] [--turns 5] [--latency 0.05]``
(``--runs 3 --turns 2 --latency 0`` runs in a second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import statekernel as sk
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, StoreWrapper
from statekernel.stores import SQLiteStore, open_store
from statekernel.testing import Reply, ScriptedProvider, call


@sk.tool
def forecast(city: str) -> str:
    """About 1 KB of forecast, different for every input."""
    seed = sum(map(ord, city))
    hours = [{"h": h, "t": (seed * (h + 3)) % 35 - 5, "wind": (seed + h) % 40} for h in range(40)]
    return json.dumps({"city": city, "hours": hours})[:1024]


class Counted(StoreWrapper):
    """A store that counts its commits."""

    def __init__(self, inner: CheckpointStore) -> None:
        super().__init__(inner)
        self.commits = 0

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        await self.inner.commit(checkpoint, lease=lease)
        self.commits += 1


async def drive_all(url: str, runs: int, turns: int, latency: float) -> dict[str, object]:
    """Drive ``runs`` runs at once on the store at ``url``; figures of the pass."""
    script: list[object] = [
        Reply(tool_calls=[call("forecast", {"city": f"city {i}"})], delay=latency)
        for i in range(turns - 1)
    ]
    provider = ScriptedProvider([*script, Reply(text="done", delay=latency)])
    inner = open_store(url)
    store = Counted(inner)
    kernel = sk.Kernel(store, tools=[forecast], providers={"scripted": provider}, max_turns=None)
    started = [kernel.start(model="scripted/bench", messages=["go"]) for _ in range(runs)]
    ids = [run.run_id for run in await asyncio.gather(*started)]
    before = dict(inner._group.sizes) if isinstance(inner, SQLiteStore) else {}
    store.commits = 0

    async def drive(run_id: str) -> None:
        async for _ in kernel.run(run_id):
            pass

    began, wall = time.perf_counter(), time.time()
    await asyncio.gather(*(drive(run_id) for run_id in ids))
    elapsed = time.perf_counter() - began
    window = f"driven {wall:.6f} {time.time():.6f}"
    for run_id in ids[:: max(1, runs // 20)]:
        run = await store.load(run_id)
        assert run.state == "completed", run.state
        assert len(run.turns) == turns, len(run.turns)
    figures: dict[str, object] = {
        "window": window,
        "seconds": elapsed,
        "turns_per_s": runs * turns / elapsed,
        "commits_per_turn": store.commits / (runs * turns),
    }
    if isinstance(inner, SQLiteStore):
        sizes = {k: v - before.get(k, 0) for k, v in inner._group.sizes.items()}
        sizes = {k: v for k, v in sizes.items() if v}
        batches = sum(sizes.values())
        figures["batches"] = batches
        figures["commits_per_batch"] = sum(k * v for k, v in sizes.items()) / max(batches, 1)
        spread = [k for k, v in sizes.items() for _ in range(v)]
        figures["median_batch"] = statistics.median(spread) if spread else 0
        figures["max_batch"] = max(sizes, default=0)
    await kernel.aclose()
    await store.aclose()  # a store passed in is the caller's to close
    return figures


def fsyncs(args: argparse.Namespace) -> int | None:
    """fsync + fdatasync calls made while a child process drives the runs on SQLite."""
    if shutil.which("strace") is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "strace.txt"
        child = [sys.executable, __file__, "--only-sqlite", "--runs", str(args.runs)]
        child += ["--turns", str(args.turns), "--latency", str(args.latency)]
        strace = ["strace", "-f", "-ttt", "-o", str(out), "-e", "trace=fsync,fdatasync"]
        done = subprocess.run([*strace, *child], check=True, capture_output=True, text=True)
        window = next(line for line in done.stdout.splitlines() if line.startswith("driven "))
        start, end = (float(x) for x in window.split()[1:])
        count = 0
        for line in out.read_text().splitlines():
            match = re.match(r"\d+\s+([\d.]+) (fsync|fdatasync)\(", line)
            if match and start <= float(match.group(1)) <= end:
                count += 1
        return count


async def sqlite_pass(args: argparse.Namespace) -> dict[str, object]:
    folder = tempfile.mkdtemp(prefix="bench-group-")
    try:
        return await drive_all(f"sqlite:///{folder}/runs.db", args.runs, args.turns, args.latency)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def main(args: argparse.Namespace) -> None:
    if args.only_sqlite:  # the child of ``fsyncs``: says when it drove the runs
        print((await sqlite_pass(args))["window"])
        return
    memory = await drive_all("memory://bench-group", args.runs, args.turns, args.latency)
    sqlite = await sqlite_pass(args)
    total = args.runs * args.turns
    print(f"{args.runs} runs x {args.turns} turns, model latency {args.latency * 1e3:.0f} ms")
    for name, f in (("memory", memory), ("sqlite", sqlite)):
        line = f"{name:>7}: {f['turns_per_s']:8.0f} turns/s  ({f['seconds']:.2f} s)"
        line += f"  {f['commits_per_turn']:.2f} commits/turn"
        if "batches" in f:
            line += f"  {f['batches']} transactions, {f['commits_per_batch']:.1f} commits each"
            line += f" (median {f['median_batch']}, max {f['max_batch']})"
        print(line)
    ratio = float(str(sqlite["turns_per_s"])) / float(str(memory["turns_per_s"]))
    print(f"durable throughput: {ratio:.2f}x memory://")
    if args.fsyncs:
        count = fsyncs(args)
        if count is None:
            print("fsyncs: strace not found")
        else:
            print(f"fsyncs: {count} in the SQLite pass, {count / total:.3f} per turn")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--fsyncs", action="store_true")
    parser.add_argument("--only-sqlite", action="store_true", help=argparse.SUPPRESS)
    asyncio.run(main(parser.parse_args()))
