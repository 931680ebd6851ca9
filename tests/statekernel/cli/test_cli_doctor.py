"""``statekernel doctor`` through the installed console script, on real stores."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from statekernel.stores import open_store
from statekernel.stores.postgres._schema import STORE_VERSION
from statekernel.testing import (
    FileRecords,
    PostgresRecords,
    RawCopies,
    RawRecords,
    RecordKey,
    RedisRecords,
    SQLiteRecords,
)

from ...conftest import CLUSTER_NODES, pg_admin
from .test_cli_runs import EXE, sk

pytestmark = pytest.mark.skipif(
    EXE is None, reason="the statekernel console script is not installed"
)


def demo(store: str, run_id: str, cwd: Path, *, crash: str | None = None) -> None:
    """A demo run on the scripted model; with ``crash`` the process dies mid-run."""
    args = ["demo", "--model", "scripted/demo", "--store", store, "--run-id", run_id]
    done = sk(*args, *(["--crash-after", crash] if crash else []), cwd=cwd)
    assert (done.returncode != 0) == (crash is not None), (done.stdout, done.stderr)


def doctor(store: str, cwd: Path, status: int) -> list[dict[str, str]]:
    """The findings of ``statekernel doctor --json``, checking its exit status."""
    done = sk("doctor", "--store", store, "--json", cwd=cwd)
    assert done.returncode == status, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    findings: list[dict[str, str]] = json.loads(done.stdout)
    assert all(set(f) == {"check", "subject", "status", "detail"} for f in findings)
    return findings


def finding(findings: list[dict[str, str]], check: str, subject: str) -> dict[str, str]:
    found = [f for f in findings if f["check"] == check and f["subject"] == subject]
    assert len(found) == 1, (check, subject, findings)
    return found[0]


def damage(
    store: str, raw: RawRecords, run_id: str, kind: str, at: int | str | None = None
) -> None:
    """Flip a byte in the run's first stored record of ``kind`` (or remove the one at
    ``at``), below the store's own checks."""

    async def go() -> None:
        s = open_store(store)
        try:
            records = await raw.read(s, run_id)
            if at is not None:
                await raw.write(s, run_id, (kind, at), None)
                return
            key: RecordKey = min(k for k in records if k[0] == kind)
            data = records[key]
            middle = len(data) // 2
            flipped = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
            await raw.write(s, run_id, key, flipped)
        finally:
            await s.aclose()

    asyncio.run(go())


def damage_copy(store: str, raw: RawCopies, run_id: str, name: str, value: bytes | None) -> None:
    """Write what the store keeps of a run outside its checksummed records (a copy of a
    head field, the lease record), below the store's own checks."""

    async def go() -> None:
        s = open_store(store)
        try:
            await raw.write_copy(s, run_id, name, value)
        finally:
            await s.aclose()

    asyncio.run(go())


async def read(store: str, raw: RawRecords, run_id: str) -> dict[RecordKey, bytes]:
    """The run's stored records."""
    s = open_store(store)
    try:
        return await raw.read(s, run_id)
    finally:
        await s.aclose()


def stored_bytes(folder: Path) -> dict[str, bytes]:
    """The store's files as they are (SQLite's shared-memory index aside)."""
    return {
        p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and "-shm" not in p.name
    }


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    """A SQLite store with two completed demo runs and one whose process died mid-run."""
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    demo(store, "run-a", tmp_path)
    demo(store, "run-b", tmp_path)
    demo(store, "run-c", tmp_path, crash="model_completed")
    return store


def test_healthy_sqlite_store(tmp_path: Path, sqlite_store: str) -> None:
    before = stored_bytes(tmp_path)
    findings = doctor(sqlite_store, tmp_path, 0)
    assert stored_bytes(tmp_path) == before  # read only
    assert not [f for f in findings if f["status"] == "damaged"]
    path = str(tmp_path / "runs.db")
    for check in ("permissions", "store layout", "integrity", "journal_mode", "synchronous"):
        assert finding(findings, check, path)["status"] == "ok"
    for run_id in ("run-a", "run-b", "run-c"):
        assert finding(findings, "records", run_id)["status"] == "ok"
        assert finding(findings, "commit log", run_id)["status"] == "ok"
    assert finding(findings, "lease", "run-a")["status"] == "ok"
    left = finding(findings, "lease", "run-c")  # its process was killed holding the lease
    assert left["status"] == "warning"
    assert "gone" in left["detail"]

    table = sk("doctor", "--store", sqlite_store, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    for word in ("check", "subject", "status", "detail", "run-a", "commit log", "journal_mode"):
        assert word in table.stdout
    assert "3 runs checked: 0 damaged, 1 warning" in table.stdout

    normal = doctor(sqlite_store + "?synchronous=normal", tmp_path, 0)
    sync = finding(normal, "synchronous", path)
    assert sync["status"] == "warning"
    assert "not durable" in sync["detail"]


def test_sqlite_store_of_an_older_layout(tmp_path: Path, sqlite_store: str) -> None:
    import sqlite3

    with sqlite3.connect(tmp_path / "runs.db") as conn:  # layout 4: no fence column
        conn.execute("ALTER TABLE runs DROP COLUMN fence")
        conn.execute("UPDATE statekernel_schema SET version = 4")
    conn.close()
    before = (tmp_path / "runs.db").read_bytes()
    findings = doctor(sqlite_store, tmp_path, 0)
    assert (tmp_path / "runs.db").read_bytes() == before  # read as it is, not upgraded
    layout = finding(findings, "store layout", str(tmp_path / "runs.db"))
    assert layout["status"] == "warning"
    assert "layout version 4: read as it is" in layout["detail"]
    for run_id in ("run-a", "run-b", "run-c"):
        assert finding(findings, "records", run_id)["status"] == "ok"


def test_damaged_sqlite_store(tmp_path: Path, sqlite_store: str) -> None:
    damage(sqlite_store, SQLiteRecords(), "run-b", "message")
    damage(sqlite_store, SQLiteRecords(), "run-a", "entry", at=2)
    findings = doctor(sqlite_store, tmp_path, 1)
    damaged = {(f["check"], f["subject"]) for f in findings if f["status"] == "damaged"}
    assert ("records", "run-b") in damaged
    assert "message" in finding(findings, "records", "run-b")["detail"]
    assert ("commit log", "run-a") in damaged
    assert "revision 2" in finding(findings, "commit log", "run-a")["detail"]
    assert finding(findings, "records", "run-a")["status"] == "ok"  # its head is intact
    assert {s for _, s in damaged} == {"run-a", "run-b"}


def test_sqlite_copies_and_leases(tmp_path: Path, sqlite_store: str) -> None:
    raw = SQLiteRecords()
    damage_copy(sqlite_store, raw, "run-a", "revision", b"5")  # its head is at another
    damage_copy(sqlite_store, raw, "run-b", "state", b"paused")  # its head is completed
    damage_copy(sqlite_store, raw, "run-c", "lease", b"not a token")
    findings = doctor(sqlite_store, tmp_path, 1)
    revision = finding(findings, "records", "run-a")
    assert revision["status"] == "damaged"
    assert "revision column" in revision["detail"]
    state = finding(findings, "records", "run-b")
    assert state["status"] == "damaged"
    assert "state column" in state["detail"]
    lease = finding(findings, "lease", "run-c")
    assert lease["status"] == "damaged"
    assert "lease record of run 'run-c'" in lease["detail"]
    assert finding(findings, "records", "run-c")["status"] == "ok"
    table = sk("doctor", "--store", sqlite_store, cwd=tmp_path)
    assert table.returncode == 1, table.stderr
    assert "3 runs checked: 5 damaged" in table.stdout  # records and commit log of a, b


def test_sqlite_lost_blob(tmp_path: Path, sqlite_store: str) -> None:
    raw = SQLiteRecords()
    blob = min(str(k[1]) for k in asyncio.run(read(sqlite_store, raw, "run-a")) if k[0] == "blob")
    damage(sqlite_store, raw, "run-a", "blob", at=blob)
    records = finding(doctor(sqlite_store, tmp_path, 1), "records", "run-a")
    assert records["status"] == "damaged"
    assert f"blob {blob} is missing" in records["detail"]


def test_file_store(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = f"file://{root}"
    demo(store, "plain", tmp_path)
    demo(store, "Mixed.Case", tmp_path)  # a folder named by a hash of the run id
    findings = doctor(store, tmp_path, 0)
    assert [f for f in findings if f["status"] != "ok"] == []
    assert finding(findings, "commit log", "Mixed.Case")["status"] == "ok"

    (root / "plain").chmod(0o777)
    findings = doctor(store, tmp_path, 1)
    loose = finding(findings, "permissions", str(root))
    assert loose["status"] == "warning"
    assert f"{root / 'plain'} is world-writable" in loose["detail"]
    refused = finding(findings, "records", "plain")  # the store will not use the folder
    assert refused["status"] == "damaged"
    assert f"refused folder {str(root / 'plain')!r}" in refused["detail"]
    (root / "plain").chmod(0o700)

    damage(store, FileRecords(), "Mixed.Case", "turn")
    broken = finding(doctor(store, tmp_path, 1), "records", "Mixed.Case")
    assert broken["status"] == "damaged"
    assert "turn" in broken["detail"]

    damage_copy(store, FileRecords(), "Mixed.Case", "lease", b'[1, "owner", "soon"]')
    lease = finding(doctor(store, tmp_path, 1), "lease", "Mixed.Case")
    assert lease["status"] == "damaged"
    assert "lease record of run 'Mixed.Case'" in lease["detail"]  # not only its folder


def test_file_store_last_commit(tmp_path: Path) -> None:
    """A torn commit after the last one is no damage; a flipped byte in the last
    commit's head record, which ``head.json`` covers, is."""
    root = tmp_path / "runs"
    store = f"file://{root}"
    demo(store, "torn", tmp_path)
    demo(store, "flipped", tmp_path)
    with (root / "torn" / "log.jsonl").open("ab") as f:
        f.write(b'["m",99,["u",["a commit cut sh')
    assert [f for f in doctor(store, tmp_path, 0) if f["status"] != "ok"] == []
    damage(store, FileRecords(), "flipped", "head")
    broken = finding(doctor(store, tmp_path, 1), "records", "flipped")
    assert broken["status"] == "damaged"
    assert "head record" in broken["detail"]


@pytest.mark.redis
def test_redis_store(tmp_path: Path, redis_store_url: str) -> None:
    demo(redis_store_url, "run-r", tmp_path)
    findings = doctor(redis_store_url, tmp_path, 0)
    persistence = [f for f in findings if f["check"] == "persistence"]
    assert [f["status"] for f in persistence] == ["warning"]  # the test server has AOF off
    for word in ("AOF", "appendfsync always", "not durable"):
        assert word in persistence[0]["detail"]
    assert finding(findings, "records", "run-r")["status"] == "ok"
    assert finding(findings, "commit log", "run-r")["status"] == "ok"
    assert not [f for f in findings if f["status"] == "damaged"]

    damage_copy(redis_store_url, RedisRecords(), "run-r", "lease", b"\xff\xfe1/owner")
    lease = finding(doctor(redis_store_url, tmp_path, 1), "lease", "run-r")
    assert lease["status"] == "damaged"
    assert "lease record of run 'run-r'" in lease["detail"]
    damage_copy(redis_store_url, RedisRecords(), "run-r", "lease", None)

    damage_copy(redis_store_url, RedisRecords(), "run-r", "revision", b"999")
    records = finding(doctor(redis_store_url, tmp_path, 1), "records", "run-r")
    assert records["status"] == "damaged"
    assert "revision field r" in records["detail"]
    revision = finding(findings, "records", "run-r")["detail"].split()[3]  # head at revision N
    damage_copy(redis_store_url, RedisRecords(), "run-r", "revision", revision.encode())
    assert finding(doctor(redis_store_url, tmp_path, 0), "records", "run-r")["status"] == "ok"

    damage(redis_store_url, RedisRecords(), "run-r", "entry")
    log = finding(doctor(redis_store_url, tmp_path, 1), "commit log", "run-r")
    assert "revision 0" in log["detail"]


@pytest.mark.redis
def test_redis_cluster_store(tmp_path: Path, redis_cluster_store_url: str) -> None:
    url = redis_cluster_store_url
    for n in range(6):  # runs in the slots of different nodes
        demo(url, f"run-{n}", tmp_path)
    findings = doctor(url, tmp_path, 0)
    persistence = [f for f in findings if f["check"] == "persistence"]
    assert len(persistence) == CLUSTER_NODES  # one per primary, each with AOF off
    assert {f["status"] for f in persistence} == {"warning"}
    assert all(" node 127.0.0.1:" in f["subject"] for f in persistence)
    for n in range(6):
        assert finding(findings, "records", f"run-{n}")["status"] == "ok"
    assert finding(findings, "run index", url.split("prefix=")[1] + ":runs")["status"] == "ok"
    damage(url, RedisRecords(), "run-3", "entry")
    log = finding(doctor(url, tmp_path, 1), "commit log", "run-3")
    assert "revision 0" in log["detail"]


@pytest.mark.postgres
def test_postgres_store(tmp_path: Path, postgres_store_url: str) -> None:
    empty = doctor_error(postgres_store_url, tmp_path)  # nothing there: nothing created
    assert "holds no store" in empty
    demo(postgres_store_url, "run-p", tmp_path)
    findings = doctor(postgres_store_url, tmp_path, 0)
    assert f"layout version {STORE_VERSION}" in findings[0]["detail"]
    checks = {f["check"]: f for f in findings}
    assert checks["synchronous_commit"]["status"] == "ok"
    fsync = checks["fsync"]
    assert (fsync["status"], fsync["detail"].split(":")[0]) in [("ok", "on"), ("warning", "off")]
    assert finding(findings, "records", "run-p")["status"] == "ok"
    assert finding(findings, "commit log", "run-p")["status"] == "ok"
    assert "free" in finding(findings, "lease", "run-p")["detail"]
    assert not [f for f in findings if f["status"] == "damaged"]

    # a layout an older release left is read as it is, and said to be upgraded by a writer
    from statekernel.stores.postgres._url import parse_postgres_url

    target = parse_postgres_url(postgres_store_url)
    layout = f'UPDATE "{target.schema}".statekernel_schema SET version = '
    pg_admin(target.dsn, layout + "2")
    older = doctor(postgres_store_url, tmp_path, 0)
    assert older[0]["status"] == "warning"
    assert "layout version 2: read as it is" in older[0]["detail"]
    assert finding(older, "records", "run-p")["status"] == "ok"
    pg_admin(target.dsn, layout + "0")
    assert "which no release wrote" in doctor_error(postgres_store_url, tmp_path)
    pg_admin(target.dsn, layout + str(STORE_VERSION))

    damage_copy(postgres_store_url, PostgresRecords(), "run-p", "lease", b"damaged")
    lease = finding(doctor(postgres_store_url, tmp_path, 1), "lease", "run-p")
    assert lease["status"] == "damaged"
    assert "lease record of run 'run-p'" in lease["detail"]
    damage_copy(postgres_store_url, PostgresRecords(), "run-p", "lease", None)

    damage_copy(postgres_store_url, PostgresRecords(), "run-p", "revision", b"999")
    records = finding(doctor(postgres_store_url, tmp_path, 1), "records", "run-p")
    assert records["status"] == "damaged"
    assert "revision column" in records["detail"]
    revision = finding(findings, "records", "run-p")["detail"].split()[3]  # head at revision N
    damage_copy(postgres_store_url, PostgresRecords(), "run-p", "revision", revision.encode())
    assert finding(doctor(postgres_store_url, tmp_path, 0), "records", "run-p")["status"] == "ok"

    damage(postgres_store_url, PostgresRecords(), "run-p", "entry")
    log = finding(doctor(postgres_store_url, tmp_path, 1), "commit log", "run-p")
    assert "revision 0" in log["detail"]


def doctor_error(store: str, cwd: Path) -> str:
    """The one error line of a doctor that cannot check ``store``."""
    done = sk("doctor", "--store", store, cwd=cwd)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    return lines[0]


def test_user_errors_create_nothing(tmp_path: Path) -> None:
    cases: list[tuple[list[str], Any]] = [
        (["--store", f"sqlite:///{tmp_path / 'none' / 'runs.db'}"], tmp_path / "none"),
        (["--store", f"file://{tmp_path / 'folder'}"], tmp_path / "folder"),
        ([], tmp_path / ".statekernel"),  # the default store
        (["--store", "nosuch://x"], None),
    ]
    for args, path in cases:
        done = sk("doctor", *args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.splitlines()
        assert len(lines) == 1
        assert lines[0].startswith("error: ")
        if path is not None:
            assert str(path) in lines[0] or path.name in lines[0]
            assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_memory_store_is_not_durable(tmp_path: Path) -> None:
    findings = doctor("memory://", tmp_path, 0)
    assert [(f["check"], f["status"]) for f in findings] == [("durability", "warning")]


def test_sqlite_lost_blob_of_a_transcript_message(tmp_path: Path) -> None:
    """A blob only the transcript references (a long user message) is found missing by
    the records check, and the other runs are still reported."""
    import sqlite3

    import statekernel as sk

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    demo(store, "run-a", tmp_path)

    async def long_message() -> None:
        async with sk.Kernel(store) as kernel:
            await kernel.start(model="openai/gpt-4o", messages=["x" * 400], run_id="long")

    asyncio.run(long_message())
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        (rid,) = conn.execute("SELECT id FROM runs WHERE run_id = 'long'").fetchone()
        assert conn.execute("DELETE FROM blobs WHERE rid = ?", (rid,)).rowcount >= 1
    findings = doctor(store, tmp_path, 1)
    records = finding(findings, "records", "long")
    assert records["status"] == "damaged"
    assert "is missing" in records["detail"]
    assert finding(findings, "records", "run-a")["status"] == "ok"
