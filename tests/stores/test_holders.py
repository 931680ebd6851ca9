"""``ShowsHolders``: who holds a run's lease, read without writing (memory, SQLite).

A reader on a SQLite store opened read-only sees an owner of another process while its
process lives and no owner once it died, and leaves that dead owner's lock file for
the next taker to clear; owners of its own process hold until their lease expires."""

from __future__ import annotations

import asyncio
import signal
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import pytest

from statekernel._storage.holders import ShowsHolders, driven
from statekernel.errors import RunNotFound
from statekernel.stores import Checkpoint, MemoryStore, SQLiteStore
from statekernel.testing import ManualClock
from statekernel.testing._store_cases import sample_run

HOLDER = """
import asyncio, sys
from statekernel.stores import SQLiteStore

async def main() -> None:
    store = SQLiteStore(sys.argv[1])
    await store.acquire("held", "owner-elsewhere", ttl=0.001)
    print("HELD", flush=True)
    await asyncio.to_thread(sys.stdin.readline)

asyncio.run(main())
"""
"""A process that holds the run ``held`` of the SQLite store ``argv[1]`` until killed
(its lease expired long ago: only its lock proves it alive)."""


async def _stored(store: SQLiteStore | MemoryStore, run_id: str) -> None:
    run = sample_run(run_id)
    await store.commit(Checkpoint.between(None, run, ()))


async def test_memory_owners_hold_until_released_or_expired() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    assert isinstance(store, ShowsHolders)
    await _stored(store, "r1")
    assert await store.holder("r1") is None
    lease = await store.acquire("r1", "owner-a", ttl=5.0)
    assert await store.holder("r1") == "owner-a"
    assert await driven(store, "r1") is True
    await store.release(lease)
    assert await store.holder("r1") is None
    await store.acquire("r1", "owner-b", ttl=5.0)
    clock.advance(6.0)
    assert await store.holder("r1") is None  # expired: a taker would get it
    with pytest.raises(RunNotFound):
        await store.holder("nope")
    await store.aclose()


async def test_a_read_only_sqlite_reader_sees_another_process_live_then_dead(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    writer = SQLiteStore(url)
    await _stored(writer, "held")
    await writer.aclose()
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-c", HOLDER, url, stdin=PIPE, stdout=PIPE
    )
    reader = SQLiteStore(url, read_only=True)
    try:
        assert holder.stdout is not None
        assert await holder.stdout.readline() == b"HELD\n"
        owners = sorted((tmp_path / "runs.db-owners").iterdir())
        assert await reader.holder("held") == "owner-elsewhere"
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
        assert await reader.holder("held") is None
        assert await driven(reader, "held") is False
        assert sorted((tmp_path / "runs.db-owners").iterdir()) == owners  # left as it was
        with pytest.raises(RunNotFound):
            await reader.holder("nope")
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await reader.aclose()
    taker = SQLiteStore(url)
    try:
        await taker.acquire("held", "owner-next", ttl=5.0)  # the dead owner's run is free
        assert await taker.holder("held") == "owner-next"
    finally:
        await taker.aclose()
