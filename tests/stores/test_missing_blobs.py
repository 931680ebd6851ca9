"""A blob that a run's message or completed turn references and the store lost is raised
by the ``load`` that read the run's blobs, as ``CorruptCheckpoint`` naming the run, the
record and the blob: not later, when the transcript or the turn is first read."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from statekernel._records.messages import Message
from statekernel._records.run import Run
from statekernel.errors import CorruptCheckpoint
from statekernel.stores import Checkpoint
from statekernel.stores._format.blobs import blob_key
from statekernel.testing import (
    FileRecords,
    ManualClock,
    MemoryRecords,
    PostgresRecords,
    RawRecords,
    RedisRecords,
    SQLiteRecords,
)
from statekernel.testing._store_cases import sample_run

from ..conftest import STORE_KINDS
from .test_conformance import factory_for

RAW: dict[str, RawRecords] = {
    "memory": MemoryRecords(),
    "file": FileRecords(),
    "sqlite": SQLiteRecords(),
    "redis": RedisRecords(),
    "redis-cluster": RedisRecords(),
    "postgres": PostgresRecords(),
}

QUESTION = "a question long enough to be stored as a blob of its own; " * 8
"""Held by a message of the transcript only."""

TOOL_OUTPUT = "a tool output long enough to be stored as a blob of its own; " * 8
"""Held by a completed turn only (the tool message says something shorter)."""


def run_with_blobs(run_id: str) -> Run:
    """A run whose transcript ends with ``QUESTION`` and whose first completed turn
    records ``TOOL_OUTPUT``."""
    run = sample_run(run_id)
    first = run.turns[0]
    record = attrs.evolve(first.completed[0], output=TOOL_OUTPUT)
    turns = (attrs.evolve(first, completed=(record,)), *run.turns[1:])
    return attrs.evolve(run, messages=(*run.messages, Message.user(QUESTION)), turns=turns)


@pytest.mark.parametrize("kind", STORE_KINDS)
@pytest.mark.parametrize(
    ("text", "record"), [(QUESTION, "message"), (TOOL_OUTPUT, "completed turn")]
)
async def test_a_missing_blob_is_raised_by_the_load_that_found_it(
    kind: str, text: str, record: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = factory_for(kind, tmp_path, request, ManualClock())()
    try:
        run = run_with_blobs("lost")
        await store.commit(Checkpoint.between(None, run))
        assert await store.load("lost") == run
        key = blob_key(text)
        await RAW[kind].write(store, "lost", ("blob", key), None)
        with pytest.raises(CorruptCheckpoint) as caught:
            await store.load("lost")
        found = str(caught.value)
        for word in ("'lost'", record, f"blob {key} is missing"):
            assert word in found, f"{found!r} does not name {word!r}"
    finally:
        await store.aclose()


@pytest.mark.parametrize("kind", STORE_KINDS)
async def test_an_object_that_looks_like_a_blob_marker_is_no_missing_blob(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = factory_for(kind, tmp_path, request, ManualClock())()
    try:
        run = sample_run("lookalike")
        first = run.turns[0]
        record = attrs.evolve(first.completed[0], input={"$b": "no-such-blob", "$v": "x"})
        run = attrs.evolve(run, turns=(attrs.evolve(first, completed=(record,)), *run.turns[1:]))
        await store.commit(Checkpoint.between(None, run))
        assert await store.load("lookalike") == run
    finally:
        await store.aclose()
