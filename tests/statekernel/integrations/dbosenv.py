"""What the DBOS tests share: DBOS launched on a system database of the test's own
(a SQLite file, or a fresh PostgreSQL database), an agent whose tools log each execution,
and waiting for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from dbos import DBOS

import statekernel as sk
from statekernel.integrations.dbos import StatekernelDBOS
from statekernel.testing import ScriptedProvider, call

from ...conftest import pg_admin
from .dbos_app import dbos_config

BACKENDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
"""The parameters of a test's ``databases`` fixture (``databases_for``)."""


def databases_for(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``(DBOS system database URL, statekernel store URL)`` for ``request.param``: SQLite
    files, or a fresh PostgreSQL database for DBOS and a schema of its own for the store."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dbos.sqlite'}", f"sqlite:///{tmp_path / 'runs.db'}"
        return
    server: str = request.getfixturevalue("postgres_url")
    store: str = request.getfixturevalue("postgres_store_url")
    name = f"dbos_{uuid.uuid4().hex[:12]}"
    pg_admin(server, f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(server)._replace(path=f"/{name}")), store
    finally:
        pg_admin(server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def launched(app: StatekernelDBOS, system_database_url: str, **queues: Any) -> Iterator[None]:
    """DBOS launched with ``app`` registered, and ``queues`` (name -> limits) registered;
    destroyed after (with its registry: the next test registers its own)."""
    DBOS(config=dbos_config(system_database_url))
    try:
        DBOS.launch()
        for name, limits in queues.items():
            DBOS.register_queue(name, polling_interval_sec=0.05, **limits)
        yield
    finally:
        app.close()
        DBOS.destroy(destroy_registry=True)


class Ledger:
    """A file each tool execution appends a line to (whitespace-separated fields)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, *fields: object) -> None:
        with self.path.open("a") as out:
            out.write(" ".join(str(f) for f in fields) + "\n")

    def lines(self, kind: str | None = None) -> list[list[str]]:
        if not self.path.exists():
            return []
        rows = [line.split() for line in self.path.read_text().splitlines() if line]
        return [row for row in rows if kind is None or row[0] == kind]


def agent(
    store: str,
    ledger: Ledger,
    script: list[object],
    *,
    hooks: object = None,
    tools: tuple[sk.Tool, ...] = (),
    others: dict[str, list[object]] | None = None,
) -> Callable[[], sk.Kernel]:
    """A kernel factory: ``pay`` (not idempotent) and ``hold`` (waits ``seconds``) log to
    ``ledger``; the model ``scripted/...`` answers from ``script`` (its last item repeats),
    the providers named in ``others`` from theirs."""

    @sk.tool
    def pay(to: str, amount: int, ctx: sk.ToolContext) -> str:
        """Send money: not idempotent."""
        ledger.write("pay", ctx.run_id, ctx.call_id, to, amount)
        return f"paid {amount} to {to}"

    @sk.tool
    async def hold(seconds: float, ctx: sk.ToolContext) -> str:
        """Wait ``seconds``; log when it started and ended."""
        ledger.write("start", ctx.run_id, time.monotonic())
        await asyncio.sleep(seconds)
        ledger.write("end", ctx.run_id, time.monotonic())
        return "held"

    def make() -> sk.Kernel:
        providers = {
            name: ScriptedProvider(items, repeat_last=True)
            for name, items in {**(others or {}), "scripted": script}.items()
        }
        return sk.Kernel(
            store,
            tools=[pay, hold, *tools],
            providers=providers,
            hooks=hooks,
            lease_ttl=3,
            busy_timeout=10,
        )

    return make


PAY_BOB = [call("pay", {"to": "Bob", "amount": 50}), "Paid Bob."]


def wait_for(check: Callable[[], bool], what: str, within: float = 90.0) -> None:
    """Return once ``check()`` is true; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
