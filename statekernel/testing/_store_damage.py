"""Conformance checks on damaged storage: checksums on every record, gaps in the commit log.

They reach below the store through ``RawRecords`` (``check_store(factory, raw=...)``).
"""

from __future__ import annotations

import attrs

from statekernel._records.run import Run
from statekernel._storage.protocol import Checkpoint, CheckpointStore
from statekernel.errors import CorruptCheckpoint
from statekernel.testing._raw import RawRecords, RecordKey
from statekernel.testing._store_cases import events_for, next_revision, sample_run

__all__ = ["check_damaged_records", "check_log_gaps", "corrupt_raised"]

_LONG = "a note long enough to be stored as a blob of its own; " * 8


async def _chain(store: CheckpointStore, run_id: str, revisions: int) -> list[Run]:
    """A run with a blob in its context and ``revisions`` more revisions, each with events."""
    run = sample_run(run_id)
    run = attrs.evolve(run, context={"user": "u1", "notes": _LONG})
    chain = [run]
    await store.commit(Checkpoint.between(None, run, events_for(run, 1, 0)))
    for i in range(revisions):
        nxt = next_revision(chain[-1])
        await store.commit(Checkpoint.between(chain[-1], nxt, events_for(nxt, 2, 1 + 2 * i)))
        chain.append(nxt)
    return chain


async def corrupt_raised(work: object, run_id: str, words: tuple[str, ...], what: str) -> None:
    """Awaiting ``work`` raises ``CorruptCheckpoint`` naming the run and ``words``."""
    try:
        await work  # type: ignore[misc]
    except CorruptCheckpoint as exc:
        text = str(exc)
        for word in (run_id, *words):
            assert word in text, f"{what}: {text!r} does not name {word!r}"
        return
    raise AssertionError(f"{what}: no CorruptCheckpoint")


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def _holding(records: dict[RecordKey, bytes], kind: str, needle: bytes) -> RecordKey:
    for key, data in records.items():
        if key[0] == kind and needle in data:
            return key
    raise AssertionError(f"no stored {kind} holds {needle!r} as text")


async def check_damaged_records(store: CheckpointStore, raw: RawRecords) -> None:
    """A byte flipped inside a stored message, turn, blob, head or commit log entry raises
    ``CorruptCheckpoint`` naming the run and the record, on load and on ``events``; a
    listing leaves a run with a damaged head out and names it in ``damaged``."""
    run_id = "damaged"
    chain = await _chain(store, run_id, 3)
    records = await raw.read(store, run_id)
    targets = [
        ("message", b"sunny 1", ("message",)),
        ("turn", b"sunny 0", ("turn",)),
        ("blob", b"a note long enough", ("blob",)),
        ("head", b"calling_model", ("head",)),
    ]
    for kind, needle, words in targets:
        key = _holding(records, kind, needle)
        original = records[key]
        await raw.write(store, run_id, key, _flip(original, original.index(needle) + 2))
        await corrupt_raised(store.load(run_id), run_id, words, f"load with a damaged {kind}")
        if kind == "head":  # a listing leaves it out and names it, listing the others
            page = await store.list_runs()
            assert run_id not in [s.run_id for s in page.runs], "a damaged run was listed"
            assert [d.run_id for d in page.damaged] == [run_id], "damaged run not named"
            assert "head" in page.damaged[0].problem, "the problem names the record"
        await raw.write(store, run_id, key, original)
        assert await store.load(run_id) == chain[-1], f"load after the {kind} was repaired"
    key = ("entry", 1)
    original = records[key]
    await raw.write(store, run_id, key, _flip(original, len(original) // 2))
    words = ("revision 1",)
    await corrupt_raised(store.events(run_id), run_id, words, "events with a damaged entry")
    await corrupt_raised(
        store.load(run_id, revision=1), run_id, words, "load of a damaged revision"
    )
    await raw.write(store, run_id, key, original)
    assert len(await store.events(run_id)) == 7, "events after the entry was repaired"


async def check_log_gaps(store: CheckpointStore, raw: RawRecords) -> None:
    """A commit log entry missing (in the middle, or the last) raises ``CorruptCheckpoint``
    naming the run and the missing revision, from ``events`` and ``load(revision=...)``."""
    await _chain(store, "gap", 4)
    await raw.write(store, "gap", ("entry", 2), None)
    await corrupt_raised(store.events("gap"), "gap", ("revision 2",), "events with a gap")
    await corrupt_raised(store.load("gap", revision=3), "gap", ("revision 2",), "load past a gap")
    await _chain(store, "tail", 4)
    await raw.write(store, "tail", ("entry", 4), None)
    await corrupt_raised(store.events("tail"), "tail", ("revision 4",), "events with the last lost")
