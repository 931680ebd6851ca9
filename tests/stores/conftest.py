"""Fixtures of the store tests: extra redis-servers (with a password, with TLS), a
Postgres role with a password."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import redis as redis_sync

from statekernel.testing import redis_server_path
from statekernel.testing._servers import start_redis, stop_server

REDIS_PASSWORD = "pw-RECOGNISABLE-7f3a9c"
"""The password of the ``redis_password_url`` server (tests look for it in stored bytes)."""

PG_PASSWORD = "pg-PASS-hunt-4e8b1d"
"""The password of the ``postgres_password_url`` role (tests look for it everywhere)."""


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(folder: Path, args: list[str], url: str, **client: object) -> subprocess.Popen[bytes]:
    """Start a redis-server (persistence off) with ``args``; return once ``url`` answers."""
    binary = redis_server_path()
    assert binary is not None, "server_dir skips when there is no redis-server"
    base = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [*base, "--dir", str(folder), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    conn = redis_sync.Redis.from_url(url, **client)
    try:
        while True:
            try:
                conn.ping()
                return proc
            except redis_sync.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise
                time.sleep(0.05)
    finally:
        conn.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server started by ``serve``."""
    stop_server(proc)


@pytest.fixture(scope="session")
def server_dir(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Path:
    """A folder for extra servers (needs what ``redis_url`` needs: a redis-server)."""
    if redis_server_path() is None:
        pytest.skip("redis-server not found (REDIS_URL servers cannot be reconfigured)")
    return tmp_path_factory.mktemp("redis-extra")


@pytest.fixture(scope="session")
def redis_password_url(server_dir: Path) -> Iterator[str]:
    """A redis-server that requires ``REDIS_PASSWORD``; its URL without the password."""
    args = ["--requirepass", REDIS_PASSWORD]
    proc, port = start_redis(server_dir, args, password=REDIS_PASSWORD)
    yield f"redis://127.0.0.1:{port}/0"
    stop(proc)


@pytest.fixture
def postgres_password_url(postgres_url: str) -> Iterator[str]:
    """A Postgres store URL of a role of this test that logs in with ``PG_PASSWORD``
    (checked by servers that check passwords), in a schema of its own; both dropped after."""
    from urllib.parse import urlsplit, urlunsplit

    from ..conftest import pg_admin

    role = f"hunt_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(postgres_url)
    database = parts.path.lstrip("/")
    pg_admin(
        postgres_url,
        f"CREATE ROLE {role} LOGIN PASSWORD '{PG_PASSWORD}'",
        f"GRANT CREATE ON DATABASE {database} TO {role}",
    )
    host = parts.netloc.rpartition("@")[2]
    url = urlunsplit(parts._replace(netloc=f"{role}:{PG_PASSWORD}@{host}"))
    query = f"schema={role}"
    yield f"{url}{'&' if '?' in url else '?'}{query}"
    pg_admin(
        postgres_url,
        f'DROP SCHEMA IF EXISTS "{role}" CASCADE',
        f"REVOKE ALL ON DATABASE {database} FROM {role}",
        f"DROP ROLE {role}",
    )


@attrs.define
class HeldUnlisten:
    """``Connection.remove_listener`` held: ``removing`` is set once a caller is in it,
    and it goes on when ``go_on`` is set."""

    removing: asyncio.Event = attrs.field(factory=asyncio.Event)
    go_on: asyncio.Event = attrs.field(factory=asyncio.Event)


@pytest.fixture
def held_unlisten(monkeypatch: pytest.MonkeyPatch) -> HeldUnlisten:
    """Hold every asyncpg ``remove_listener`` call until the test lets it go on."""
    import asyncpg

    held = HeldUnlisten()
    real = asyncpg.connection.Connection.remove_listener

    async def remove_listener(self: Any, *args: Any) -> None:
        held.removing.set()
        await held.go_on.wait()
        await real(self, *args)

    monkeypatch.setattr(asyncpg.connection.Connection, "remove_listener", remove_listener)
    return held
