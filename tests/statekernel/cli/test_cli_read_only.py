"""Commands that read a store never write into a SQLite file that is not a statekernel
store, nor create one where there is none (through the real CLI, click's runner)."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from statekernel._cli.main import cli

READING = [
    ["runs", "list"],
    ["runs", "list", "--json", "--state", "paused"],
    ["runs", "show", "run-1"],
    ["runs", "tree", "run-1"],
    ["runs", "events", "run-1"],
    ["runs", "diagram", "run-1", "-o", "-"],
]
ACTING = [["runs", "delete", "run-1", "--yes"], ["runs", "fork", "run-1"]]
"""Commands that change stored runs: with no store there, they have nothing to act on."""


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"STATEKERNEL_STORE": None})


def app_database(path: Path) -> None:
    """Another application's database (rollback journal)."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
        conn.execute("INSERT INTO orders (item) VALUES ('tea')")
    conn.close()


def wal_database(path: Path) -> None:
    """Another application's database in WAL mode, closed cleanly."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('hello')")
    conn.commit()
    conn.close()


def no_tables(path: Path) -> None:
    """A SQLite database without a table."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 7")
    conn.close()


def text_file(path: Path) -> None:
    """Not a database at all."""
    path.write_text("id,item\n1,tea\n")


def folder_state(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.mark.parametrize("make", [app_database, wal_database, no_tables, text_file])
def test_a_foreign_file_is_refused_and_left_as_it_was(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    path = tmp_path / "app.db"
    make(path)
    before = folder_state(tmp_path)
    for args in [*READING, *ACTING]:
        done = invoke(*args, "--store", f"sqlite:///{path}")
        assert done.exit_code == 2, (args, done.output)
        lines = done.stderr.splitlines()
        assert len(lines) == 1, (args, done.stderr)
        assert lines[0].startswith("error: "), (args, lines)
        assert str(path) in lines[0], (args, lines)
        assert "not a statekernel SQLite store" in lines[0] or "cannot be read" in lines[0]
        assert folder_state(tmp_path) == before, args  # not a byte written, no file added


def test_a_missing_file_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "none" / "runs.db"
    for args in READING:
        done = invoke(*args, "--store", f"sqlite:///{path}")
        assert done.exit_code == 2, (args, done.output)
        assert "no SQLite store" in done.stderr, (args, done.stderr)
        assert str(path) in done.stderr, (args, done.stderr)
    assert list(tmp_path.iterdir()) == []


def test_commands_that_write_still_create_a_store(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'new.db'}"
    started = invoke("demo", "--model", "scripted/demo", "--store", store, "--run-id", "run-1")
    assert started.exit_code == 0, started.output
    listed = invoke("runs", "list", "--store", store)
    assert listed.exit_code == 0, listed.output
    assert "run-1" in listed.stdout


@pytest.mark.postgres
def test_reading_commands_create_and_upgrade_no_postgres_schema(postgres_store_url: str) -> None:
    import asyncio

    import statekernel as sk
    from statekernel.stores.postgres._url import parse_postgres_url
    from statekernel.testing import ScriptedProvider

    from ...conftest import pg_admin, pg_value

    target = parse_postgres_url(postgres_store_url)
    table = f'"{target.schema}".statekernel_schema'

    empty = invoke("runs", "list", "--store", postgres_store_url)
    assert empty.exit_code != 0
    assert "no store" in empty.output + empty.stderr
    assert pg_value(target.dsn, f"SELECT to_regclass('{table}')") is None, "nothing created"

    async def made() -> None:
        providers = {"scripted": ScriptedProvider(["hi"])}
        async with sk.Kernel(postgres_store_url, providers=providers) as kernel:
            await kernel.start(model="scripted/m", messages=["go"], run_id="run-1")
            async for _ in kernel.run("run-1"):
                pass

    asyncio.run(made())
    pg_admin(target.dsn, f"UPDATE {table} SET version = 2")  # as an older release left it
    for args in READING:
        done = invoke(*args, "--store", postgres_store_url)
        assert done.exit_code == 0, (args, done.output, done.stderr)
    assert pg_value(target.dsn, f"SELECT max(version) FROM {table}") == 2, "not upgraded"
