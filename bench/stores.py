"""Checkpoint store costs on the kernel's workload, per store and run length.

Each turn (``bench/stores_workload.py``): the scripted model returns one tool call with
~200 bytes of arguments, the tool returns ~1 KB, the last turn returns text (two
commits per turn).
For memory, file, SQLite and Redis (a temporary redis-server is started) and
N = 10, 100, 1000 turns it prints the median milliseconds per commit and per turn,
the bytes stored (payload, and on disk for file and SQLite), the growth exponent of
the bytes in N, and the time to load the 1000-turn run from a newly opened store
(nothing decoded before). It also times a raw ``sqlite3`` insert of the same
bytes per commit with the same journal and sync settings, for the ratio, and the
same insert sent through one hop to the store's connection thread (what keeping
SQLite off the event loop costs on this machine). "payload" is what the commits
write (every head revision included); "stored" is what stays: bytes on disk for
file and SQLite, bytes of the run's keys and values for Redis.
Run: ``python bench/stores.py [--turns 10,100,1000] [--redis URL]``: ``--turns`` the run
lengths (two at least; the exponent is taken between the last two, the load at the
last), ``--redis`` the base URL of a running redis-server instead of starting one (the
runs' keys are deleted after). ``--turns 2,4`` runs in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import gc
import math
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from stores_workload import get_weather, script

import statekernel as sk
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, StoreWrapper
from statekernel.stores import open_store
from statekernel.stores._format.codec import encode_commit
from statekernel.stores._format.dicts import dump_entry
from statekernel.stores._format.documents import dump_bytes
from statekernel.testing import ScriptedProvider

SIZES = (10, 100, 1000)
"""The run lengths measured by default."""


class Timed(StoreWrapper):
    """A store that times its commits and keeps the checkpoints it was given."""

    def __init__(self, inner: CheckpointStore) -> None:
        super().__init__(inner)
        self.times: list[float] = []
        self.checkpoints: list[Checkpoint] = []

    async def commit(self, checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        began = time.perf_counter()
        await self.inner.commit(checkpoint, lease=lease)
        self.times.append(time.perf_counter() - began)
        self.checkpoints.append(checkpoint)


async def drive(store: Timed, turns: int) -> tuple[str, float]:
    """One run of ``turns`` turns through the kernel; (run id, seconds)."""
    provider = ScriptedProvider(script(turns))
    kernel = sk.Kernel(store, tools=[get_weather], providers={"scripted": provider}, max_turns=None)
    run = await kernel.start(model="scripted/bench", messages=["Weather in Paris?"])
    began = time.perf_counter()
    async for _ in kernel.run(run.run_id):
        pass
    elapsed = time.perf_counter() - began
    final = await store.load(run.run_id)
    assert final.state == "completed", final.state
    assert len(final.turns) == turns
    return run.run_id, elapsed


def payload_per_commit(checkpoints: list[Checkpoint]) -> list[int]:
    """Bytes each commit writes in the stored encoding (head, log entry, parts, blobs)."""
    sizes: list[int] = []
    prior: dict[str, Any] | None = None
    for cp in checkpoints:
        enc = encode_commit(cp, prior)
        parts = [dump_bytes(enc.head), dump_entry(enc.entry), *enc.messages, *enc.turns]
        sizes.append(sum(map(len, parts)) + sum(len(k) + len(v) for k, v in enc.blobs.items()))
        prior = enc.head
    return sizes


def raw_sqlite_ms(sizes: list[int], folder: Path) -> float:
    """Median ms of a raw sqlite3 insert of ``size`` bytes per commit (WAL, sync FULL)."""
    conn = sqlite3.connect(folder / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    times = []
    for size in sizes:
        data = os.urandom(size)
        began = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO raw (data) VALUES (?)", (data,))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - began)
    conn.close()
    return statistics.median(times) * 1e3


def _insert(conn: sqlite3.Connection, data: bytes) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO raw (data) VALUES (?)", (data,))
    conn.execute("COMMIT")


async def hop_insert_ms(sizes: list[int], folder: Path) -> float:
    """Median ms of the same raw insert, sent through one hop to a connection thread."""
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:  # the connection's
        conn = await loop.run_in_executor(thread, _connect, folder / "hop.db")
        times = []
        for size in sizes:
            data = os.urandom(size)
            began = time.perf_counter()
            await loop.run_in_executor(thread, _insert, conn, data)  # one hop, like a commit
            times.append(time.perf_counter() - began)
        await loop.run_in_executor(thread, conn.close)
    return statistics.median(times) * 1e3


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    return conn


def delete_keys(url: str) -> None:
    """Delete the keys of the Redis store at ``url`` (those under its prefix)."""
    prefix = url.split("prefix=")[1]
    client = redis.Redis.from_url(url.split("?")[0])
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()


def redis_bytes(url: str, run_id: str) -> int:
    """Bytes of a run's keys and values in Redis (what the store keeps, not Redis' overhead)."""
    prefix = url.split("prefix=")[1]
    client = redis.Redis.from_url(url.split("?")[0])
    total = 0
    for key in client.scan_iter(match=f"{prefix}:{{{run_id}}}:*"):
        kind = client.type(key)
        total += len(key)
        if kind == b"list":
            total += sum(map(len, client.lrange(key, 0, -1)))
        elif kind == b"hash":
            total += sum(len(k) + len(v) for k, v in client.hgetall(key).items())
        else:
            total += len(client.get(key) or b"")
    client.close()
    return total


def disk_bytes(kind: str, folder: Path) -> int | None:
    """Bytes on disk of a file or SQLite store after a checkpoint of the WAL."""
    if kind == "file":
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    if kind == "sqlite":
        db = folder / "runs.db"
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in folder.glob("runs.db*"))
    return None


def url_for(kind: str, folder: Path, redis_url: str, n: int) -> str:
    return {
        "memory": f"memory://bench-{n}",
        "file": f"file://{folder}",
        "sqlite": f"sqlite:///{folder}/runs.db",
        "redis": f"{redis_url}/0?prefix=bench{n}",
    }[kind]


async def load_ms(url: str, run_id: str) -> float:
    """Median ms to load the run from a newly opened store (connection opened first)."""
    loads = []
    gc.collect()
    for _ in range(7):
        store = open_store(url)
        with contextlib.suppress(Exception):
            await store.load("no-such-run")
        began = time.perf_counter()
        await store.load(run_id)
        loads.append(time.perf_counter() - began)
        await store.aclose()
    return statistics.median(loads) * 1e3


async def bench_store(kind: str, redis_url: str, sizes: tuple[int, ...]) -> None:
    stored: dict[int, int] = {}
    for turns in sizes:
        folder = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
        url = url_for(kind, folder, redis_url, turns)
        store = Timed(open_store(url))
        run_id, elapsed = await drive(store, turns)
        payload = payload_per_commit(store.checkpoints)
        store.checkpoints.clear()
        await store.aclose()
        commit_ms = statistics.median(store.times) * 1e3
        kept = disk_bytes(kind, folder) if kind != "redis" else redis_bytes(url, run_id)
        stored[turns] = sum(payload) if kept is None else kept
        per_turn_ms = elapsed / turns * 1e3
        line = f"{kind:>7} N={turns:<5} commit {commit_ms:6.3f} ms  turn {per_turn_ms:7.3f} ms"
        line += f"  payload {sum(payload) / turns:6.0f} B/turn"
        if kept is not None:
            line += f"  stored {kept / turns:6.0f} B/turn"
        if kind == "sqlite":
            raw = raw_sqlite_ms(payload, folder)
            hop = await hop_insert_ms(payload, folder)
            line += f"  raw insert {raw:6.3f} ms (x{commit_ms / raw:.2f})"
            line += f"  via thread {hop:6.3f} ms (x{commit_ms / hop:.2f})"
        if turns == sizes[-1]:
            line += f"  load {await load_ms(url, run_id):6.2f} ms"
        if kind == "memory":  # free the run now (its data lives while a store of the name does)
            await open_store(url).delete(run_id)
        if kind == "redis":
            delete_keys(url)
        print(line, flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    low, top = sizes[-2], sizes[-1]
    exponent = math.log(stored[top] / stored[low]) / math.log(top / low)
    what = "stored bytes" if kind != "memory" else "payload"
    print(f"{kind:>7} growth exponent of {what} in N ({low} -> {top}): {exponent:.3f}", flush=True)


def start_redis() -> tuple[subprocess.Popen[bytes], str, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="bench-redis-")
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    proc = subprocess.Popen(
        [*args, "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    return proc, f"redis://127.0.0.1:{port}", folder


async def main(sizes: tuple[int, ...], redis_url: str | None) -> None:
    proc, folder = None, None
    if redis_url is None:
        proc, redis_url, folder = start_redis()
    try:
        for kind in ("memory", "file", "sqlite", "redis"):
            await bench_store(kind, redis_url, sizes)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    print("targets: SQLite commit <= 1.5x raw insert; <= 2 KB/turn stored, exponent ~1;")
    print(f"         load of the {sizes[-1]}-turn run <= 20 ms")


def parse_sizes(text: str) -> tuple[int, ...]:
    """``10,100,1000``: two run lengths at least, in increasing order."""
    sizes = tuple(sorted(int(n) for n in text.split(",")))
    if len(sizes) < 2 or sizes[0] < 1:
        raise argparse.ArgumentTypeError("two run lengths at least, each 1 or more")
    return sizes


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=parse_sizes, default=SIZES, help="e.g. 10,100,1000")
    parser.add_argument("--redis", help="base URL of a redis-server (default: start one)")
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.redis))
