"""PostgreSQL at scale: many runs in one process (group commit), the cost of the commit
notices, and 1, 2 and 4 worker processes on one server.

    python bench/postgres.py --postgres postgresql://user@host/db
    python bench/postgres.py --postgres URL --runs 4 --turns 2 --latency 0 --workers 1

Workload (``bench/workers.py``'s ``--mode text``): each run has ``--turns`` turns, each
one model answer that takes ``--latency`` seconds (a scripted model that sleeps), one
commit a turn.

1. **One process**: ``--runs`` runs (500) driven at once by one ``Kernel`` on
   ``postgresql://``, first with the commit notices (the trigger that sends a
   ``NOTIFY`` per commit, which watches need), then with them off (``notify=0``).
   Printed per turn: the store's commits (calls of ``commit``), the server's
   transactions (``pg_stat_database.xact_commit``: commits, and the leases' own) and
   WAL flushes (``pg_stat_wal.wal_sync``: fsyncs), the client's CPU and, for a server
   on this machine, the server's CPU (its processes, from ``/proc``). Fewer fsyncs
   than commits is group commit at work.
2. **Workers**: the same runs submitted to a run queue served by 1, 2 and 4
   ``statekernel.Worker`` processes (``--workers``, concurrency ``--concurrency`` each).
   Printed: runs/s and turns/s from the first submit to the last completion, and the
   workers' CPU per turn against the one-process kernel's (the target is at most 1.5x).

Each measurement has a schema of its own, dropped after. The figures are the given
server's: its ``synchronous_commit`` and ``fsync`` settings, its disk, and the other
work on the machine (the clients and the server share its cores here).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from workers import QUEUE, agent

import statekernel as sk
from statekernel.stores import open_store
from statekernel.stores.postgres._url import parse_postgres_url


def schema_url(base: str, schema: str) -> str:
    joint = "&" if "?" in base else "?"
    return f"{base}{joint}schema={schema}"


async def drop_schema(base: str, schema: str) -> None:
    conn = await asyncpg.connect(parse_postgres_url(base).dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def server_counters(base: str) -> tuple[int, int]:
    """(transactions committed in this database, WAL flushes) so far."""
    conn = await asyncpg.connect(parse_postgres_url(base).dsn)
    try:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        xacts = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        try:
            syncs = await conn.fetchval("SELECT wal_sync FROM pg_stat_wal")
        except asyncpg.PostgresError:
            syncs = -1  # before PostgreSQL 14
        return int(xacts), int(syncs)
    finally:
        await conn.close()


def server_cpu(base: str) -> float | None:
    """CPU seconds used so far by the processes named ``postgres`` on this machine, with
    those of their children that ended (None for a server elsewhere)."""
    host = base.split("@")[-1].split("/")[0].split(":")[0]
    if host not in ("127.0.0.1", "localhost", "::1", "") or not Path("/proc").is_dir():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text.split("(", 1)[1].rsplit(")", 1)
        if name.startswith("postgres"):  # its own CPU, and its ended children's
            fields = rest.split()
            total += sum(int(f) for f in fields[11:15])
    return total / tick


# -- one process ---------------------------------------------------------------------


async def one_process(base: str, args: argparse.Namespace, notify: bool) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    url = schema_url(base, schema)
    ids = [f"run-{i:05}" for i in range(args.runs)]
    try:
        async with sk.Kernel(url, **agent(args.turns, args.latency, "text")) as starter:
            for run_id in ids:
                await starter.start(model="scripted/bench", messages=["go"], run_id=run_id)
        # the server counts a backend's transactions once it is idle or ends: the
        # counters are read with no connection of the measurement open
        xacts, syncs = await server_counters(base)
        store = open_store(url if notify else f"{url}&notify=0")
        commits = 0
        commit = store.commit

        async def counted(*a: Any, **k: Any) -> None:
            nonlocal commits
            commits += 1
            await commit(*a, **k)

        store.commit = counted  # type: ignore[method-assign]
        kernel = sk.Kernel(store, **agent(args.turns, args.latency, "text"))
        cpu, served = time.process_time(), server_cpu(base)
        began = time.perf_counter()

        failed = 0

        async def drive(run_id: str) -> None:
            nonlocal failed
            try:
                async for _ in kernel.run(run_id):
                    pass
            except sk.StatekernelError:  # e.g. a lease that a slow server let lapse
                failed += 1

        try:
            await asyncio.gather(*(drive(r) for r in ids))
            elapsed = time.perf_counter() - began
            cpu = time.process_time() - cpu
        finally:
            await kernel.aclose()
            await store.aclose()
        served_after = server_cpu(base)
        xacts_after, syncs_after = await server_counters(base)
    finally:
        await drop_schema(base, schema)
    turns = args.runs * args.turns
    return {
        "turns_s": turns / elapsed,
        "failed": failed,
        "commits": commits / turns,
        "xacts": (xacts_after - xacts) / turns,
        "syncs": (syncs_after - syncs) / turns if syncs >= 0 else -1,
        "cpu_ms": cpu / turns * 1e3,
        "server_ms": (served_after - served) / turns * 1e3
        if served is not None and served_after is not None
        else -1,
    }


# -- worker processes ----------------------------------------------------------------


async def serve(args: argparse.Namespace) -> None:
    worker = sk.Worker(
        args.serve,
        queue=QUEUE,
        concurrency=args.concurrency,
        agent=lambda: agent(args.turns, args.latency, "text"),
        block=0.2,
    )
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
    signals = Path(args.signals)
    (signals / f"ready-{os.getpid()}").touch()
    began = time.process_time()
    try:
        await worker.serve()
    finally:
        (signals / f"cpu-{os.getpid()}").write_text(str(time.process_time() - began))


async def with_workers(base: str, n: int, args: argparse.Namespace) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    url = schema_url(base, schema)
    kernel = sk.Kernel(url, **agent(args.turns, args.latency, "text"))
    signals = Path(tempfile.mkdtemp(prefix="bench-pg-workers-"))
    ids = [f"run-{i:05}" for i in range(args.runs)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for run_id in ids:
            await kernel.start(model="scripted/bench", messages=["go"], run_id=run_id)
        cmd = [sys.executable, __file__, "--serve", url, "--signals", str(signals)]
        cmd += ["--concurrency", str(args.concurrency), "--turns", str(args.turns)]
        cmd += ["--latency", str(args.latency)]
        procs = spawn(cmd, n)
        while True:
            if started(signals) >= n:
                break
            await asyncio.sleep(0.05)
        began = time.time()
        await asyncio.gather(*(kernel.submit(r, queue=QUEUE) for r in ids))
        while True:
            page = await kernel.store.list_runs(state="completed", limit=len(ids))
            if len(page.runs) == len(ids):
                break
            await asyncio.sleep(0.05)
        elapsed = max(s.updated_at.timestamp() for s in page.runs) - began
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait()
        await kernel.aclose()
        await drop_schema(base, schema)
    cpu = workers_cpu(signals)
    turns = args.runs * args.turns
    return {"runs_s": args.runs / elapsed, "turns_s": turns / elapsed, "cpu_ms": cpu / turns * 1e3}


def spawn(cmd: list[str], n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(cmd) for _ in range(n)]


def started(signals: Path) -> int:
    """How many worker processes said they are ready."""
    return len(list(signals.glob("ready-*")))


def workers_cpu(signals: Path) -> float:
    """The CPU seconds the workers reported as they ended (their folder removed)."""
    cpu = sum(float(p.read_text()) for p in signals.glob("cpu-*"))
    for path in signals.iterdir():
        path.unlink()
    signals.rmdir()
    return cpu


async def main(args: argparse.Namespace) -> None:
    base = args.postgres
    print(
        f"{args.runs} runs x {args.turns} turns, model latency {args.latency * 1e3:.0f} ms, "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    print(
        "one process            turns/s  commits/turn  xacts/turn  fsyncs/turn"
        "  CPU ms/turn: client  server",
        flush=True,
    )
    single: dict[bool, dict[str, float]] = {}
    for notify in (True, False):
        r = await one_process(base, args, notify)
        single[notify] = r
        label = "notices on " if notify else "notices off"
        server = f"{r['server_ms']:6.2f}" if r["server_ms"] >= 0 else "     -"
        syncs = f"{r['syncs']:11.2f}" if r["syncs"] >= 0 else "          -"
        print(
            f"  {label}          {r['turns_s']:7.0f}  {r['commits']:12.2f}  {r['xacts']:10.2f}"
            f"  {syncs}  {r['cpu_ms']:19.2f}  {server}",
            flush=True,
        )
        if r["failed"]:
            print(f"    {r['failed']:.0f} drives ended in an error (counted as done)", flush=True)
    on, off = single[True], single[False]
    print(
        f"commit notices: turns/s x{off['turns_s'] / on['turns_s']:.2f} without them, "
        f"client CPU x{on['cpu_ms'] / off['cpu_ms']:.2f} with them",
        flush=True,
    )
    print("workers  runs/s  turns/s  CPU ms/turn  / one process (target <= 1.5)", flush=True)
    for n in args.workers:
        r = await with_workers(base, n, args)
        ratio = r["cpu_ms"] / on["cpu_ms"]
        verdict = "PASS" if ratio <= 1.5 else "MISS"
        print(
            f"{n:7}  {r['runs_s']:6.1f}  {r['turns_s']:7.0f}  {r['cpu_ms']:11.2f}"
            f"  {ratio:.2f} {verdict}",
            flush=True,
        )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", help="a PostgreSQL database's URL (required)")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--signals", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.serve and not args.postgres:
        parser.error("--postgres URL is required")
    return args


if __name__ == "__main__":
    arguments = parse()
    asyncio.run(serve(arguments) if arguments.serve else main(arguments))
