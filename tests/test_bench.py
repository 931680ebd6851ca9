"""Every benchmark of ``bench/`` runs once at a tiny size and prints its figures.

Each script runs in a subprocess, as ``python bench/NAME.py`` would, with the size
options that make it take seconds, on the tests' own servers where it needs one
(``--redis``). What is checked is what the bench is meant to print (its header, its
rows and ratio lines, each figure parsed as a number), never how fast anything was:
the figures of a tiny run on a shared machine say nothing but that the bench still
measures, so a time or a ratio of times is only checked to be a figure (not negative:
a fast machine may round it to 0), while counts and bytes are checked for what they
must be. A bench given a running server leaves no key of its own on it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
HUNG = 600.0
"""Seconds after which a bench that should have ended is taken for hung."""
NUMBER = r"(-?[\d,]*\.?\d+)"
"""A figure as the benches print it (``1,234``, ``0.52``, ``-0.07``)."""

HELPERS = {"anchor_langgraph.py", "anchor_workload.py", "stores_workload.py"}
"""The modules of ``bench/`` that are no bench: workloads, and the LangGraph side of
``anchor.py`` (it needs LangGraph's venv, which ``--no-langgraph`` leaves out)."""

pytestmark = pytest.mark.bench


def run_bench(name: str, *args: str, folder: Path) -> str:
    """Run ``bench/<name>`` with ``args`` (temporary files in ``folder``); what it printed
    (it must succeed)."""
    env = {**os.environ, "TMPDIR": str(folder), "PYTHONIOENCODING": "utf-8"}
    result = subprocess.run(
        [sys.executable, str(BENCH / name), *args],
        cwd=folder,
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=HUNG,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def figures(pattern: str, text: str) -> list[float]:
    """The numbers in the groups of ``pattern``, which a line of ``text`` must match."""
    match = re.search(pattern, text, re.M)
    assert match is not None, f"no line matches {pattern!r} in:\n{text}"
    return [float(group.replace(",", "")) for group in match.groups()]


def figure(pattern: str, text: str) -> float:
    """The number in the one group of ``pattern``, which a line of ``text`` must match."""
    (value,) = figures(pattern, text)
    return value


def cells(label: str, text: str) -> list[str]:
    """The cells after ``label`` of the table row that starts with it."""
    rows = [line for line in text.splitlines() if line.startswith(label + " ")]
    assert len(rows) == 1, f"{len(rows)} rows start with {label!r} in:\n{text}"
    return rows[0][len(label) :].split()


def number(cell: str) -> float:
    """A table cell's figure (``-`` is none: the test fails)."""
    assert re.fullmatch(NUMBER, cell), cell
    return float(cell.replace(",", ""))


def keys(redis_url: str) -> set[bytes]:
    """Every key of the test server's database 0."""
    client = redis.Redis.from_url(f"{redis_url}/0")
    try:
        return set(client.scan_iter(count=1000))
    finally:
        client.close()


@pytest.fixture
def bench_redis(redis_url: str) -> Iterator[str]:
    """The test server's base URL for a bench's ``--redis``; the bench must leave no key
    of its own behind."""
    before = keys(redis_url)
    yield redis_url
    assert keys(redis_url) - before == set()


def pg_schemas(url: str) -> set[str]:
    """The schemas a bench made in the tests' database (``postgres_*``, ``bench_*``)."""
    import asyncio

    import asyncpg

    async def names() -> set[str]:
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'postgres\\_%'"
                " OR nspname LIKE 'bench\\_%'"
            )
            return {row["nspname"] for row in rows}
        finally:
            await conn.close()

    return asyncio.run(names())


def test_every_bench_runs_here() -> None:
    ran = set(re.findall(r'run_bench\(\s*"(\w+\.py)"', Path(__file__).read_text()))
    assert {path.name for path in BENCH.glob("*.py")} - HELPERS == ran


@pytest.mark.redis
@pytest.mark.postgres
def test_anchor_measures_statekernel_alone_without_langgraph(
    bench_redis: str, postgres_url: str, tmp_path: Path
) -> None:
    args = ["--no-langgraph", "--reps", "3:1,5:1", "--resume-reps", "1", "--no-fsyncs"]
    args += ["--postgres", postgres_url]
    out = run_bench("anchor.py", *args, "--redis", bench_redis, folder=tmp_path)
    assert pg_schemas(postgres_url) == set(), "a measurement's schema was left behind"
    assert re.search(r"^statekernel .*, LangGraph left out \(--no-langgraph\); medians", out, re.M)
    assert "LangGraph SqliteSaver" not in out
    assert "LangGraph, no checkpointer" not in out
    head = cells("ms per turn (median)", out)
    assert head == ["N=3", "N=5", "CPU@5", "B/turn@5", "commits/turn", "fsyncs/turn"]
    commits = set()
    labels = ("sqlite:// (FULL)", "file://", "redis:// (given server)", "postgresql://")
    for label in (*labels, "memory://"):
        row = cells(f"statekernel {label}", out)
        assert all(number(ms) >= 0 for ms in row[:3]), row
        commits.add(number(row[4]))
    assert len(commits) == 1, commits  # every store commits alike
    assert commits.pop() > 0
    for n in (3, 5):
        ratio = (
            rf"^file:// turn / sqlite:// turn, N={n}\s+target <= 1\.5\s+{NUMBER}  (?:PASS|MISS)$"
        )
        assert figure(ratio, out) >= 0
    figure(rf"^sqlite:// KB stored per turn, N=5\s+target <= 2\.5\s+{NUMBER}", out)
    figure(rf"^growth exponent of sqlite:// bytes in N, 3\.\.5\s+target <= 1\.02\s+{NUMBER}", out)
    resume = rf"^LangGraph: left out \(--no-langgraph\), .* 5-turn run on sqlite:// alone: {NUMBER}"
    assert figure(resume, out) >= 0


def test_group_commit_prints_throughput_and_grouping(tmp_path: Path) -> None:
    out = run_bench(
        "group_commit.py", "--runs", "3", "--turns", "2", "--latency", "0", folder=tmp_path
    )
    assert out.startswith("3 runs x 2 turns, model latency 0 ms\n")
    line = rf"^ *{{}}: +{NUMBER} turns/s  \({NUMBER} s\)  {NUMBER} commits/turn"
    memory = figures(line.format("memory"), out)
    sqlite = figures(line.format("sqlite"), out)
    assert min(memory + sqlite) >= 0
    assert memory[2] == sqlite[2] > 0  # commits per turn: the same on both stores
    batches = rf"^ *sqlite: .* commits/turn  {NUMBER} transactions, {NUMBER} commits each"
    transactions, per_transaction = figures(batches, out)
    assert transactions >= 1
    assert per_transaction >= 1
    assert figure(rf"^durable throughput: {NUMBER}x memory://$", out) >= 0


def test_kernel_overhead_prints_cost_per_turn_and_flatness(tmp_path: Path) -> None:
    out = run_bench("kernel_overhead.py", "--repeats", "1", "--turns", "2,4", folder=tmp_path)
    lines = out.splitlines()
    assert lines[0].split() == ["turns", "us/turn", "us/commit", "commits"]
    rows = {int(line.split()[0]): [number(c) for c in line.split()[1:]] for line in lines[1:3]}
    assert sorted(rows) == [2, 4]
    assert all(value >= 0 for row in rows.values() for value in row)
    assert rows[4][2] > rows[2][2] > 0  # commits: a longer run has more
    assert figure(rf"^per-turn cost at N=4 / N=2: {NUMBER} \(1\.0 = flat in N\)", out) >= 0


def test_lifecycle_prints_the_table_against_the_engine(tmp_path: Path) -> None:
    out = run_bench("lifecycle.py", "--repeats", "1", "--turns", "2", folder=tmp_path)
    assert out.startswith("2 turns, 10 events per run, medians of 1 runs\n")
    for name in ("Lifecycle (table)", "LibraryLifecycle (engine)"):
        per_event, build = (number(c) for c in cells(name, out))
        assert per_event >= 0
        assert build >= 0
    assert number(cells("_transitions functions only", out)[0]) >= 0
    assert figure(rf"^engine / table per event: {NUMBER}x$", out) >= 0


@pytest.mark.redis
def test_long_runs_prints_memory_bytes_and_times_per_store(
    bench_redis: str, tmp_path: Path
) -> None:
    args = ["--turns", "3,6", "--redis", bench_redis]
    out = run_bench("long_runs.py", *args, folder=tmp_path)
    head = "store N live MB x pay loaded MB x pay KB/turn ms/turn load ms resume ms"
    assert head.split() in (line.split() for line in out.splitlines())
    for store in ("memory", "sqlite", "redis"):
        for n in (3, 6):
            row = cells(f"{store:8} {n:6}", out)
            live, loaded, stored, times = row[:2], row[2:4], row[4], row[5:]
            if store == "memory":
                assert number(live[1]) > 0  # the live run's memory, x payload
                assert stored == "-"
            else:
                assert live == ["-", "-"]
                assert number(stored) > 0  # KB per turn
            assert number(loaded[1]) > 0  # the loaded run's memory, x payload
            assert all(number(t) >= 0 for t in times)
        figure(rf"^  {store:8} live \S+  loaded {NUMBER}  stored total", out)
        assert figure(rf"^  {store:8} load +{NUMBER}  resume", out) >= 0
        assert figure(rf"^  {store:8} load +[\d.]+  resume +{NUMBER}$", out) >= 0
    assert "6 / 3 turns (linear: 2; target: 2.4):" in out


def test_providers_prints_the_sdk_against_the_provider(tmp_path: Path) -> None:
    out = run_bench("providers.py", "--chunks", "100", "--rounds", "1", folder=tmp_path)
    assert figure(rf"^100 chunks, {NUMBER} MB, median of 1 rounds$", out) >= 0
    assert cells("consumer", out) == ["total", "ms", "chunks/s", "us/chunk", "over", "raw"]
    for name in ("raw bytes", "statekernel", "openai SDK"):
        row = [number(c) for c in cells(name, out)]
        assert all(value >= 0 for value in row[:3]), row
    ratio = rf"^SDK time / statekernel time: {NUMBER} \(above 1: statekernel is faster\)$"
    assert figure(ratio, out) >= 0


def test_stored_format_prints_cpu_per_commit(tmp_path: Path) -> None:
    out = run_bench("stored_format.py", "--repeats", "1", folder=tmp_path)
    commits = figure(rf"^{NUMBER} commits of a 20-turn run, best of 1, CPU µs:$", out)
    assert commits > 20  # two a turn
    assert figure(rf"^  encode_commit +{NUMBER} per commit$", out) >= 0
    assert figure(rf"^  decode the run +{NUMBER} per run \([\d.]+ per commit\)$", out) >= 0
    assert figure(rf"^  decode its events +{NUMBER} per commit$", out) >= 0


@pytest.mark.redis
def test_stores_prints_costs_per_store_and_growth(bench_redis: str, tmp_path: Path) -> None:
    out = run_bench("stores.py", "--turns", "2,4", "--redis", bench_redis, folder=tmp_path)
    for kind in ("memory", "file", "sqlite", "redis"):
        for n in (2, 4):
            line = rf"^ *{kind} N={n} +commit +{NUMBER} ms  turn +{NUMBER} ms"
            commit, turn, payload = figures(line + rf"  payload +{NUMBER} B/turn", out)
            assert min(commit, turn) >= 0
            assert payload > 0
        assert figure(rf"^ *{kind} N=4 .*  load +{NUMBER} ms$", out) >= 0
        what = "payload" if kind == "memory" else "stored bytes"
        figure(rf"^ *{kind} growth exponent of {what} in N \(2 -> 4\): {NUMBER}$", out)
    for kind in ("file", "sqlite", "redis"):
        assert figure(rf"^ *{kind} N=4 .*  stored +{NUMBER} B/turn", out) > 0
    assert figure(rf"^ *sqlite N=4 .*  raw insert +[\d.]+ ms \(x{NUMBER}\)", out) >= 0
    assert figure(rf"^ *sqlite N=4 .*  via thread +[\d.]+ ms \(x{NUMBER}\)", out) >= 0
    assert "load of the 4-turn run <= 20 ms" in out


@pytest.mark.postgres
def test_postgres_prints_group_commit_notices_and_workers(
    postgres_url: str, tmp_path: Path
) -> None:
    args = ["--runs", "4", "--turns", "2", "--latency", "0", "--workers", "1", "2"]
    args += ["--concurrency", "4", "--postgres", postgres_url]
    out = run_bench("postgres.py", *args, folder=tmp_path)
    assert out.startswith("4 runs x 2 turns, model latency 0 ms")
    assert cells("one process", out)[:3] == ["turns/s", "commits/turn", "xacts/turn"]
    for label in ("notices on", "notices off"):
        row = cells(f"  {label}", out)
        assert number(row[1]) > 0  # commits per turn
        assert all(number(c) >= 0 for c in row[:3] + row[4:5]), row  # times, counts, CPU
    figures(rf"^commit notices: turns/s x{NUMBER} without them, client CPU x{NUMBER}", out)
    for n in (1, 2):
        row = cells(f"{n:7}", out)
        assert all(number(c) >= 0 for c in row[:4]), row
        assert row[4] in ("PASS", "MISS")
    assert pg_schemas(postgres_url) == set(), "a measurement's schema was left behind"


def pg_databases(url: str) -> set[str]:
    """The databases a bench made on the tests' server (``bench_*``)."""
    import asyncio

    import asyncpg

    async def names() -> set[str]:
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch(
                "SELECT datname FROM pg_database WHERE datname LIKE 'bench\\_%'"
            )
            return {row["datname"] for row in rows}
        finally:
            await conn.close()

    return asyncio.run(names())


@pytest.mark.postgres
@pytest.mark.xdist_group("temporal")
def test_engines_prints_each_runner_beside_the_builtin_workers(
    postgres_url: str, tmp_path: Path
) -> None:
    args = ["--runs", "3", "--turns", "2", "--latency", "0", "--single", "2"]
    args += ["--concurrency", "2", "--postgres", postgres_url]
    databases = pg_databases(postgres_url)
    out = run_bench("engines.py", *args, folder=tmp_path)
    assert out.startswith("3 runs x 2 turns, model latency 0 ms, concurrency 2")
    assert cells("runner", out)[:3] == ["turns/s", "x", "builtin"]
    for runner in ("builtin", "dbos", "temporal"):  # the test extra has both engines
        row = cells(f"{runner:8}", out)
        assert len(row) == 7, row
        assert number(row[0]) > 0  # turns/s
        assert all(number(c) >= 0 for c in row[2:4] + row[5:]), row  # times, CPU
        number(row[4])  # added latency: a difference of times, either sign on a loaded machine
    assert number(cells("builtin ", out)[1]) == 1.0
    assert pg_schemas(postgres_url) == set(), "a measurement's schema was left behind"
    assert pg_databases(postgres_url) == databases, "DBOS's system database was left behind"


@pytest.mark.postgres
def test_pg_notices_prints_commits_per_second_per_setting(
    postgres_url: str, tmp_path: Path
) -> None:
    args = ["--clients", "2", "--commits", "3", "--rounds", "1", "--postgres", postgres_url]
    out = run_bench("pg_notices.py", *args, folder=tmp_path)
    assert out.startswith("2 clients x 3 commits, 1 rounds")
    for label in ("store clients (processes):", "bare updates:"):
        part = out.split(label, 1)[1]
        for setting in ("unwatched", "watched", "notify=0"):
            assert figures(rf"^  {setting} +({NUMBER}) commits/s", part)[0] > 0
        assert figures(rf"^  unwatched / watched: x({NUMBER})", part)[0] > 0
    assert pg_schemas(postgres_url) == set(), "a measurement's schema was left behind"


@pytest.mark.redis
def test_workers_prints_throughput_per_worker_count(bench_redis: str, tmp_path: Path) -> None:
    args = ["--runs", "4", "--turns", "2", "--latency", "0", "--workers", "1"]
    args += ["--concurrency", "4", "--redis", bench_redis]
    out = run_bench("workers.py", *args, folder=tmp_path)
    assert out.startswith("4 runs x 2 turns (text), model latency 0 ms, concurrency 4 per worker")
    assert cells("workers", out)[:3] == ["completed", "runs/s", "turns/s"]
    row = cells("      1", out)
    assert number(row[0]) == 4  # every run completed
    assert row[3] == "100%"  # one worker against itself
    assert all(number(c) >= 0 for c in row[1:3] + row[4:])  # runs/s ... ceiling turns/s


def test_web_list_prints_the_list_page_times(tmp_path: Path) -> None:
    out = run_bench("web_list.py", "--runs", "60", "--repeats", "2", folder=tmp_path)
    assert re.search(r"^web list: 60 runs in a SQLite store", out, re.M)
    assert figures(r"^GET / +(\d+) rows +median " + NUMBER + " ms +slowest " + NUMBER, out)[0] == 50
    paused = figures(r"^GET /\?state=paused +(\d+) rows +median " + NUMBER + " ms", out)
    assert paused[0] == 6
    assert figures(r"^second page +(\d+) rows +median " + NUMBER + " ms", out)[0] == 10


def test_short_runs_prints_start_and_run_beside_start_and_run(tmp_path: Path) -> None:
    out = run_bench("short_runs.py", "--repeats", "1", "--turns", "1,2", folder=tmp_path)
    assert cells("ms per run (median)", out) == ["turns", "start+run", "together", "ratio"]
    for label in ("sqlite://", "file://", "memory://"):
        rows = [line.split() for line in out.splitlines() if line.startswith(label + " ")]
        assert [row[1] for row in rows] == ["1", "2"], out
        for row in rows:
            assert all(number(cell) >= 0 for cell in row[2:]), row
    assert "ratio = start_and_run / (start + run)" in out
    assert not list(tmp_path.glob("short-runs-*")), "the bench left its stores behind"
