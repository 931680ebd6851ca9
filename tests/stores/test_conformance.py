"""Every store passes the conformance suite ``statekernel.testing.check_store``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from statekernel.stores import CheckpointStore, FileStore, MemoryStore, SQLiteStore, open_store
from statekernel.testing import (
    FileRecords,
    ManualClock,
    MemoryRecords,
    PostgresRecords,
    RawRecords,
    RedisRecords,
    SQLiteRecords,
    check_store,
)

from ..conftest import STORE_KINDS

KINDS = STORE_KINDS


def factory_for(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, clock: ManualClock
) -> Callable[[], CheckpointStore]:
    """Fresh stores of ``kind`` whose leases expire on ``clock``, except on Redis and
    Postgres (which expire them on the server's clock)."""
    counter = itertools.count()

    def make() -> CheckpointStore:
        n = next(counter)
        if kind == "memory":
            return MemoryStore(clock=clock)
        if kind == "file":
            return FileStore(f"file://{tmp_path}/files-{n}", clock=clock)
        if kind == "sqlite":
            return SQLiteStore(f"sqlite:///{tmp_path}/db-{n}/runs.db", clock=clock)
        if kind == "postgres":  # a schema each, inside this test's schema name
            url = request.getfixturevalue("postgres_store_url")
            return open_store(f"{url}_{n}")
        if kind == "redis-cluster":
            return open_store(f"{request.getfixturevalue('redis_cluster_store_url')}-{n}")
        base = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        return open_store(f"{base}/0?prefix={prefix}-{n}")

    return make


LEASED = "a new run's commit takes its lease (CreatesLeased)"
CANCELS = "cancel requests (CancelsRuns)"


@pytest.mark.parametrize("kind", KINDS)
async def test_store_conformance(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    raw: dict[str, RawRecords] = {
        "memory": MemoryRecords(),
        "file": FileRecords(),
        "sqlite": SQLiteRecords(),
        "redis": RedisRecords(),
        "redis-cluster": RedisRecords(),
        "postgres": PostgresRecords(),
    }
    clock = ManualClock()
    factory = factory_for(kind, tmp_path, request, clock)
    clocked = (
        None if kind in ("redis", "redis-cluster", "postgres") else clock
    )  # the server's own clock
    names = await check_store(factory, examples=30, raw=raw[kind], clock=clocked)
    declared = {
        "memory": [
            "a cancelled commit has settled (SettlesOnCancel)",
            "a commit gives its lease up with it (ReleasesWithCommit)",
            CANCELS,
            LEASED,
        ],
        "file": ["history of every revision (RevisionHistory)", CANCELS, LEASED],
        "sqlite": [
            "history of every revision (RevisionHistory)",
            "a cancelled commit has settled (SettlesOnCancel)",
            "a commit gives its lease up with it (ReleasesWithCommit)",
            CANCELS,
            LEASED,
        ],
        "redis": ["history of every revision (RevisionHistory)", CANCELS, LEASED],
        "redis-cluster": ["history of every revision (RevisionHistory)", CANCELS, LEASED],
        "postgres": [
            "history of every revision (RevisionHistory)",
            "a cancelled commit has settled (SettlesOnCancel)",
            "a commit gives its lease up with it (ReleasesWithCommit)",
            CANCELS,
            LEASED,
        ],
    }
    damage = ["damaged records", "missing records", "commit log gaps"]
    damage += [] if kind == "memory" else ["damaged copies"]  # copies outside the checksums
    assert len(names) == 20 + len(declared[kind]) + len(damage)
    assert "listing by tags" in names
    assert "whose lease an acquire took over" in names
    assert "a cancelled call raises its cancellation" in names
    assert names[19 : -len(damage) - 1] == declared[kind]
    assert names[-len(damage) - 1 :] == [*damage, "persisting migrations"]
