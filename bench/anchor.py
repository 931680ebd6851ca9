"""statekernel beside LangGraph on one agent workload, measured side by side in one run.

    python bench/anchor.py --quick      # N = 10, 100 (about a minute)
    python bench/anchor.py              # N = 10, 100, 1000 (a few minutes, ~2 GB of disk)
    python bench/anchor.py --reps 10:7,100:5 --resume-reps 5 --no-fsyncs
    python bench/anchor.py --no-langgraph --reps 3:1,5:1 --resume-reps 1 --no-fsyncs

Workload (``bench/anchor_workload.py``): one user message; turns 1..N-1 the model
asks for one ``search`` call with ~200 bytes of JSON arguments and the tool returns
~1 KB of text (a sync function declared ``inline``: it runs on the event loop, as the
LangGraph side runs it inside its tools node); turn N answers text. statekernel: a
``Kernel(store, tools=[search], providers={"scripted": ScriptedProvider(script)},
max_turns=None)`` on ``sqlite://``
(``synchronous=FULL``, the default), ``file://``, ``redis://`` (a redis-server started
here on a free loopback port, ``--appendonly yes --appendfsync always --save ''``) and
``memory://``, and ``postgresql://`` with ``--postgres URL`` (a schema per run, dropped
after); ``kernel.start`` and ``kernel.run`` are timed. LangGraph:
``StateGraph(MessagesState)`` with an agent and a tools node, with ``SqliteSaver`` and
``durability="sync"``, and without a checkpointer; ``invoke`` is timed. Every run has a
fresh database (store) and kernel or graph, built with its connection opened before the
clock starts.

LangGraph is not a dependency of statekernel: it runs in a subprocess
(``bench/anchor_langgraph.py``) under its own venv, ``$BENCH_VENV`` (default:
``<tmpdir>/statekernel-bench-langgraph``), created from
``bench/requirements-langgraph.txt`` when missing; an existing ``$ANCHORS_VENV`` with
LangGraph installed is used instead when ``$BENCH_VENV`` is not set. statekernel runs in
this interpreter. ``--no-langgraph`` leaves the LangGraph side out (no venv, no network):
statekernel's figures alone, and the ratios among its stores; the last example above
runs in seconds. ``--redis URL`` measures ``redis://`` on a running server instead of
one started here (with that server's own persistence settings; the runs' keys are
deleted after each).

Each repetition runs every variant once at one N, in a rotating order, before the next
repetition, and every N is done before the next one, so that the two sides are
measured seconds apart. Figures are medians over the repetitions; a ratio is the median
of the ratios within each repetition. Also printed: bytes stored per turn on SQLite
(after a WAL checkpoint, less an empty database), the growth exponent in N of the bytes
in use in its pages (``dbstat``, which has no page granularity), the
resume of the longest run (statekernel: ``kernel.run(run_id, message)``, which loads the
run once and commits the message with the turn it starts; LangGraph: load the thread,
add the message, one more turn), commits per turn (calls to the store's ``commit``)
and, where ``strace`` is installed, fsync/fdatasync calls per turn at N = 100 (redis:
in the server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from anchor_workload import (
    FINAL_TEXT,
    RESUME_TEXT,
    USER_TEXT,
    call_id,
    tool_arguments,
    tool_output,
)

import statekernel as sk
from statekernel._storage.protocol import Checkpoint, CheckpointStore, Lease, ReleasesWithCommit
from statekernel.stores import open_store
from statekernel.testing import ScriptedProvider, call
from stores import delete_keys

HERE = Path(__file__).resolve().parent
MODEL = "scripted/bench"
SK_KINDS = ("sqlite", "file", "redis", "postgres", "memory")
LG_KINDS = ("lg-sqlite", "lg-none")
LABELS = {
    "sqlite": "statekernel sqlite:// (FULL)",
    "file": "statekernel file://",
    "redis": "statekernel redis:// (AOF always)",
    "postgres": "statekernel postgresql://",
    "memory": "statekernel memory://",
    "lg-sqlite": "LangGraph SqliteSaver (sync)",
    "lg-none": "LangGraph, no checkpointer",
}
FSYNC_N = 100


@sk.tool(inline=True)
def search(query: str, limit: int, page: int) -> str:
    """Search the sources; about 1 KB of results (quick and without I/O: called on the
    event loop, as the LangGraph side calls it in its tools node)."""
    return tool_output(query)


def script(turns: int) -> list[object]:
    """The model's answers for turns 1..turns: tool calls with the same ids and
    arguments as the LangGraph side, then the final text."""
    steps: list[object] = [
        call("search", tool_arguments(t), id=call_id(t)) for t in range(1, turns)
    ]
    return [*steps, FINAL_TEXT]


# -- statekernel side ------------------------------------------------------------------


def count_commits(store: CheckpointStore) -> list[int]:
    """Count the commits: calls to ``store.commit``, and to ``commit_and_release`` where
    the store has it (``ReleasesWithCommit``; the memory store's calls ``commit`` in
    turn, counted once). The instance's methods are wrapped, so the store keeps its
    class, and with it whatever the kernel decides from the class."""
    counter = [0]
    inner = store.commit
    releasing = store.commit_and_release if isinstance(store, ReleasesWithCommit) else None
    depth = [0]

    async def commit(checkpoint: Checkpoint, *, lease: Lease | None = None) -> None:
        counter[0] += depth[0] == 0
        await inner(checkpoint, lease=lease)

    async def commit_and_release(checkpoint: Checkpoint, *, lease: Lease) -> None:
        assert releasing is not None
        counter[0] += 1
        depth[0] += 1
        try:
            await releasing(checkpoint, lease=lease)
        finally:
            depth[0] -= 1

    store.commit = commit  # type: ignore[method-assign]
    if releasing is not None:
        store.commit_and_release = commit_and_release  # type: ignore[method-assign]
    return counter


async def opened(url: str) -> CheckpointStore:
    """The store for ``url`` with its connection or files opened."""
    store: CheckpointStore = open_store(url)
    await store.list_runs(limit=1)
    return store


@dataclass
class Sample:
    seconds: float
    cpu: float
    commits: int = 0
    bytes: int | None = None
    used: int | None = None


async def sk_run(url: str, turns: int) -> tuple[Sample, str]:
    """One run of ``turns`` turns; the clock covers ``kernel.start`` and ``kernel.run``."""
    store = await opened(url)
    commits = count_commits(store)
    provider = ScriptedProvider(script(turns))
    kernel = sk.Kernel(store, tools=[search], providers={"scripted": provider}, max_turns=None)
    gc.collect()
    cpu = time.process_time()
    began = time.perf_counter()
    run = await kernel.start(model=MODEL, messages=[USER_TEXT])
    async for _ in kernel.run(run.run_id):
        pass
    seconds = time.perf_counter() - began
    cpu = time.process_time() - cpu
    final = await store.load(run.run_id)
    assert final.state == "completed", final.state
    assert len(final.turns) == turns, len(final.turns)
    await kernel.aclose()
    await store.aclose()
    return Sample(seconds, cpu, commits[0]), run.run_id


async def sk_resume(url: str, run_id: str) -> float:
    """Seconds to load the run, send one user message and drive one persisted turn."""
    store = await opened(url)
    provider = ScriptedProvider([FINAL_TEXT], repeat_last=True)
    kernel = sk.Kernel(store, tools=[search], providers={"scripted": provider}, max_turns=None)
    gc.collect()
    began = time.perf_counter()
    async for _ in kernel.run(run_id, RESUME_TEXT):  # one load; the input joins the turn
        pass
    seconds = time.perf_counter() - began
    final = await store.load(run_id)
    assert final.state == "completed", final.state
    await kernel.aclose()
    await store.aclose()
    return seconds


def sqlite_bytes(db: Path) -> tuple[int, int | None]:
    """Bytes of a SQLite database and its WAL after a checkpoint of the WAL, and the
    bytes in use in its pages (``dbstat``; None where SQLite is built without it)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        try:
            used: int | None = conn.execute("SELECT sum(pgsize - unused) FROM dbstat").fetchone()[0]
        except sqlite3.OperationalError:
            used = None
    disk = sum(p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists())
    return disk, used


async def empty_sqlite_bytes(folder: Path) -> tuple[int, int | None]:
    """``sqlite_bytes`` of a statekernel SQLite database with its schema and no run."""
    db = folder / "empty.db"
    store = await opened(f"sqlite:///{db}")
    await store.aclose()
    return sqlite_bytes(db)


# -- processes -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def redis_args(port: int, folder: Path) -> list[str]:
    return [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(folder),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ]


def wait_for_redis(port: int, proc: subprocess.Popen[bytes]) -> None:
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        with contextlib.suppress(redis.ConnectionError):
            client.ping()
            client.close()
            return
        time.sleep(0.05)
    raise RuntimeError("redis-server did not answer")


@contextlib.contextmanager
def redis_server(folder: Path, wrap: list[str] | None = None) -> Iterator[int]:
    """A redis-server on a free loopback port (``wrap``: a command it runs under); its port."""
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [*(wrap or []), *redis_args(port, folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_redis(port, proc)
        yield port
    finally:
        stop_redis(port, proc)


def stop_redis(port: int, proc: subprocess.Popen[bytes]) -> None:
    """SHUTDOWN (so that a server under strace ends, and strace with it), else SIGTERM."""
    import redis

    with contextlib.suppress(redis.RedisError), contextlib.closing(redis.Redis(port=port)) as c:
        c.shutdown(nosave=True)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=10)


def venv_python() -> Path:
    """The python of the LangGraph venv, created and filled on first use."""
    ready = "import langgraph.checkpoint.sqlite, langchain_core"
    chosen = os.environ.get("BENCH_VENV")
    anchors = os.environ.get("ANCHORS_VENV")
    if not chosen and anchors:
        python = Path(anchors) / "bin" / "python"
        if python.exists() and subprocess.run([python, "-c", ready], check=False).returncode == 0:
            return python
    venv = Path(chosen or Path(tempfile.gettempdir()) / "statekernel-bench-langgraph")
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if subprocess.run([python, "-c", ready], check=False, capture_output=True).returncode:
        print(f"installing LangGraph into {venv} ...", flush=True)
        requirements = HERE / "requirements-langgraph.txt"
        pip = [str(python), "-m", "pip", "install", "-q", "-r", str(requirements)]
        subprocess.run(pip, check=True)
    return python


class LangGraphSide:
    """The LangGraph process: one JSON command a line in, one JSON answer a line out."""

    def __init__(self, python: Path) -> None:
        self.proc = subprocess.Popen(
            [python, HERE / "anchor_langgraph.py"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.version = self._read()["langgraph"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the LangGraph process ended ({self.proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def strace_fsyncs(command: list[str], out: Path) -> int:
    """fsync + fdatasync calls of ``command`` and its threads and children."""
    trace = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(out)]
    subprocess.run([*trace, *command], check=True, stdout=subprocess.DEVNULL)
    return parse_strace(out)


def parse_strace(out: Path) -> int:
    calls = 0
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync"):
            calls += int(parts[3])
    return calls


# -- the sweep -------------------------------------------------------------------------


@dataclass
class Results:
    samples: dict[tuple[str, int], list[Sample]] = field(default_factory=dict)
    ratios: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    resume: dict[str, list[float]] = field(default_factory=dict)
    fsyncs: dict[str, float] = field(default_factory=dict)
    empty: dict[str, int] = field(default_factory=dict)
    empty_used: int | None = None

    def add(self, kind: str, n: int, sample: Sample) -> None:
        self.samples.setdefault((kind, n), []).append(sample)

    def ms(self, kind: str, n: int) -> float | None:
        samples = self.samples.get((kind, n))
        return statistics.median(s.seconds for s in samples) * 1e3 / n if samples else None


RATIOS: dict[str, tuple[str, str]] = {
    "sqlite/lg": ("sqlite", "lg-sqlite"),
    "memory/lg-none": ("memory", "lg-none"),
    "file/sqlite": ("file", "sqlite"),
}


class Bench:
    def __init__(self, folder: Path, lg: LangGraphSide | None) -> None:
        self.folder = folder
        self.lg = lg  # None: the LangGraph side is left out
        self.redis: str | None = None  # the redis-server's base URL
        self.postgres: str | None = None  # a database's URL (--postgres)
        self.results = Results()
        self.kept: dict[str, tuple[str, str]] = {}  # kind -> (store URL or DB, run id)

    def url(self, kind: str, name: str) -> str:
        place = self.folder / name
        if kind == "sqlite":
            place.mkdir()
            return f"sqlite:///{place}/runs.db"
        if kind == "file":
            return f"file://{place}"
        if kind == "redis":
            return f"{self.redis}/0?prefix={name}"
        if kind == "postgres":
            assert self.postgres is not None
            joint = "&" if "?" in self.postgres else "?"
            return f"{self.postgres}{joint}schema={name.replace('-', '_')}"
        return f"memory://{name}"

    def kinds(self) -> list[str]:
        servers = {"redis": self.redis, "postgres": self.postgres}
        kinds = [k for k in SK_KINDS if servers.get(k, "") is not None]
        return [*kinds, *LG_KINDS] if self.lg is not None else kinds

    def measure(self, kind: str, n: int, keep: bool) -> Sample:
        name = f"{kind}-{n}-{uuid.uuid4().hex[:8]}"
        if kind.startswith("lg-"):
            assert self.lg is not None
            db = self.folder / f"{name}.db"
            answer = self.lg.ask(op="run", variant=kind[3:], n=n, db=str(db))
            sample = Sample(answer["seconds"], answer["cpu"], bytes=answer["bytes"])
            if keep and kind == "lg-sqlite":
                self.kept[kind] = (str(db), "")
            else:
                for path in self.folder.glob(f"{name}.db*"):
                    path.unlink()
            return sample
        url = self.url(kind, name)
        sample, run_id = asyncio.run(sk_run(url, n))
        if kind == "sqlite":
            sample.bytes, sample.used = sqlite_bytes(self.folder / name / "runs.db")
        if keep and kind == "sqlite":
            self.kept[kind] = (url, run_id)
        elif kind == "memory":
            asyncio.run(open_store(url).delete(run_id))
        elif kind == "redis":
            delete_keys(url)
        elif kind == "postgres":
            assert self.postgres is not None
            drop_schema(self.postgres, name.replace("-", "_"))
        else:
            shutil.rmtree(self.folder / name, ignore_errors=True)
        return sample

    def sweep(self, ns: list[int], reps: dict[int, int]) -> None:
        kinds = self.kinds()
        for kind in kinds:  # warm-up: imports, caches, the first connection
            self.measure(kind, 10, keep=False)
        for n in ns:
            for rep in range(reps[n]):
                order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
                last = rep == reps[n] - 1 and n == ns[-1]
                this: dict[str, Sample] = {}
                for kind in order:
                    this[kind] = self.measure(kind, n, keep=last)
                    self.results.add(kind, n, this[kind])
                for name, (top, bottom) in RATIOS.items():
                    if top in this and bottom in this:
                        ratio = this[top].seconds / this[bottom].seconds
                        self.results.ratios.setdefault((name, n), []).append(ratio)
            print(f"  N={n} done, load average {load()}", flush=True)

    def resume(self, reps: int) -> None:
        url, run_id = self.kept["sqlite"]
        for _ in range(reps):
            sk_seconds = asyncio.run(sk_resume(url, run_id))
            self.results.resume.setdefault("sqlite", []).append(sk_seconds)
            if self.lg is not None:
                db, _ = self.kept["lg-sqlite"]
                lg_seconds = self.lg.ask(op="resume", db=db)["seconds"]
                self.results.resume.setdefault("lg-sqlite", []).append(lg_seconds)

    def fsyncs(self, lg_python: Path | None) -> None:
        out = self.folder / "strace.txt"
        for kind in ("sqlite", "file"):
            url = self.url(kind, f"strace-{kind}")
            command = [sys.executable, str(HERE / "anchor.py"), "--one-run", url, str(FSYNC_N)]
            self.results.fsyncs[kind] = strace_fsyncs(command, out) / FSYNC_N
        if self.redis is not None and shutil.which("redis-server"):
            trace = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(out)]
            with redis_server(self.folder / "strace-redis", wrap=trace) as port:
                url = f"redis://127.0.0.1:{port}/0?prefix=strace"
                command = [sys.executable, str(HERE / "anchor.py"), "--one-run", url, str(FSYNC_N)]
                subprocess.run(command, check=True)
            self.results.fsyncs["redis"] = parse_strace(out) / FSYNC_N
        if lg_python is not None:
            db = self.folder / "strace-lg.db"
            lg = [str(lg_python), str(HERE / "anchor_langgraph.py"), "once", str(FSYNC_N), str(db)]
            self.results.fsyncs["lg-sqlite"] = strace_fsyncs(lg, out) / FSYNC_N


def drop_schema(url: str, schema: str) -> None:
    """Drop a measurement's schema (its tables and runs) from the database at ``url``."""
    import asyncpg

    from statekernel.stores.postgres._url import parse_postgres_url

    async def drop() -> None:
        conn = await asyncpg.connect(parse_postgres_url(url).dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the report ------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def table(
    results: Results, ns: list[int], kinds: list[str], labels: dict[str, str] = LABELS
) -> list[str]:
    top = ns[-1]
    heads = [*(f"N={n}" for n in ns), f"CPU@{top}", f"B/turn@{top}", "commits/turn", "fsyncs/turn"]
    rows = [["ms per turn (median)", *heads]]
    for kind in kinds:
        row = [labels[kind], *(fmt(results.ms(kind, n)) for n in ns)]
        samples = results.samples[(kind, top)]
        row.append(fmt(statistics.median(s.cpu for s in samples) * 1e3 / top))
        stored = [s.bytes for s in samples if s.bytes is not None]
        net = statistics.median(stored) - results.empty.get(kind, 0) if stored else None
        row.append(fmt(net / top if net is not None else None))
        commits = [s.commits for s in samples if s.commits]
        row.append(fmt(statistics.median(commits) / top if commits else None))
        row.append(fmt(results.fsyncs.get(kind)))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        cells = [
            row[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)),
        ]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("-" * len(lines[0]))
    return lines


def verdict(value: float | None, target: float) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} {'PASS' if value <= target else 'MISS'}"


def ratio_lines(results: Results, ns: list[int], langgraph: bool = True) -> list[str]:
    """One line per target: what, target, value, PASS or MISS (``langgraph``: with the
    targets against LangGraph)."""

    def ratio(name: str, n: int) -> float | None:
        values = results.ratios.get((name, n))
        return statistics.median(values) if values else None

    out: list[tuple[str, float, float | None]] = []
    for n in ns if langgraph else []:
        target = 0.1 if n >= 1000 else 0.5
        out.append(
            (f"sqlite:// turn / LangGraph SqliteSaver turn, N={n}", target, ratio("sqlite/lg", n))
        )
    for n in ns if langgraph else []:
        out.append(
            (f"memory:// turn / LangGraph no checkpointer, N={n}", 1.0, ratio("memory/lg-none", n))
        )
    for n in ns:
        out.append((f"file:// turn / sqlite:// turn, N={n}", 1.5, ratio("file/sqlite", n)))
    top = ns[-1]
    disk = net_bytes(results, "sqlite", top)
    kb = disk / top / 1e3 if disk is not None else None
    out.append((f"sqlite:// KB stored per turn, N={top}", 2.5, kb))
    if len(ns) >= 2:
        low = ns[-2]
        a, b = used_bytes(results, low), used_bytes(results, top)
        exponent = math.log(b / a) / math.log(top / low) if a and b else None
        out.append((f"growth exponent of sqlite:// bytes in N, {low}..{top}", 1.02, exponent))
    if "lg-sqlite" in results.resume:
        sk_runs, lg_runs = results.resume["sqlite"], results.resume["lg-sqlite"]
        pairs = statistics.median(a / b for a, b in zip(sk_runs, lg_runs, strict=True))
        sk_ms, lg_ms = statistics.median(sk_runs) * 1e3, statistics.median(lg_runs) * 1e3
        what = f"resume of a {top}-turn run, sqlite:// / SqliteSaver ({sk_ms:.1f} / {lg_ms:.1f} ms)"
        out.append((what, 0.5, pairs))
    width = max(len(what) for what, _, _ in out)
    lines = []
    for what, target, value in out:
        result = "-" if value is None else f"{value:.3f}  {'PASS' if value <= target else 'MISS'}"
        lines.append(f"{what.ljust(width)}  target <= {target:<4}  {result}")
    return lines


def used_bytes(results: Results, n: int) -> float | None:
    """Median bytes in use in the pages of the SQLite runs at ``n``, less an empty database
    (free of the page granularity of the file size; the file size where dbstat is missing)."""
    used = [s.used for s in results.samples.get(("sqlite", n), []) if s.used is not None]
    if not used or results.empty_used is None:
        return net_bytes(results, "sqlite", n)
    return statistics.median(used) - results.empty_used


def net_bytes(results: Results, kind: str, n: int) -> float | None:
    """Median bytes stored by the runs of ``kind`` at ``n``, less an empty database."""
    stored = [s.bytes for s in results.samples.get((kind, n), []) if s.bytes is not None]
    return statistics.median(stored) - results.empty.get(kind, 0) if stored else None


# -- main ------------------------------------------------------------------------------


def one_run(url: str, turns: int) -> None:
    """One run in this process (what ``strace`` watches)."""
    asyncio.run(sk_run(url, turns))


def parse_reps(text: str) -> dict[int, int]:
    return {int(n): int(r) for n, r in (item.split(":") for item in text.split(","))}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 10, 100 only")
    parser.add_argument("--reps", type=parse_reps, default=None, help="e.g. 10:7,100:5,1000:3")
    parser.add_argument("--resume-reps", type=int, default=3)
    parser.add_argument("--no-fsyncs", action="store_true", help="do not count fsyncs")
    parser.add_argument(
        "--no-langgraph", action="store_true", help="statekernel alone (no LangGraph venv)"
    )
    parser.add_argument("--redis", metavar="URL", help="a running redis-server's base URL")
    parser.add_argument(
        "--postgres", metavar="URL", help="a PostgreSQL database to measure postgresql:// on"
    )
    parser.add_argument("--one-run", nargs=2, metavar=("URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run:
        one_run(args.one_run[0], int(args.one_run[1]))
        return
    reps = args.reps or ({10: 5, 100: 3} if args.quick else {10: 7, 100: 5, 1000: 3})
    ns = sorted(reps)
    began = time.perf_counter()
    print(f"load average at start: {load()} ({os.cpu_count()} CPUs)", flush=True)
    lg_python = None if args.no_langgraph else venv_python()
    folder = Path(tempfile.mkdtemp(prefix="statekernel-bench-"))
    lg = None if lg_python is None else LangGraphSide(lg_python)
    try:
        bench = Bench(folder, lg)
        with contextlib.ExitStack() as stack:
            bench.postgres = args.postgres
            if args.redis:
                bench.redis = args.redis.rstrip("/")
            elif shutil.which("redis-server"):
                port = stack.enter_context(redis_server(folder / "redis"))
                bench.redis = f"redis://127.0.0.1:{port}"
            disk, used = asyncio.run(empty_sqlite_bytes(folder))
            bench.results.empty["sqlite"], bench.results.empty_used = disk, used
            if lg is not None:
                empty = lg.ask(op="empty", db=str(folder / "lg-empty.db"))
                bench.results.empty["lg-sqlite"] = empty["bytes"]
            print(
                "runs per variant: " + ", ".join(f"{r} at N={n}" for n, r in reps.items()),
                flush=True,
            )
            bench.sweep(ns, reps)
            bench.resume(args.resume_reps)
            strace = shutil.which("strace")
            if strace and not args.no_fsyncs:
                bench.fsyncs(lg_python)
            kinds = bench.kinds()
    finally:
        if lg is not None:
            lg.close()
        shutil.rmtree(folder, ignore_errors=True)
    print()
    other = f"LangGraph {lg.version}" if lg is not None else "LangGraph left out (--no-langgraph)"
    print(
        f"statekernel {version('statekernel')} (python {sys.version.split()[0]}), "
        f"{other}; medians of " + ", ".join(f"{r} runs at N={n}" for n, r in reps.items())
    )
    labels = LABELS
    if args.redis:  # a server of its own settings
        labels = {**LABELS, "redis": "statekernel redis:// (given server)"}
    for line in table(bench.results, ns, kinds, labels):
        print(line)
    print()
    for line in ratio_lines(bench.results, ns, langgraph=lg is not None):
        print(line)
    notes = ["B/turn: bytes on disk after a WAL checkpoint, less an empty database"]
    if len(ns) >= 2:
        notes.append(
            "growth exponent: of the bytes in use in the pages (dbstat), less an empty one"
        )
    if not shutil.which("strace"):
        notes.append("fsyncs/turn: not counted, strace is not installed")
    elif args.no_fsyncs:
        notes.append("fsyncs/turn: not counted (--no-fsyncs)")
    else:
        notes.append(f"fsyncs/turn: fsync + fdatasync at N={FSYNC_N} under strace (redis: server)")
    if bench.redis is None:
        notes.append("redis: not measured, redis-server is not installed")
    if bench.postgres is None:
        notes.append("postgres: not measured (--postgres URL measures it)")
    else:
        notes.append("postgres: the given server's own settings (synchronous_commit, fsync)")
    if lg is None:
        resume_ms = statistics.median(bench.results.resume["sqlite"]) * 1e3
        notes.append(
            f"LangGraph: left out (--no-langgraph), so no ratio to it; resume of a {ns[-1]}-turn"
            f" run on sqlite:// alone: {resume_ms:.1f} ms"
        )
    print()
    for note in notes:
        print(note)
    print(f"load average at end: {load()}; {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
