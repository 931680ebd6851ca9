"""Long runs: memory, stored bytes, turn time, load and resume against run length.

    python bench/long_runs.py                  # N = 1,000 / 5,000 / 10,000 (about 6 minutes)
    python bench/long_runs.py --turns 200,1000,2000 --stores memory,sqlite
    python bench/long_runs.py --turns 3,6 --redis redis://127.0.0.1:6379   # in seconds

Workload: the one of ``bench/anchor.py`` (``bench/anchor_workload.py``): one user
message; each turn the model asks for one ``search`` call with ~200 bytes of JSON
arguments and the tool returns ~1 KB of text; the last turn answers text. Payload is
those arguments and outputs, about 1.2 KB a turn. For each store (``memory://``,
``sqlite://`` with ``synchronous=FULL``, ``redis://`` on a redis-server started here
with AOF and ``appendfsync always``) and each N, printed:

* **live MB / x payload**: memory the run holds when it ends, as the kernel left it
  (the ``Run`` handed to ``on_turn_completed`` last), after the kernel and store are
  closed and gone, measured with ``tracemalloc`` on a drive of its own on
  ``memory://`` (the live run is the same object graph whatever store commits it);
* **loaded MB / x payload**: memory a run loaded from the store holds with every
  completed turn decoded (``tracemalloc``);
* **stored KB/turn**: SQLite: bytes in use in its pages (``dbstat``) less an empty
  database; Redis: the run's keys and values; memory: not measured;
* **ms/turn (last 100)**: wall time of the last 100 turns of the drive (of all but the
  first below 101 turns);
* **load ms**: median of 3 ``store.load`` on a newly opened store;
* **resume ms**: median of 3 times load + one user message + one persisted turn, through
  ``kernel.run(run_id, message)`` (one load; the message joins the turn's first commit).

Below the table: the growth exponent of each figure in N (least squares on log-log;
1.0 is linear, 0 is flat) and the 10,000/1,000 ratios of load and resume (target
<= 12).

``--redis URL``: a running redis-server instead of one started here (its AOF settings
are its own; the runs' keys are deleted after).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import statistics
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from anchor import (
    FINAL_TEXT,
    MODEL,
    USER_TEXT,
    empty_sqlite_bytes,
    opened,
    redis_server,
    script,
    search,
    sk_resume,
    sqlite_bytes,
)
from anchor_workload import tool_arguments

import statekernel as sk
from statekernel._records.run import Run, Turn
from statekernel.testing import ScriptedProvider
from stores import delete_keys, redis_bytes

STORES = ("memory", "sqlite", "redis")


def payload_bytes(turns: int) -> int:
    """Bytes of tool arguments (JSON) and outputs of a run of ``turns`` turns."""
    import json

    from anchor_workload import tool_output

    total = len(USER_TEXT) + len(FINAL_TEXT)
    for t in range(1, turns):
        args = tool_arguments(t)
        total += len(json.dumps(args)) + len(tool_output(str(args["query"])))
    return total


class Keep(sk.Hooks):
    """Keeps the last ``Run`` the kernel handed over, and when each turn ended."""

    def __init__(self) -> None:
        self.run: Run | None = None
        self.ended: list[float] = []

    def on_turn_completed(self, run: Run, turn: Turn) -> None:
        self.run = run
        self.ended.append(time.perf_counter())


async def drive(url: str, turns: int) -> tuple[str, Keep]:
    """One run of ``turns`` turns on ``url``; its id and what the hook kept."""
    keep = Keep()
    store = await opened(url)
    provider = ScriptedProvider(script(turns))
    kernel = sk.Kernel(
        store, tools=[search], providers={"scripted": provider}, hooks=keep, max_turns=None
    )
    run = await kernel.start(model=MODEL, messages=[USER_TEXT])
    async for _ in kernel.run(run.run_id):
        pass
    await kernel.aclose()
    await store.aclose()
    await asyncio.sleep(0)  # the kernel's cancelled lease renewer ends (it holds the store)
    return run.run_id, keep


async def live_bytes(turns: int) -> int:
    """Memory the live run holds at its end (everything else gone), on ``memory://``."""
    await drive("memory://", 20)  # imports and first-use caches are not the run's
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _, keep = await drive("memory://", turns)
        run = keep.run
        del keep
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        assert run is not None
        assert len(run.turns) == turns - 1
        return held
    finally:
        tracemalloc.stop()


async def loaded_bytes(url: str, run_id: str, turns: int) -> int:
    """Memory a run loaded from ``url`` holds with every completed turn decoded."""
    store = await opened(url)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run = await store.load(run_id)
        assert sum(1 for t in run.turns if t.result is not None) == turns
        await store.aclose()
        del store
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


async def load_ms(url: str, run_id: str) -> float:
    times = []
    for _ in range(3):
        store = await opened(url)
        gc.collect()
        began = time.perf_counter()
        await store.load(run_id)
        times.append(time.perf_counter() - began)
        await store.aclose()
    return statistics.median(times) * 1e3


@dataclass
class Row:
    live: float | None = None
    loaded: float = 0.0
    stored: float | None = None
    last100: float = 0.0
    load: float = 0.0
    resume: float = 0.0
    payload: int = 0


async def measure(kind: str, n: int, folder: Path, redis_base: str | None) -> Row:
    row = Row(payload=payload_bytes(n))
    if kind == "memory":
        url = f"memory://long-{n}"
    elif kind == "sqlite":
        url = f"sqlite:///{folder}/runs-{n}.db"
    else:
        url = f"{redis_base}/0?prefix=long{n}"
    if kind == "memory":
        holder = await opened(url)  # a memory://NAME keeps its runs while a store holds them
    run_id, keep = await drive(url, n)
    last = min(100, len(keep.ended) - 1)
    row.last100 = (keep.ended[-1] - keep.ended[-1 - last]) / last * 1e3
    del keep  # the live run it holds would weigh on every collection during the loads
    if kind == "sqlite":
        empty, empty_used = await empty_sqlite_bytes(folder)
        disk, used = sqlite_bytes(folder / f"runs-{n}.db")
        row.stored = ((used - (empty_used or 0)) if used is not None else disk - empty) / n
    elif kind == "redis":
        row.stored = redis_bytes(url, run_id) / n
    row.loaded = await loaded_bytes(url, run_id, n)
    row.load = await load_ms(url, run_id)
    row.resume = statistics.median([await sk_resume(url, run_id) for _ in range(3)]) * 1e3
    if kind == "memory":
        await holder.aclose()
        row.live = await live_bytes(n)  # last: its traced drive leaves a heap loads feel
    if kind == "redis":
        delete_keys(url)
    return row


def exponent(ns: list[int], values: list[float | None]) -> str:
    points = [(math.log(n), math.log(v)) for n, v in zip(ns, values, strict=True) if v]
    if len(points) < 2:
        return "-"
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    num = sum((x - mx) * (y - my) for x, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return f"{num / den:.2f}"


def report(results: dict[str, dict[int, Row]], ns: list[int]) -> None:
    mb = 1024 * 1024
    head = (
        f"{'store':8} {'N':>6} {'live MB':>8} {'x pay':>6} {'loaded MB':>9} {'x pay':>6} "
        f"{'KB/turn':>8} {'ms/turn':>8} {'load ms':>8} {'resume ms':>9}"
    )
    print(head)
    print("-" * len(head))
    for kind, rows in results.items():
        for n in ns:
            r = rows[n]
            live = (
                f"{r.live / mb:8.1f} {r.live / r.payload:6.2f}" if r.live else f"{'-':>8} {'-':>6}"
            )
            stored = f"{r.stored / 1024:8.2f}" if r.stored is not None else f"{'-':>8}"
            print(
                f"{kind:8} {n:6} {live} {r.loaded / mb:9.1f} {r.loaded / r.payload:6.2f} "
                f"{stored} {r.last100:8.2f} {r.load:8.1f} {r.resume:9.1f}"
            )
    print()
    print("growth exponents in N (1.0 linear, 0 flat):")
    for kind, rows in results.items():
        figures = {
            "live": [rows[n].live for n in ns],
            "loaded": [rows[n].loaded for n in ns],
            "stored total": [rows[n].stored * n if rows[n].stored else None for n in ns],
            "ms/turn": [rows[n].last100 for n in ns],
            "load": [rows[n].load for n in ns],
            "resume": [rows[n].resume for n in ns],
        }
        print(f"  {kind:8} " + "  ".join(f"{k} {exponent(ns, v)}" for k, v in figures.items()))
    if len(ns) > 1:
        lo, hi = ns[0], ns[-1]
        print()
        print(f"{hi:,} / {lo:,} turns (linear: {hi / lo:g}; target: {hi / lo * 1.2:g}):")
        for kind, rows in results.items():
            load = rows[hi].load / rows[lo].load
            resume = rows[hi].resume / rows[lo].resume
            print(f"  {kind:8} load {load:5.2f}  resume {resume:5.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="1000,5000,10000")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--redis", help="base URL of a redis-server (default: start one)")
    args = parser.parse_args()
    ns = [int(n) for n in args.turns.split(",")]
    kinds = [k for k in args.stores.split(",") if k]
    results: dict[str, dict[int, Row]] = {k: {} for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with contextlib.ExitStack() as stack:
            base = args.redis
            if base is None and "redis" in kinds:
                port = stack.enter_context(redis_server(folder / "redis"))
                base = f"redis://127.0.0.1:{port}"
            for kind in kinds:
                for n in ns:
                    began = time.perf_counter()
                    results[kind][n] = await measure(kind, n, folder, base)
                    print(f"  {kind} N={n}: {time.perf_counter() - began:.0f} s", flush=True)
    print()
    report(results, ns)


if __name__ == "__main__":
    asyncio.run(main())
