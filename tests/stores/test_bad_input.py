"""Damaged or unusable storage gives typed errors naming the URL or path, never a wrong run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from statekernel.errors import (
    ConfigError,
    ConflictError,
    CorruptCheckpoint,
    RunNotFound,
    StoreError,
)
from statekernel.stores import Checkpoint, open_store, redact_url
from statekernel.stores._format.checksum import seal, unseal
from statekernel.testing._raw import FileRecords
from statekernel.testing._store_cases import next_revision, sample_run


async def _commit_two(url: str) -> None:
    store = open_store(url)
    run = sample_run("r")
    await store.commit(Checkpoint.between(None, run))
    await store.commit(Checkpoint.between(run, next_revision(run)))
    await store.aclose()


# -- file store ----------------------------------------------------------------------


@pytest.mark.parametrize("damage", [b"{not json", b'{"v": 1, "sz": 10', b"", b"[1, 2]"])
async def test_garbled_or_truncated_head_file(tmp_path: Path, damage: bytes) -> None:
    """``head.json`` is a hint written without fsync: torn, the log's last commit wins."""
    url = f"file://{tmp_path}"
    await _commit_two(url)
    (tmp_path / "r" / "head.json").write_bytes(damage)
    store = open_store(url)
    run = await store.load("r")
    assert run.revision == 1
    assert [s.revision for s in (await store.list_runs()).runs] == [1]
    with pytest.raises(ConflictError):
        await store.commit(Checkpoint.between(None, sample_run("r")))
    await store.commit(Checkpoint.between(run, next_revision(run)))
    assert (await store.load("r")).revision == 2
    assert (tmp_path / "r" / "head.json").read_bytes() != damage


async def test_torn_last_line_is_ignored_and_cut_off(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    await _commit_two(url)
    log = tmp_path / "r" / "log.jsonl"
    with log.open("ab") as f:
        f.write(b'["m",99,["u",["half a mess')
    store = open_store(url)
    run = await store.load("r")
    assert run.revision == 1
    nxt = next_revision(run, messages=(*run.messages, run.messages[0]))
    await store.commit(Checkpoint.between(run, nxt))
    assert await store.load("r") == nxt
    assert b"half a mess" not in log.read_bytes()


async def test_log_shorter_than_committed_is_corrupt(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    await _commit_two(url)
    log = tmp_path / "r" / "log.jsonl"
    log.write_bytes(log.read_bytes()[:-7])
    store = open_store(url)
    with pytest.raises(CorruptCheckpoint, match=r"log\.jsonl"):
        await store.load("r")
    one = next_revision(sample_run("r"))
    with pytest.raises(CorruptCheckpoint, match=r"log\.jsonl"):
        await store.commit(Checkpoint.between(one, next_revision(one)))


async def test_garbled_line_inside_the_log_is_corrupt(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    await _commit_two(url)
    log = tmp_path / "r" / "log.jsonl"
    data = log.read_bytes()
    log.write_bytes(data.replace(b'["m",0,', b'["m",0,{', 1))
    with pytest.raises(CorruptCheckpoint, match="r"):
        await open_store(url).load("r")


async def test_file_store_under_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    store = open_store(f"file://{blocker}/runs")
    with pytest.raises(StoreError, match="plain-file"):
        await store.commit(Checkpoint.between(None, sample_run("r")))
    with pytest.raises(StoreError, match="plain-file"):
        await store.list_runs()


async def test_file_store_missing_directory(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/not/there")
    with pytest.raises(RunNotFound):
        await store.load("r")
    assert (await store.list_runs()).runs == ()
    await store.commit(Checkpoint.between(None, sample_run("r")))
    assert (tmp_path / "not" / "there" / "r").is_dir()


# -- SQLite ----------------------------------------------------------------------------


async def test_sqlite_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.write_bytes(b"this is not a database at all" * 100)
    store = open_store(f"sqlite:///{path}")
    with pytest.raises(StoreError, match=r"runs\.db") as info:
        await store.load("r")
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    await store.aclose()


async def test_sqlite_under_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    store = open_store(f"sqlite:///{blocker}/runs.db")
    with pytest.raises(StoreError, match="plain-file"):
        await store.commit(Checkpoint.between(None, sample_run("r")))


async def test_sqlite_newer_layout_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    await _commit_two(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE statekernel_schema SET version = 99")
    with pytest.raises(StoreError, match="newer"):
        await open_store(f"sqlite:///{path}").load("r")


_BAD_COLUMN = (
    "CREATE TABLE messages (rid INTEGER NOT NULL, pos INTEGER NOT NULL, doc BLOB NOT NULL,"
    " \xff INTEGER NOT NULL, PRIMARY KEY (rid, pos)) WITHOUT ROWID"
)
_DAMAGE = {
    "head as text": "UPDATE runs SET head = 'abc'",
    "head as a number": "UPDATE runs SET head = 5",
    "revision as text": "UPDATE runs SET revision = 'x'",
    "message as a number": "UPDATE messages SET doc = 5",
    "turn as text": "UPDATE turns SET doc = 'x'",
    "commit log entry as a number": "UPDATE commits SET entry = 7",
    "layout version as text": "UPDATE statekernel_schema SET version = 'abc'",
    "layout version as bytes": "UPDATE statekernel_schema SET version = X'FF'",
    "layout version infinite": "UPDATE statekernel_schema SET version = 1e999",
    "runs with other columns": "DROP TABLE runs; CREATE TABLE runs (a, b)",
    "column named in non-UTF-8": (
        "PRAGMA writable_schema = ON; UPDATE sqlite_master SET sql ="
        f" CAST(X'{_BAD_COLUMN.encode('latin-1').hex()}' AS TEXT) WHERE name = 'messages'"
    ),
}


async def _every_operation(url: str) -> list[tuple[str, BaseException | None]]:
    store = open_store(url)
    run = next_revision(sample_run("r"))  # the head _commit_two left
    work: dict[str, Any] = {
        "load": lambda: store.load("r"),
        "load at revision 0": lambda: store.load("r", revision=0),
        "events": lambda: store.events("r"),
        "list": lambda: store.list_runs(),
        "commit": lambda: store.commit(Checkpoint.between(run, next_revision(run))),
        "new run": lambda: store.commit(Checkpoint.between(None, sample_run("r2"))),
        "history": lambda: _drain(store.history("r")),  # type: ignore[attr-defined]
    }
    outcomes: list[tuple[str, BaseException | None]] = []
    for name, call in work.items():
        try:
            await call()
            outcomes.append((name, None))
        except Exception as exc:
            outcomes.append((name, exc))
    await store.aclose()
    return outcomes


async def _drain(items: Any) -> None:
    async for _ in items:
        pass


@pytest.mark.parametrize("damage", list(_DAMAGE))
async def test_sqlite_damaged_tables_give_typed_errors(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "runs.db"
    await _commit_two(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.executescript(_DAMAGE[damage])
    outcomes = await _every_operation(f"sqlite:///{path}")
    for name, exc in outcomes:
        if exc is None:
            continue
        assert isinstance(exc, StoreError | CorruptCheckpoint), f"{name}: {exc!r}"
        assert str(path) in str(exc), f"{name}: {exc} does not name the database"
    assert any(exc is not None for _, exc in outcomes), "the damage went unnoticed"


# -- unknown schema_version in every store --------------------------------------------------


def _bump_version(doc: bytes) -> bytes:
    """A stored (checksummed) head at schema version 99, checksummed again."""
    head = json.loads(unseal(doc, "head"))
    head["schema_version"] = 99
    return seal(json.dumps(head).encode())


async def test_unknown_schema_version_file(tmp_path: Path) -> None:
    await _commit_two(f"file://{tmp_path}")
    path = tmp_path / "r" / "log.jsonl"
    *lines, last = path.read_bytes().split(b"\n")[:-1]
    raw, key = FileRecords(), ("head", 0)  # the last commit's head record
    head = raw.decode(key, last)
    head["schema_version"] = 99
    lines.append(raw.encode(key, head, last))
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    (tmp_path / "r" / "head.json").unlink()  # its length no longer matches
    with pytest.raises(CorruptCheckpoint, match="schema_version 99"):
        await open_store(f"file://{tmp_path}").load("r")


async def test_unknown_schema_version_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    await _commit_two(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        (doc,) = conn.execute("SELECT head FROM runs").fetchone()
        conn.execute("UPDATE runs SET head = ?", (_bump_version(doc),))
    with pytest.raises(CorruptCheckpoint, match="schema_version 99"):
        await open_store(f"sqlite:///{path}").load("r")


@pytest.mark.redis
async def test_unknown_schema_version_redis(redis_store_url: str, redis_prefix: str) -> None:
    await _commit_two(redis_store_url)
    client = redis_sync.Redis.from_url(redis_store_url.split("?")[0])
    key = f"{redis_prefix}:{{r}}:head"
    client.hset(key, "doc", _bump_version(client.hget(key, "doc")))  # type: ignore[arg-type]
    client.close()
    store = open_store(redis_store_url)
    with pytest.raises(CorruptCheckpoint, match="schema_version 99"):
        await store.load("r")
    await store.aclose()


# -- URLs and connections --------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["mysql://db/runs", "nonsense", "sqlite://host/x.db", "sqlite:///x.db?journal=off"]
)
def test_bad_store_urls(url: str) -> None:
    with pytest.raises(ConfigError, match="URL"):
        open_store(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://[::1",
        "redis://:hunter2-secret@[::1/0",
        "redis://127.0.0.1:1/0?no_such_option=1",
        "redis://:hunter2-secret@127.0.0.1:1/0?no_such_option=1",
        "redis://:hunter2-secret@127.0.0.1:port/0",
    ],
)
def test_malformed_redis_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_store(url)  # checked when opened, not at the first connection
    message = str(info.value)
    assert "hunter2-secret" not in message
    assert redact_url(url) in message


async def test_redis_refusing_connections() -> None:
    url = "redis://:hunter2-secret@127.0.0.1:1/0"
    store = open_store(url)
    with pytest.raises(StoreError) as info:
        await store.load("r")
    message = str(info.value)
    assert "hunter2-secret" not in message
    assert redact_url(url) in message
    with pytest.raises(StoreError):
        await store.commit(Checkpoint.between(None, sample_run("r")))
    await store.aclose()


def test_redact_url_hides_passwords() -> None:
    assert redact_url("rediss://user:pw@host:6380/2") == "rediss://user:***@host:6380/2"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
