"""Worker throughput: runs per second with 1, 2 and 4 ``Worker`` processes on one Redis.

Each run has ``--turns`` turns (default 5); every model answer takes ``--latency``
seconds (default 50 ms, a scripted model that sleeps). ``--mode text``: each turn is
one model answer and a hook continues the run until the last turn (one commit per
turn). ``--mode tools``: turns before the last call one idempotent tool (two commits per
turn). For each worker count the runs are created first, the workers started, then
all runs submitted at once; the clock runs from the first submit to the last
completion commit. Prints throughput (runs/s, turns/s), scaling efficiency against
one worker, and the p50/p99 time from submit to completion.

Run: ``python bench/workers.py`` (starts a temporary redis-server; ``--redis URL`` to
use another: a measurement deletes its own keys, under a prefix of its own). Workers
run as ``python bench/workers.py --serve ...`` subprocesses. ``--runs 4 --turns 2
--latency 0 --workers 1 --concurrency 4`` runs in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import statekernel as sk
from statekernel.stores import RedisStore
from statekernel.testing import Reply, ScriptedProvider, call

QUEUE = "bench"


class KeepGoing(sk.Hooks):
    """Continue after text answers until the last turn."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision | None:
        return sk.Continue() if turn.index < self.turns - 1 else None


@sk.tool(idempotent=True)
async def fetch(key: str) -> str:
    """A fast, idempotent tool."""
    return f"value of {key}"


def agent(turns: int, latency: float, mode: str) -> dict[str, Any]:
    """Kernel options of the benchmark's runs."""
    if mode == "text":
        script: list[object] = [Reply(f"answer {i}", delay=latency) for i in range(turns)]
        hooks: object = KeepGoing(turns)
    else:
        script = [
            Reply(tool_calls=(call("fetch", {"key": f"k{i}"}),), delay=latency)
            for i in range(turns - 1)
        ]
        script.append(Reply("done", delay=latency))
        hooks = sk.Hooks()
    providers = {"scripted": ScriptedProvider(script)}
    return {"tools": [fetch], "providers": providers, "hooks": hooks, "max_turns": None}


# -- worker processes ----------------------------------------------------------------


async def serve(args: argparse.Namespace) -> None:
    worker = sk.Worker(
        args.serve,
        queue=QUEUE,
        concurrency=args.concurrency,
        agent=lambda: agent(args.turns, args.latency, args.mode),
        block=0.2,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)
    store = RedisStore(args.serve)
    await store.client.incr(store.run_key("bench", "ready"))
    began = time.process_time()
    try:
        await worker.serve()
    finally:
        await store.client.incrbyfloat(store.run_key("bench", "cpu"), time.process_time() - began)
        await store.aclose()


def spawn(url: str, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, __file__, "--serve", url, "--concurrency", str(args.concurrency)]
    cmd += ["--turns", str(args.turns), "--latency", str(args.latency), "--mode", args.mode]
    return subprocess.Popen(cmd)


# -- one measurement -----------------------------------------------------------------


async def ready(store: RedisStore, n: int) -> None:
    """Until ``n`` worker processes have started (imports done, about to serve)."""
    while True:
        if int(await store.client.get(store.run_key("bench", "ready")) or 0) >= n:
            await asyncio.sleep(0.2)
            return
        await asyncio.sleep(0.05)


async def redis_cpu(store: RedisStore) -> float:
    """CPU seconds the Redis server has used so far."""
    info = await store.client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def drained(store: RedisStore) -> None:
    q = store.run_queue(QUEUE)
    while True:
        if not (await q.pending() or await store.client.xlen(q.key)):
            return
        await asyncio.sleep(0.02)


async def measure(base: str, n: int, args: argparse.Namespace) -> dict[str, float]:
    url = f"{base}/0?prefix=bench-{uuid.uuid4().hex[:8]}"
    store = RedisStore(url)
    kernel = sk.Kernel(store, **agent(args.turns, args.latency, args.mode))  # knows the model
    ids = [f"run-{i:05}" for i in range(args.runs)]
    for run_id in ids:
        await kernel.start(model="scripted/bench", messages=["go"], run_id=run_id)
    await store.run_queue(QUEUE).prepare()
    procs = [spawn(url, args) for _ in range(n)]
    try:
        await ready(store, n)
        cpu_began = (time.process_time(), await redis_cpu(store))
        submitted: dict[str, float] = {}
        for start in range(0, len(ids), 50):
            batch = ids[start : start + 50]
            now = time.time()
            await asyncio.gather(*(kernel.submit(r, queue=QUEUE) for r in batch))
            submitted.update(dict.fromkeys(batch, now))
        await drained(store)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait()
    driver_cpu = time.process_time() - cpu_began[0]
    server_cpu = await redis_cpu(store) - cpu_began[1]
    workers_cpu = float(await store.client.get(store.run_key("bench", "cpu")) or 0)
    page = await store.list_runs(limit=len(ids))
    done = {s.run_id: s.updated_at.timestamp() for s in page.runs if s.state == "completed"}
    latencies = sorted(done[r] - submitted[r] for r in done)
    elapsed = max(done.values()) - min(submitted.values())
    turns = len(done) * args.turns
    await delete_keys(store)
    await kernel.aclose()
    await store.aclose()
    return {
        "completed": len(done),
        "runs_s": len(done) / elapsed,
        "turns_s": turns / elapsed,
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "workers_ms": workers_cpu / turns * 1e3,
        "redis_ms": server_cpu / turns * 1e3,
        "driver_ms": driver_cpu / turns * 1e3,
    }


async def delete_keys(store: RedisStore) -> None:
    """Delete the keys under the store's prefix (the measurement's alone)."""
    keys = [key async for key in store.client.scan_iter(match=f"{store.prefix}:*", count=1000)]
    for start in range(0, len(keys), 500):
        await store.client.delete(*keys[start : start + 500])


def start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="bench-redis-")
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    cmd += ["--appendonly", "no", "--dir", folder]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    return proc, f"redis://127.0.0.1:{port}", folder


async def main(args: argparse.Namespace) -> None:
    print(
        f"{args.runs} runs x {args.turns} turns ({args.mode}), model latency "
        f"{args.latency * 1000:.0f} ms, concurrency {args.concurrency} per worker, "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    print(
        "workers  completed   runs/s  turns/s  efficiency  p50 ms  p99 ms"
        "   CPU ms/turn: workers  redis  driver  ceiling turns/s",
        flush=True,
    )
    cores = os.cpu_count() or 1
    single = None
    for n in args.workers:
        r = await measure(args.redis, n, args)
        single = single or r["turns_s"] / n
        print(
            f"{n:7}  {r['completed']:9.0f}  {r['runs_s']:7.1f}  {r['turns_s']:7.0f}  "
            f"{r['turns_s'] / (n * single):9.0%}  {r['p50'] * 1e3:6.0f}  {r['p99'] * 1e3:6.0f}"
            f"{r['workers_ms']:21.2f}  {r['redis_ms']:5.2f}  {r['driver_ms']:6.2f}"
            f"  {cores * 1e3 / (r['workers_ms'] + r['redis_ms'] + r['driver_ms']):15.0f}",
            flush=True,
        )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--mode", choices=["text", "tools"], default="text")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--redis", help="base URL of a redis-server (default: start one)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    if arguments.serve:
        asyncio.run(serve(arguments))
    elif arguments.redis:
        asyncio.run(main(arguments))
    else:
        server, arguments.redis, scratch = start_redis()
        try:
            asyncio.run(main(arguments))
        finally:
            server.terminate()
            server.wait()
            shutil.rmtree(scratch, ignore_errors=True)
