"""PostgreSQL commit notices and concurrent commits: what a notice costs the commits of
many clients, measured side by side in one run.

    python bench/pg_notices.py --postgres postgresql://user@host/db
    python bench/pg_notices.py --postgres URL --clients 2 --commits 5 --rounds 1

``--clients`` processes (as workers are), each a store committing to a run of its own,
start at once and make ``--commits`` commits each, in three settings, one after another
in each of ``--rounds`` rounds:

* **unwatched**: no store watches the schema's commits, so the notice trigger sends none
  (layout 5);
* **watched**: another store watches (``store.watch()``), so every commit notifies: a
  notifying transaction waits at its commit for every other notifying transaction of
  the server, fsync included;
* **notify=0**: the clients' sessions turn the notices off (no trigger work at all).

Then the same with **bare updates**: ``--clients`` sessions of one process move their
run's revision with a bare ``UPDATE`` (the notice trigger fires, no client work beside
it), the server's side alone; store clients on a small machine are bound by their own
CPU (encoding each commit), bare updates by the server's.

Printed: commits per second (the median over rounds) for each, and the ratios
``unwatched / watched`` (what gating the notices gives) and ``unwatched / notify=0``
(what is left of the trigger's cost, about 1). Each setting has a schema of its own,
dropped after. The figures are the given server's and this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg

from statekernel.stores import Checkpoint, PostgresStore
from statekernel.testing._store_cases import next_revision, sample_run

SETTINGS = ("unwatched", "watched", "notify=0")


def schema_url(base: str, schema: str, *options: str) -> str:
    """``base`` with the store options ``schema=...`` and ``options``."""
    joint = "&" if "?" in base else "?"
    return base + joint + "&".join((f"schema={schema}", *options))


@contextlib.asynccontextmanager
async def schema_of(base: str) -> AsyncIterator[str]:
    """A fresh schema name, dropped at the end."""
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        yield schema
    finally:
        conn = await asyncpg.connect(base)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


async def client(url: str, name: str, commits: int) -> None:
    """A client process: create a run, say ``ready``, wait for a line on stdin, then
    commit ``commits`` revisions of the run."""
    store = PostgresStore(url)
    try:
        run = sample_run(name)
        await store.commit(Checkpoint.between(None, run))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        for _ in range(commits):
            nxt = next_revision(run)
            await store.commit(Checkpoint.between(run, nxt))
            run = nxt
    finally:
        await store.aclose()


async def _spawn(url: str, name: str, commits: int) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--client",
        url,
        name,
        str(commits),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = await process.stdout.readline()
    if line.strip() != b"ready":
        raise SystemExit(f"a client process did not start: {line!r}")
    return process


async def measure(base: str, setting: str, clients: int, commits: int) -> float:
    """Commits per second of ``clients`` stores committing at once in ``setting``."""
    async with schema_of(base) as schema:
        url = schema_url(base, schema, *(["notify=0"] if setting == "notify=0" else []))
        watcher = PostgresStore(schema_url(base, schema))
        try:
            await watcher.list_runs(limit=1)  # creates the schema before the clients
            async with contextlib.AsyncExitStack() as stack:
                if setting == "watched":
                    await stack.enter_async_context(watcher.watch())
                processes = [await _spawn(url, f"run-{i}", commits) for i in range(clients)]
                started = time.perf_counter()
                for process in processes:  # every client has opened its session and run
                    assert process.stdin is not None
                    process.stdin.write(b"go\n")
                    await process.stdin.drain()
                codes = [await process.wait() for process in processes]
                elapsed = time.perf_counter() - started
                if any(codes):
                    raise SystemExit(f"a client process failed: exit codes {codes}")
        finally:
            await watcher.aclose()
    return clients * commits / elapsed


async def bare(base: str, setting: str, clients: int, commits: int) -> float:
    """Commits per second of ``clients`` sessions of this process at once, each moving the
    revision of a run of its own with a bare ``UPDATE`` (the store's notice trigger
    fires; no client work beside it): the server's side alone, in ``setting``."""
    async with schema_of(base) as schema:
        watcher = PostgresStore(schema_url(base, schema))
        try:
            for i in range(clients):
                await watcher.commit(Checkpoint.between(None, sample_run(f"run-{i}")))
            async with contextlib.AsyncExitStack() as stack:
                if setting == "watched":
                    await stack.enter_async_context(watcher.watch())
                sessions = [await asyncpg.connect(base) for _ in range(clients)]
                try:
                    if setting == "notify=0":
                        for conn in sessions:
                            await conn.execute("SET statekernel.notify = 'off'")
                    update = f'UPDATE "{schema}".runs SET revision = revision + 1 WHERE run_id = $1'

                    async def moving(conn: asyncpg.Connection, run_id: bytes) -> None:
                        for _ in range(commits):
                            await conn.execute(update, run_id)

                    started = time.perf_counter()
                    await asyncio.gather(
                        *(moving(c, f"run-{i}".encode()) for i, c in enumerate(sessions))
                    )
                    elapsed = time.perf_counter() - started
                finally:
                    for conn in sessions:
                        await conn.close()
        finally:
            await watcher.aclose()
    return clients * commits / elapsed


async def main(args: argparse.Namespace) -> None:
    print(f"{args.clients} clients x {args.commits} commits, {args.rounds} rounds")
    for label, how in (("store clients (processes)", measure), ("bare updates", bare)):
        found: dict[str, list[float]] = {s: [] for s in SETTINGS}
        for _ in range(args.rounds):
            for setting in SETTINGS:
                found[setting].append(await how(args.postgres, setting, args.clients, args.commits))
        rate = {s: statistics.median(v) for s, v in found.items()}
        print(f"{label}:")
        for setting in SETTINGS:
            print(f"  {setting:10} {rate[setting]:10.0f} commits/s")
        print(f"  unwatched / watched: x{rate['unwatched'] / rate['watched']:.2f}")
        print(f"  unwatched / notify=0: x{rate['unwatched'] / rate['notify=0']:.2f}")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", help="a PostgreSQL database's URL (required)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return args
    if not args.postgres:
        sys.exit("bench/pg_notices.py needs --postgres URL")
    return args


if __name__ == "__main__":
    parsed = parse()
    if parsed.client:
        url, name, count = parsed.client
        asyncio.run(client(url, name, int(count)))
    else:
        asyncio.run(main(parsed))
