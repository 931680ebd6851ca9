"""Conformance checks on damaged storage: checksums on every record, records that are
missing, gaps in the commit log, damaged copies of head fields and lease records.

They reach below the store through ``RawRecords`` (``check_store(factory, raw=...)``),
and through ``RawCopies`` for what a store keeps outside its checksummed records.
"""

from __future__ import annotations

import attrs

from statekernel._records.messages import Message
from statekernel._records.run import Run, StateId
from statekernel._storage.protocol import Checkpoint, CheckpointStore
from statekernel.errors import CorruptCheckpoint, LeaseLost
from statekernel.stores._format.documents import dump_bytes
from statekernel.testing._raw import RawCopies, RawDocuments, RawRecords, RecordKey
from statekernel.testing._store_cases import events_for, next_revision, sample_run

__all__ = [
    "check_damaged_copies",
    "check_damaged_records",
    "check_log_gaps",
    "check_missing_records",
    "corrupt_raised",
]

_LONG = "a note long enough to be stored as a blob of its own; " * 8
_QUESTION = "a question long enough to be stored as a blob of its own; " * 8


async def _chain(
    store: CheckpointStore, run_id: str, revisions: int, *, question: bool = False
) -> list[Run]:
    """A run with a blob in its context (and with ``question``, a message held in a
    blob) and ``revisions`` more revisions, each with events."""
    run = sample_run(run_id)
    run = attrs.evolve(run, context={"user": "u1", "notes": _LONG})
    if question:
        run = attrs.evolve(run, messages=(*run.messages, Message.user(_QUESTION)))
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


def _holding(
    records: dict[RecordKey, bytes], kind: str, needle: bytes, raw: RawRecords
) -> RecordKey:
    """The record of ``kind`` holding ``needle``: as text, or in the document of a record
    stored compressed (``RawDocuments``)."""
    for key, data in records.items():
        if key[0] == kind and needle in data:
            return key
    if isinstance(raw, RawDocuments) and kind in ("head", "entry", "message", "turn"):
        for key, data in records.items():
            if key[0] == kind and needle in dump_bytes(raw.decode(key, data)):
                return key
    raise AssertionError(f"no stored {kind} holds {needle!r}")


def _inside(data: bytes, needle: bytes) -> int:
    """Where to flip a byte of a record: in ``needle`` when it is stored as text, else
    in the middle."""
    return data.index(needle) + 2 if needle in data else len(data) // 2


async def check_damaged_records(store: CheckpointStore, raw: RawRecords) -> None:
    """A byte flipped inside a stored message, turn, blob, head or commit log entry raises
    ``CorruptCheckpoint`` naming the run and the record, on load and on ``events``; a
    listing leaves a run with a damaged head out and names it in ``damaged``. Another
    run's head in its place is ``CorruptCheckpoint`` too."""
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
        key = _holding(records, kind, needle, raw)
        original = records[key]
        await raw.write(store, run_id, key, _flip(original, _inside(original, needle)))
        await corrupt_raised(store.load(run_id), run_id, words, f"load with a damaged {kind}")
        if kind == "head":  # a listing leaves it out and names it, listing the others
            page = await store.list_runs()
            assert run_id not in [s.run_id for s in page.runs], "a damaged run was listed"
            assert [d.run_id for d in page.damaged] == [run_id], "damaged run not named"
            assert "head" in page.damaged[0].problem, "the problem names the record"
        await raw.write(store, run_id, key, original)
        assert await store.load(run_id) == chain[-1], f"load after the {kind} was repaired"
    await _chain(store, "other", 3)  # another run's head, intact, in this run's place
    other = (await raw.read(store, "other"))[("head", 0)]
    await raw.write(store, run_id, ("head", 0), other)
    what = "load with the head of another run in its place"
    await corrupt_raised(store.load(run_id), run_id, ("head", "other"), what)
    await raw.write(store, run_id, ("head", 0), records[("head", 0)])
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


async def _loaded(store: CheckpointStore, run_id: str) -> Run:
    """The run, its transcript and completed turns read (they decode when first read)."""
    run = await store.load(run_id)
    for _ in (*run.messages, *run.turns):
        pass
    return run


async def check_missing_records(store: CheckpointStore, raw: RawRecords) -> None:
    """A message, a completed turn or a blob (one the head references, one a message
    does) that is missing raises ``CorruptCheckpoint`` naming the run and the record."""
    lost: list[tuple[str, bytes | None]] = [
        ("message", None),
        ("turn", None),
        ("blob", b"a note long enough"),
        ("blob", b"a question long enough"),
    ]
    for n, (kind, needle) in enumerate(lost):
        run_id = f"lost-{n}"
        await _chain(store, run_id, 1, question=True)
        records = await raw.read(store, run_id)
        if needle is None:
            key = min(k for k in records if k[0] == kind)
        else:
            key = _holding(records, kind, needle, raw)
        await raw.write(store, run_id, key, None)
        what = f"load with a {kind} missing ({key})"
        await corrupt_raised(_loaded(store, run_id), run_id, (kind,), what)


async def _listed_damaged(
    store: CheckpointStore, run_id: str, state: StateId | None, word: str
) -> None:
    page = await store.list_runs(state=state)
    what = f"a listing (state {state}) with a damaged {word}"
    assert run_id not in [s.run_id for s in page.runs], f"{what}: the run was listed"
    problems = [d.problem for d in page.damaged if d.run_id == run_id]
    assert problems, f"{what}: the run is not named damaged"
    assert word in problems[0], f"{what}: {problems[0]!r} does not name {word!r}"


async def check_damaged_copies(store: CheckpointStore, raw: RawCopies) -> None:
    """A store's copies of head fields (``run_id``, ``revision``, ``state``) that no
    longer match the head raise ``CorruptCheckpoint`` naming the run and the field on
    load, events and commit, and a listing (by that state too) names the run damaged
    instead of leaving it out; a damaged lease record raises ``CorruptCheckpoint`` naming
    the run and the lease, and a missing one too where the store keeps it
    (``lease_kept``)."""
    run_id = "copies"
    head = (await _chain(store, run_id, 3))[-1]
    nxt = next_revision(head)
    step = Checkpoint.between(head, nxt, events_for(nxt, 1, 7))
    if "revision" in raw.copies:
        words = ("revision", "head")
        for wrong in (b"2", b"4"):
            await raw.write_copy(store, run_id, "revision", wrong)
            what = f"revision copy {wrong.decode()} of a head at 3"
            await corrupt_raised(store.load(run_id), run_id, words, f"load: {what}")
            await corrupt_raised(store.load(run_id, revision=2), run_id, words, f"past: {what}")
            await corrupt_raised(store.events(run_id), run_id, words, f"events: {what}")
            await corrupt_raised(store.commit(step), run_id, words, f"commit: {what}")
            await _listed_damaged(store, run_id, None, "revision")
        await raw.write_copy(store, run_id, "revision", b"3")
        assert await store.load(run_id) == head, "load after the revision copy was repaired"
    if "state" in raw.copies:
        for wrong, listing in ((b"qaused", head.state), (b"completed", "completed")):
            await raw.write_copy(store, run_id, "state", wrong)
            what = f"state copy {wrong.decode()} of a head in {head.state}"
            await corrupt_raised(store.load(run_id), run_id, ("state",), f"load: {what}")
            await corrupt_raised(store.commit(step), run_id, ("state",), f"commit: {what}")
            await _listed_damaged(store, run_id, None, "state")
            await _listed_damaged(store, run_id, listing, "state")
        await raw.write_copy(store, run_id, "state", head.state.encode())
        assert await store.load(run_id) == head, "load after the state copy was repaired"
    if "run_id" in raw.copies:  # the run's row found under another id
        await raw.write_copy(store, run_id, "run_id", b"copies-2")
        what = "a run found under another run id"
        await corrupt_raised(store.load("copies-2"), "copies-2", ("run_id", run_id), what)
        await _listed_damaged(store, "copies-2", None, "run_id")
        await raw.write_copy(store, "copies-2", "run_id", run_id.encode())
        assert await store.load(run_id) == head, "load after the run id copy was repaired"
    if "lease" in raw.copies:
        await _check_lease_record(store, raw, run_id, step)


async def _check_lease_record(
    store: CheckpointStore, raw: RawCopies, run_id: str, step: Checkpoint
) -> None:
    lease = await store.acquire(run_id, "owner-a", ttl=600)
    await raw.write_copy(store, run_id, "lease", b"\xff\xfe7/not a lease")
    what = "acquire with a damaged lease record"
    await corrupt_raised(store.acquire(run_id, "owner-b", ttl=600), run_id, ("lease",), what)
    try:
        await store.commit(step, lease=lease)
    except (CorruptCheckpoint, LeaseLost):
        pass
    else:
        raise AssertionError("a commit fenced by a damaged lease record landed")
    assert (await store.load(run_id)).revision == step.expected_revision, "a commit landed"
    if raw.lease_kept:
        await raw.write_copy(store, run_id, "lease", None)
        what = "a fenced commit with its lease record missing"
        await corrupt_raised(store.commit(step, lease=lease), run_id, ("lease",), what)
