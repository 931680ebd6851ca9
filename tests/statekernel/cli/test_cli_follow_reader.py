"""``runs events --follow`` reads a PostgreSQL run that another process drives, for the
run's whole life, without ever writing: through a role that may only read the store's
tables (every write the server refuses), on the store the CLI opens read-only. Quiet
stretches (a tool that waits) pass without the follower giving up, and it ends, with
status 0, when the run completes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from asyncio.subprocess import PIPE, Process
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest

from statekernel._cli.runs import IDLE_NOTE_AFTER
from statekernel.stores import PostgresStore

from ...conftest import pg_admin
from .test_cli_runs import EXE

pytestmark = pytest.mark.postgres

DRIVER = Path(__file__).with_name("follow_driver.py")
WAIT = 120.0
"""Seconds a step may take before the test fails (a bound, never a pause)."""


@pytest.fixture
def reader_url(postgres_url: str, postgres_store_url: str) -> Iterator[str]:
    """The store's URL for a role of this test that may only read its tables (the store
    laid out first); the role is dropped after."""

    async def lay_out() -> None:
        store = PostgresStore(postgres_store_url)
        try:
            await store.list_runs()
        finally:
            await store.aclose()

    asyncio.run(lay_out())
    parts = urlsplit(postgres_store_url)
    schema = parse_qs(parts.query)["schema"][0]
    role = f"reader_{uuid.uuid4().hex[:10]}"
    pg_admin(
        postgres_url,
        f"CREATE ROLE {role} LOGIN PASSWORD 'reader-only'",
        f'GRANT USAGE ON SCHEMA "{schema}" TO {role}',
        f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO {role}',
    )
    host = parts.netloc.rpartition("@")[2]
    yield urlunsplit(parts._replace(netloc=f"{role}:reader-only@{host}"))
    pg_admin(postgres_url, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


async def _lines(stream: asyncio.StreamReader | None) -> AsyncIterator[str]:
    assert stream is not None
    while line := await stream.readline():
        yield line.decode()


async def _collect(stream: asyncio.StreamReader | None, into: list[str]) -> None:
    async for line in _lines(stream):
        into.append(line)


async def _printed_until(proc: Process, kind: str, printed: list[str]) -> None:
    """Read the events ``proc`` prints (JSON lines) into ``printed`` until one of type
    ``kind``."""
    async for line in _lines(proc.stdout):
        printed.append(line)
        if json.loads(line)["type"] == kind:
            return
    raise AssertionError(f"the follower ended before {kind}: {await _stderr(proc)}")


async def _until(proc: Process, word: str) -> None:
    """Read ``proc``'s stdout until a line starts with ``word``."""
    async for line in _lines(proc.stdout):
        if line.startswith(word):
            return
    raise AssertionError(f"the driver ended before {word}: {await _stderr(proc)}")


async def _stderr(proc: Process) -> str:
    assert proc.stderr is not None
    return (await proc.stderr.read()).decode()


async def test_follow_on_a_read_only_store_lasts_the_run(
    postgres_store_url: str, reader_url: str, tmp_path: Path
) -> None:
    pipe = tmp_path / "go"
    os.mkfifo(pipe)
    args = [str(DRIVER), postgres_store_url, "followed", str(pipe)]
    driver = await asyncio.create_subprocess_exec(sys.executable, *args, stdout=PIPE, stderr=PIPE)
    env = {k: v for k, v in os.environ.items() if k != "STATEKERNEL_STORE"}
    command = ["runs", "events", "followed", "--follow", "--json", "--store", reader_url]
    follow: Process | None = None
    printed: list[str] = []
    said: list[str] = []
    try:
        await asyncio.wait_for(_until(driver, "STARTED"), WAIT)
        follow = await asyncio.create_subprocess_exec(
            str(EXE), *command, env=env, stdout=PIPE, stderr=PIPE
        )
        await asyncio.wait_for(_until(driver, "HOLDING"), WAIT)
        quiet = _printed_until(follow, "tool_call_started", printed)  # no commit after it
        await asyncio.wait_for(quiet, WAIT)
        reading = asyncio.gather(_collect(follow.stdout, printed), _collect(follow.stderr, said))
        await asyncio.sleep(3 * IDLE_NOTE_AFTER)  # quiet stretches pass: what is tested
        assert follow.returncode is None, f"the follower ended while the run was quiet: {said}"
        await asyncio.to_thread(pipe.write_text, "go\n")  # the tool returns, the run ends
        await asyncio.wait_for(_until(driver, "DONE completed"), WAIT)
        assert await asyncio.wait_for(follow.wait(), WAIT) == 0, said
        await asyncio.wait_for(reading, WAIT)
    finally:
        for proc in (driver, follow):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert "error" not in "".join(said).lower(), said
    events = [e for e in map(json.loads, printed) if e["seq"] >= 0]  # live ones too
    store = PostgresStore(reader_url, read_only=True)
    try:
        stored = await store.events("followed")
    finally:
        await store.aclose()
    assert [(e["revision"], e["type"]) for e in events] == [(e.revision, e.type) for e in stored]
    assert events[-1]["type"] == "run_completed"
