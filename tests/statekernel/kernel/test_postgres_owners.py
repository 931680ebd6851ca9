"""A live PostgreSQL owner keeps its run whatever happens to its lock session; a dead or
vanished one loses it; a stale owner never starts an effect.

Real processes (``pg_owner_driver.py``) drive one run each; their tools append to a
ledger the test reads from outside. Each test ends one thing the owner cannot see
coming: its lock session (``pg_terminate_backend``, ``idle_session_timeout``, a server
restart), its network (a TCP proxy that stops forwarding without closing), or its own
execution (SIGSTOP right after an intent committed). The owner proven by renewals
alone (``?pgbouncer=1``) is waited for by plain clients too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import statekernel as sk
from statekernel.errors import RunBusy
from statekernel.stores import PostgresStore
from statekernel.stores.postgres._leases import GRACE
from statekernel.stores.postgres._url import parse_postgres_url
from statekernel.testing import ScriptedProvider
from statekernel.testing._servers import free_port

from ...conftest import pg_admin, pg_value
from .test_ownership_processes import wait_for
from .test_postgres_server_faults import OwnedServer, owned_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

__all__ = ["owned_server"]  # the fixture, used here

DRIVER = Path(__file__).with_name("pg_owner_driver.py")
RUN = "owned"


def _create(url: str) -> None:
    async def create() -> None:
        async with sk.Kernel(url, providers={"scripted": ScriptedProvider([])}) as kernel:
            await kernel.start(model="scripted/owner", messages=["go"], run_id=RUN)

    asyncio.run(create())


def _drive(url: str, folder: Path, tool: str, *options: str) -> subprocess.Popen[str]:
    args = [sys.executable, str(DRIVER), url, str(folder), RUN, tool, *options]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _report(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, object]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"driver exited with {proc.returncode}: {err}"
    report: dict[str, object] = json.loads(out.splitlines()[-1])
    return report


def _ledger(folder: Path) -> list[list[str]]:
    path = folder / "ledger"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _starts(folder: Path) -> list[list[str]]:
    return [line for line in _ledger(folder) if line[0] == "start"]


def _lock_sessions(dsn: str) -> set[int]:
    """Server pids of the sessions holding an owner's advisory lock in the database."""
    rows = pg_value(
        dsn,
        "SELECT coalesce(array_agg(pid), '{}') FROM pg_locks WHERE locktype = 'advisory'"
        " AND granted AND objsubid = 1"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    assert isinstance(rows, list)
    return set(rows)


def _stopped(pid: int) -> bool:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state == "T"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


def _one_execution(folder: Path) -> None:
    starts = _starts(folder)
    assert len(starts) == 1, f"the call ran {len(starts)} times: {starts}"


def _ends_with_a_taker_refused(url: str, folder: Path, owner: subprocess.Popen[str]) -> None:
    """Another process tries for 3 s (three times the grace): the run is busy; then the
    owner's call ends and the owner completes the run, its call having run once."""
    taker = _drive(url, folder, "fetch", "busy=3")
    assert _report(taker) == {"error": "RunBusy", "state": "dispatching_tools"}
    (folder / "gate").touch()
    assert _report(owner) == {"error": None, "state": "completed"}
    _one_execution(folder)


def test_an_owner_whose_lock_session_is_terminated_keeps_its_run(
    postgres_store_url: str, folder: Path
) -> None:
    url, dsn = postgres_store_url, parse_postgres_url(postgres_store_url).dsn
    _create(url)
    owner = _drive(url, folder, "fetch")
    wait_for(lambda: len(_starts(folder)) == 1, "the owner's call to start")
    (session,) = _lock_sessions(dsn)
    pg_admin(dsn, f"SELECT pg_terminate_backend({session})")
    wait_for(lambda: _lock_sessions(dsn) - {session} != set(), "the owner to lock again")
    _ends_with_a_taker_refused(url, folder, owner)


def test_an_owner_whose_lock_session_ends_is_not_taken_for_dead_meanwhile(
    postgres_store_url: str, folder: Path
) -> None:
    """A taker tries from the moment the session ends, before the owner locked again,
    for three times the grace: it finds the lock free at first, and never takes the run."""
    url, dsn = postgres_store_url, parse_postgres_url(postgres_store_url).dsn
    _create(url)
    owner = _drive(url, folder, "fetch")
    wait_for(lambda: len(_starts(folder)) == 1, "the owner's call to start")
    (session,) = _lock_sessions(dsn)

    async def take_for(seconds: float) -> int:
        store = PostgresStore(url)
        busy = 0
        try:
            await store.load(RUN)  # connected before the session ends
            pg_admin(dsn, f"SELECT pg_terminate_backend({session})")
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                with contextlib.suppress(RunBusy):
                    lease = await store.acquire(RUN, "taker", ttl=15)
                    await store.release(lease)
                    return busy
                busy += 1
                await asyncio.sleep(0.02)
            return busy
        finally:
            await store.aclose()

    busy = asyncio.run(take_for(3 * GRACE))
    assert owner.poll() is None
    assert busy > 0
    assert [m for m in _ledger(folder) if m[0] == "end"] == []
    (folder / "gate").touch()
    assert _report(owner) == {"error": None, "state": "completed"}
    _one_execution(folder)


def test_idle_session_timeout_never_ends_an_owner_s_lock(
    postgres_store_url: str, folder: Path
) -> None:
    url, dsn = postgres_store_url, parse_postgres_url(postgres_store_url).dsn
    database = pg_value(dsn, "SELECT current_database()")
    _create(url)
    pg_admin(dsn, f"ALTER DATABASE \"{database}\" SET idle_session_timeout = '300ms'")
    try:
        owner = _drive(url, folder, "fetch")
        wait_for(lambda: len(_starts(folder)) == 1, "the owner's call to start")
        (session,) = _lock_sessions(dsn)

        async def idle_canary_ended() -> None:  # the timeout has ended an idle session
            import asyncpg

            conn = await asyncpg.connect(dsn)
            ended = asyncio.Event()
            conn.add_termination_listener(lambda _: ended.set())
            try:
                await ended.wait()
            finally:
                conn.terminate()

        asyncio.run(asyncio.wait_for(idle_canary_ended(), 60))
        assert session in _lock_sessions(dsn), "the owner's lock session was ended for idling"
    finally:
        pg_admin(dsn, f'ALTER DATABASE "{database}" RESET idle_session_timeout')
    _ends_with_a_taker_refused(url, folder, owner)


def test_a_plain_client_waits_for_an_owner_proven_by_renewals(
    postgres_store_url: str, folder: Path
) -> None:
    """A ``?pgbouncer=1`` owner holds no lock: a plain client reads the row's proof and
    waits for the lease to expire, not for a lock that was never taken."""
    url = postgres_store_url
    _create(url)
    owner = _drive(f"{url}&pgbouncer=1", folder, "fetch")
    wait_for(lambda: len(_starts(folder)) == 1, "the owner's call to start")
    _ends_with_a_taker_refused(url, folder, owner)


def test_an_owner_keeps_its_run_across_a_server_restart(
    owned_server: OwnedServer, folder: Path
) -> None:
    url = owned_server.url
    _create(url)
    owner = _drive(url, folder, "fetch")
    wait_for(lambda: len(_starts(folder)) == 1, "the owner's call to start")
    owned_server.stop_immediately()
    owned_server.start()
    _ends_with_a_taker_refused(url, folder, owner)


def test_a_frozen_owner_whose_run_was_taken_never_starts_its_call(
    postgres_store_url: str, folder: Path
) -> None:
    """Stopped right after the intent of ``pay`` committed, the owner loses its lock
    session; another process takes the run, which pauses uncertain; the operator says
    run it again, and it is paid. The owner wakes: its lease check renews, is refused,
    and it never pays."""
    url, dsn = postgres_store_url, parse_postgres_url(postgres_store_url).dsn
    _create(url)
    (folder / "gate").touch()
    owner = _drive(url, folder, "pay", "stop")
    wait_for(lambda: _stopped(owner.pid), "the owner to stop after the intent")
    try:
        (session,) = _lock_sessions(dsn)
        pg_admin(dsn, f"SELECT pg_terminate_backend({session})")
        taker = _drive(url, folder, "pay", "busy=30")
        assert _report(taker) == {"error": None, "state": "paused"}

        async def rerun() -> None:
            async with sk.Kernel(url, providers={"scripted": ScriptedProvider([])}) as kernel:
                run = await kernel.get(RUN)
                assert run.pause is not None
                (uncertain,) = run.pause.metadata["calls"]
                await kernel.resolve_tool_call(RUN, uncertain["id"], rerun=True)

        asyncio.run(rerun())
        assert _report(_drive(url, folder, "pay")) == {"error": None, "state": "completed"}
    finally:
        owner.send_signal(signal.SIGCONT)
    assert _report(owner)["error"] == "LeaseLost"
    _one_execution(folder)


_PROXY = """
import asyncio, sys

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()

async def serve(reader, writer):
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(sys.argv[2]))
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
    print("READY", flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A TCP proxy process in front of the server: SIGSTOP it and every connection
    through it goes silent without closing, as a machine that vanished."""
    if urlsplit(postgres_url).port is None:
        pytest.skip("the server listens on a Unix socket: no TCP port to put a proxy before")
    port = free_port()
    upstream = str(urlsplit(postgres_url).port)
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROXY, str(port), upstream], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    try:
        yield proc, port
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_a_vanished_owner_s_run_is_taken_when_its_lease_expires(
    postgres_store_url: str, folder: Path, proxy: tuple[subprocess.Popen[str], int]
) -> None:
    """The owner's connections go silent without closing: the server keeps its session
    and its lock (until TCP keepalive: hours). Its lease, on the server's clock, expires
    all the same, and another process takes the run then."""
    url = postgres_store_url
    proc, port = proxy
    parts = urlsplit(url)
    hidden = parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}").geturl()
    _create(url)
    owner = _drive(hidden, folder, "fetch", "ttl=3")
    try:
        wait_for(lambda: len(_starts(folder)) == 1, "the owner's call to start")
        proc.send_signal(signal.SIGSTOP)
        (folder / "gate").touch()
        taker = _drive(url, folder, "fetch", "busy=60")
        assert _report(taker) == {"error": None, "state": "completed"}
    finally:
        owner.kill()
        owner.wait()
    attempts = [(line[2], int(line[3])) for line in _starts(folder)]
    assert attempts == [("1", owner.pid), ("2", attempts[1][1])]
    assert os.getpid() not in {pid for _, pid in attempts}
