"""A loaded run decodes its messages and completed turns when they are read, never
before, and one that cannot be decoded is a ``CorruptCheckpoint`` when it is read."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import redis as redis_sync

from statekernel._records.run import Run
from statekernel.errors import CorruptCheckpoint
from statekernel.stores import Checkpoint, open_store
from statekernel.stores._format.checksum import seal
from statekernel.testing._store_cases import sample_run


async def _committed(url: str, turns: int = 4) -> Run:
    store = open_store(url)
    run = sample_run("lazy", turns=turns)
    await store.commit(Checkpoint.between(None, run))
    await store.aclose()
    return run


@pytest.fixture(params=["file", "sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path}/runs"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    return str(request.getfixturevalue("redis_store_url"))


async def test_completed_turns_are_decoded_when_read(store_url: str) -> None:
    run = await _committed(store_url)
    store = open_store(store_url)
    loaded = await store.load("lazy")
    await store.aclose()
    assert len(loaded.turns) == len(run.turns) == 4
    assert loaded.turns.deferred == 4, "loading decoded completed turns"
    assert loaded.turn_count == run.turn_count
    assert loaded.turns[2] == run.turns[2]
    assert loaded.turns.deferred == 3
    assert loaded.turns[1:3].deferred == 1, "a slice shares the deferred turns"
    assert loaded == run
    assert loaded.turns.deferred == 0
    assert loaded.turns[2] is loaded.turns[2], "a decoded turn is kept"


async def test_messages_are_decoded_when_read(store_url: str) -> None:
    run = await _committed(store_url)
    store = open_store(store_url)
    loaded = await store.load("lazy")
    await store.aclose()
    count = len(run.messages)
    assert len(loaded.messages) == count
    assert loaded.messages.deferred == count, "loading decoded messages"
    assert loaded.messages[-1] == run.messages[-1]
    assert loaded.messages.deferred == count - 1
    assert list(loaded.turns) == list(run.turns), "turns decode their requests' messages"
    assert loaded.messages == run.messages
    assert loaded.messages.deferred == 0
    assert loaded.messages[0] is loaded.messages[0], "a decoded message is kept"


async def test_undecodable_message_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    run = await _committed(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE messages SET doc = ? WHERE pos = 1", (seal(b'{"role": 7}'),))
    store = open_store(f"sqlite:///{path}")
    loaded = await store.load("lazy")
    await store.aclose()
    assert loaded.messages[0] == run.messages[0]
    with pytest.raises(CorruptCheckpoint, match=r"message 1 of run 'lazy'.*runs\.db"):
        loaded.messages[1]
    with pytest.raises(CorruptCheckpoint):  # still undecodable on the next read
        list(loaded.messages)


async def test_damaged_completed_turn_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    run = await _committed(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE turns SET doc = ? WHERE pos = 1", (seal(b'{"i": 1, "q": '),))
    store = open_store(f"sqlite:///{path}")
    loaded = await store.load("lazy")
    await store.aclose()
    assert loaded.turns[0] == run.turns[0]
    with pytest.raises(CorruptCheckpoint, match=r"completed turn of run 'lazy'.*runs\.db"):
        loaded.turns[1]
    with pytest.raises(CorruptCheckpoint):  # still damaged on the next read
        list(loaded.turns)
    assert loaded.messages == run.messages


@pytest.mark.redis
async def test_damaged_completed_turn_redis(redis_store_url: str, redis_prefix: str) -> None:
    run = await _committed(redis_store_url)
    client = redis_sync.Redis.from_url(redis_store_url.split("?")[0])
    # redis-py types lset's value as str only; bytes are sent as they are
    client.lset(f"{redis_prefix}:{{lazy}}:t", 2, seal(b'{"i": "two"}'))  # type: ignore[arg-type]
    client.close()
    store = open_store(redis_store_url)
    loaded = await store.load("lazy")
    await store.aclose()
    assert loaded.turns[3] == run.turns[3]
    with pytest.raises(CorruptCheckpoint, match="completed turn of run 'lazy'"):
        loaded.turns[2]


async def test_a_loaded_run_pickles_and_deep_copies(tmp_path: Path) -> None:
    import copy
    import pickle

    run = await _committed(f"sqlite:///{tmp_path}/runs.db")
    store = open_store(f"sqlite:///{tmp_path}/runs.db")
    loaded = await store.load("lazy")
    await store.aclose()
    assert pickle.loads(pickle.dumps(loaded)) == run
    assert copy.deepcopy(loaded) == run
