"""Every file a store creates is 0600 and every folder 0700 (stored runs can hold
personal data), whatever the umask lets through: checked under a umask of 0022."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import statekernel as sk
from statekernel._storage.protocol import CheckpointStore
from statekernel.stores import FileStore, SQLiteStore, migrate
from statekernel.testing import ScriptedProvider, call


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    """The common umask, under which a file created with default modes is 0644."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _too_open(top: Path) -> dict[str, str]:
    """Every folder under ``top`` (itself included) that is not 0700, and every file
    that is not 0600, with its mode."""
    wrong: dict[str, str] = {}
    mode = stat.S_IMODE(top.stat().st_mode)
    if mode != 0o700:
        wrong[str(top)] = oct(mode)
    for folder, folders, files in os.walk(top):
        for name, want in [*((n, 0o700) for n in folders), *((n, 0o600) for n in files)]:
            path = Path(folder, name)
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode != want:
                wrong[str(path.relative_to(top))] = oct(mode)
    return wrong


def _names(top: Path) -> set[str]:
    return {str(p.relative_to(top)) for p in top.rglob("*")}


@sk.tool
def note(text: str) -> str:
    """Note something down."""
    return f"noted {text}"


def _options() -> dict[str, object]:
    script = [call("note", {"text": "a"}), "done"]
    return {"tools": [note], "providers": {"scripted": ScriptedProvider(script)}}


async def _use(store: CheckpointStore, top: Path) -> tuple[dict[str, str], set[str]]:
    """Drive runs (several at once: their commits share a group write), then hold a
    lease and look at every file and folder under ``top`` while it is held: those not
    private, and the names (owner locks cut short)."""
    kernel = sk.Kernel(store, **_options())  # type: ignore[arg-type]
    try:

        async def one(run_id: str) -> None:
            await kernel.start(model="scripted/app", messages=["go"], run_id=run_id)
            async for _ in kernel.run(run_id):
                pass

        await asyncio.gather(*(one(f"run-{n}") for n in range(4)))
        assert (await kernel.get("run-0")).state == "completed"
        lease = await store.acquire("run-0", "checker", ttl=60.0)
        try:
            return _too_open(top), _names(top)
        finally:
            await store.release(lease)
    finally:
        await kernel.aclose()


async def test_file_store(tmp_path: Path) -> None:
    top = tmp_path / "data"
    store = FileStore(f"file://{top / 'runs' / 'store'}")
    try:
        wrong, names = await _use(store, top)
        assert wrong == {}
        assert "runs/store/run-0/lease.json" in names
        assert any(n.startswith("runs/store/.owners/") for n in names)  # the owner lock
    finally:
        await store.aclose()
    assert _too_open(top) == {}


async def test_sqlite_store(tmp_path: Path) -> None:
    top = tmp_path / "data"
    path = top / "nested" / "runs.db"
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        wrong, names = await _use(store, top)
        assert wrong == {}
        assert {"nested/runs.db", "nested/runs.db-wal", "nested/runs.db-shm"} <= names
        assert any(n.startswith("nested/runs.db-owners/") for n in names)  # the owner lock
    finally:
        await store.aclose()
    assert _too_open(top) == {}


async def test_a_migration_creates_private_stores(tmp_path: Path) -> None:
    source = SQLiteStore(f"sqlite:///{tmp_path / 'source' / 'runs.db'}")
    try:
        await _use(source, tmp_path / "source")
    finally:
        await source.aclose()
    file_copy = tmp_path / "to-file"
    sqlite_copy = tmp_path / "to-sqlite"
    result = await migrate(f"sqlite:///{tmp_path / 'source' / 'runs.db'}", f"file://{file_copy}")
    assert result.copied == 4
    await migrate(f"file://{file_copy}", f"sqlite:///{sqlite_copy / 'deep' / 'runs.db'}")
    assert _too_open(file_copy) == {}
    assert _too_open(sqlite_copy) == {}
