"""The stored encoding shared by the persistent stores (file, SQLite, Redis).

A run is stored as append-only parts plus a small mutable head:

* the **message log**: every message once, in order; the transcript of a revision
  is a range ``[m0, m0 + n)`` of it (``"$m"`` in the head). A transcript rewritten
  by a hook is appended again at the end, so older revisions keep their range;
* the **turn log**: every completed turn once (``"$t"`` in the head);
* **blobs**: long strings and large JSON values, once per run, by content hash
  (zlib-compressed when that pays, ``blobs``);
* the **head**: the run without its messages and turns (a few hundred bytes),
  ``StorageConverter.unstructure_head``, with ``"$m"`` and ``"$t"`` added;
* the **commit log**: one entry per revision with the head as a patch of the
  previous head (a full head every ``SNAPSHOT_EVERY`` revisions, ``patches``) and
  the events of that commit (``events``), so every revision stays loadable and
  events are read by revision; stores keep entries deflated with a preset
  dictionary (``dicts``).

Heads, messages and turns are the documents of the storage converter
(``converter``), lent for the commit with what it needs (``writing(Storing(...))``)
so long strings are blobs and a request's messages and a result's message are
references into the message log. After every commit the transcript
ends at the end of the message log and the completed turns at the end of the turn
log, so a store knows where to append from the head alone. Decoding gives records
equal to the ones committed, sharing their messages as they did.

A head records the ``schema_version`` it was written at, and the messages and turns
it references are stored at that version. A run stored at an older version is read
through the migrations registered with ``statekernel._records.convert.register_migration``
(on the stored documents, before they are decoded); the next commit writes its
head in full and every message and completed turn again, at the current version, so
from then on no read of the run's head goes through the old records (they stay for
the revisions before, which keep reading through the migrations).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import attrs

from statekernel._records import convert
from statekernel._records.events import Event
from statekernel._records.lazy import Deferred, LazyTuple
from statekernel._records.messages import Message
from statekernel._records.run import STATE_IDS, PauseInfo, Run, StateId, Turn
from statekernel._storage.protocol import Checkpoint, RunSummary
from statekernel.errors import CorruptCheckpoint
from statekernel.stores._format.blobs import blob_refs, missing_blob
from statekernel.stores._format.converter import NO_BLOBS, Loading, Storing, reading, writing
from statekernel.stores._format.documents import corrupt, dec_time, dump_bytes, load_json
from statekernel.stores._format.events import decode_events, encode_events
from statekernel.stores._format.patches import SNAPSHOT_EVERY, apply_patch, diff

__all__ = [
    "SNAPSHOT_EVERY",
    "EncodedCommit",
    "check_log",
    "check_parts",
    "check_run_id",
    "decode_events",
    "decode_run",
    "encode_commit",
    "entry_head",
    "head_summary",
    "iter_history",
    "log_ends",
    "replay",
    "snapshot_of",
]

_R = TypeVar("_R")

_DECODE_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError, zlib.error)


@attrs.frozen
class EncodedCommit:
    """What a store writes for one commit.

    ``messages`` go to positions ``first_message...`` of the message log and
    ``turns`` to ``first_turn...`` of the turn log; ``blobs`` are new blobs (a store
    keeps the first copy of a key); ``entry`` is the commit log entry of the revision.
    """

    head: dict[str, Any]
    entry: dict[str, Any]
    first_message: int
    messages: tuple[bytes, ...]
    first_turn: int
    turns: tuple[bytes, ...]
    blobs: dict[str, bytes]
    refs: frozenset[str]
    """Keys of the blobs ``head`` references (the ``known`` of the next commit)."""


def log_ends(head: Mapping[str, Any]) -> tuple[int, int]:
    """Lengths of the message log and the turn log as of ``head``."""
    try:
        m0, mn = head["$m"]
        t0, tn = head["$t"]
        return int(m0) + int(mn), int(t0) + int(tn)
    except _DECODE_ERRORS as exc:
        raise corrupt("run head", exc) from exc


def check_parts(ends: tuple[int, int], messages: int, turns: int, what: str) -> None:
    """Raise ``CorruptCheckpoint`` naming the records that are missing when fewer than
    ``ends`` (``log_ends`` of a head) messages or completed turns are stored."""
    m_end, t_end = ends
    if messages < m_end:
        raise CorruptCheckpoint(
            f"invalid {what}: {messages} of {m_end} messages stored (a message record is missing)"
        )
    if turns < t_end:
        raise CorruptCheckpoint(
            f"invalid {what}: {turns} of {t_end} completed turns stored"
            " (a completed turn record is missing)"
        )


def check_run_id(head: Mapping[str, Any], run_id: str, what: str) -> None:
    """Raise ``CorruptCheckpoint`` when a stored head is not the head of ``run_id`` (a
    record stored in the wrong place would otherwise be served as this run)."""
    found = head.get("run_id")
    if found != run_id:
        raise CorruptCheckpoint(f"invalid {what}: its head is the head of run {found!r}")


def _spans(cp: Checkpoint, prior: dict[str, Any] | None) -> tuple[int, int, int, int]:
    """(m0, first new message, t0, first new turn) for this commit."""
    run = cp.run
    if prior is None:
        return 0, 0, 0, 0
    m_end, t_end = log_ends(prior)
    pm0, pmn = prior["$m"]
    pt0, ptn = prior["$t"]
    n_msg, n_turn = len(run.messages), len(run.turns)
    if _outdated(prior):  # stored at an older version: write every part again
        return m_end, m_end, t_end, t_end
    if cp.transcript_replaced or cp.new_messages < 0 or pmn + cp.new_messages != n_msg:
        m0 = m_end
    else:
        m0 = pm0
    t0 = t_end if cp.new_turns < 0 or ptn + cp.new_turns != n_turn else pt0
    return m0, m_end, t0, t_end


def _outdated(head: Mapping[str, Any]) -> bool:
    """Whether a stored head (and what it references) is at an older schema version; a
    head a newer release wrote raises ``CorruptCheckpoint`` naming both versions, so no
    commit of this release goes on top of it."""
    version = head.get("schema_version")
    if type(version) is int and version > convert.SCHEMA_VERSION:
        convert.check_version(version, what=f"run {head.get('run_id')!r}")  # raises
    return version != convert.SCHEMA_VERSION


def encode_commit(
    cp: Checkpoint, prior: dict[str, Any] | None, known: frozenset[str] | None = None
) -> EncodedCommit:
    """Encode ``cp`` on top of ``prior``, the stored head at ``cp.expected_revision``.

    ``known`` are the blobs ``prior`` references (found by walking it when not given).
    """
    run = cp.run
    m0, m_end, t0, t_end = _spans(cp, prior)
    if known is None:
        known = blob_refs(prior) if prior else frozenset()
    ctx = Storing(known, run.messages, m0)
    with writing(ctx) as conv:
        head = conv.unstructure_head(run)
        refs = frozenset(ctx.blobs.refs)
        message, turn = conv.get_unstructure_hook(Message), conv.get_unstructure_hook(Turn)
        messages = tuple([dump_bytes(message(m)) for m in run.messages[m_end - m0 :]])
        turns = tuple([dump_bytes(turn(t)) for t in run.turns[t_end - t0 :]])
    head["$m"] = [m0, len(run.messages)]
    head["$t"] = [t0, len(run.turns)]
    entry: dict[str, Any]
    if prior is None or run.revision % SNAPSHOT_EVERY == 0 or _outdated(prior):
        entry = {"f": head}
    else:
        entry = {"p": diff(prior, head)}
    entry["r"] = run.revision
    if cp.events:
        _add_events(entry, cp.events, head)
    return EncodedCommit(head, entry, m_end, messages, t_end, turns, ctx.blobs.blobs, refs)


def _add_events(entry: dict[str, Any], events: tuple[Event, ...], head: dict[str, Any]) -> None:
    """Put the events in ``entry``; its patch always carries ``updated_at`` (the events'
    usual time), and ``event_count`` only when it is not the seq after the last event."""
    first = events[0].seq
    entry["q"] = first
    at = head["updated_at"]
    entry["E"] = encode_events(events, head["run_id"], head["revision"], first, at)
    patch = entry.get("p")
    if patch is not None:
        patch["updated_at"] = at
        if head.get("event_count", 0) == first + len(events):
            patch.pop("event_count", None)
        else:
            patch["event_count"] = head.get("event_count", 0)


def entry_head(head: dict[str, Any] | None, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The head a commit log entry describes, given the head before it (None at a snapshot)."""
    if "f" in entry:
        return dict(entry["f"])
    if head is None:
        raise ValueError("a patch without the head before it")
    patch = entry["p"]
    doc = apply_patch(head, patch)
    if "E" in entry and "event_count" not in patch:
        doc["event_count"] = entry["q"] + len(entry["E"])
    return doc


def check_log(entries: Iterable[tuple[int, Any]], first: int, last: int | None, what: str) -> None:
    """Check that ``entries`` are the commit log from revision ``first`` (through ``last``
    when given) with none missing: each entry names the revision it was written for.

    Raises ``CorruptCheckpoint`` naming the first revision whose entry is missing.
    """
    expected = first
    for revision, entry in entries:
        if not isinstance(entry, dict):
            raise CorruptCheckpoint(f"invalid {what}: commit log entry of revision {revision}")
        if revision != expected or entry.get("r") != expected:
            break
        expected += 1
    else:
        if last is None or expected > last:
            return
    raise CorruptCheckpoint(
        f"invalid {what}: the commit log entry of revision {expected} is missing"
    )


def upgraded_head(head: Mapping[str, Any], version: int, what: str) -> Mapping[str, Any]:
    """A head stored at ``version`` as a head of the current version (itself when current)."""
    if version >= convert.SCHEMA_VERSION:
        return head
    doc = convert.migrate("head", dict(head), version, what=what)
    if not isinstance(doc, dict):
        raise CorruptCheckpoint(f"invalid {what}: a migration did not give an object")
    if "current_turn" in doc:
        doc["current_turn"] = convert.migrate("turn", doc["current_turn"], version, what=what)
    return doc


def decode_run(
    head: Mapping[str, Any],
    message_docs: Sequence[Any],
    turn_docs: Sequence[Any],
    blobs: Mapping[str, bytes | str],
    *,
    what: str = "run",
) -> Run:
    """The run a head describes, given its logs (from position 0) and blobs.

    Message and turn documents may be given as stored JSON (bytes), parsed one at a
    time as they are decoded (so a load never holds every parsed document at once);
    messages and completed turns are decoded, and parsed, only when read
    (``LazyTuple``). A blob that one of them references and ``blobs`` lacks raises
    ``CorruptCheckpoint`` naming the record and the blob here, not when the record is
    first read (``missing_blob`` finds it without decoding). Checksums are the stores'
    to check, on load.
    """
    return _Decoder(message_docs, turn_docs, blobs).run(head, what)


def iter_history(
    entries: Iterable[tuple[int, Any]],
    message_docs: Sequence[Any],
    turn_docs: Sequence[Any],
    blobs: Mapping[str, bytes | str],
    run_id: str,
    *,
    last: int | None = None,
    what: str = "run history",
) -> Iterator[tuple[Run, list[Event]]]:
    """Every revision of a run with the events of its commit, from its whole commit log
    (through revision ``last``, the head's, when given).

    Revisions share their message and turn objects, as they did when committed.
    """
    entries = list(entries)
    check_log(entries, 0, last, what)
    decoder = _Decoder(message_docs, turn_docs, blobs)
    head: dict[str, Any] | None = None
    for revision, entry in entries:
        try:
            head = entry_head(head, entry)
        except _DECODE_ERRORS as exc:
            raise corrupt(what, exc) from exc
        head["revision"] = revision
        yield decoder.run(head, what), decode_events([(revision, entry)], run_id, what=what)


class _Decoder:
    """Decodes heads against one run's logs; messages and turns are decoded once, when
    first needed.

    A head at an older schema version, and the messages and turns it references
    (stored at its version: the commit after a migration writes them again), go
    through the registered migrations first.
    """

    def __init__(
        self, message_docs: Sequence[Any], turn_docs: Sequence[Any], blobs: Mapping[str, Any]
    ) -> None:
        self.message_docs = message_docs
        self.message_count = len(message_docs)
        self.turn_docs = turn_docs
        self.turns: dict[int, Deferred[Turn]] = {}
        self.ctx = Loading(blobs, self.message_at, self.message_range)
        self._log: list[Message | Deferred[Message] | None] = [None] * self.message_count
        self._filled = 0  # every position below it holds a message or a deferred one
        """The message log as decoded so far: every transcript and request of the run
        is a view of this one list (``LazyTuple.view``), as it was when committed."""
        self.version = convert.SCHEMA_VERSION
        self.what = "run"
        self._messages_checked = 0
        """Messages ``[0, n)`` are known to reference only blobs the run holds."""
        self._turns_checked: set[int] = set()
        """Completed turns known to reference only blobs the run holds."""

    def message_at(self, pos: int) -> Message:
        if not 0 <= pos < self.message_count:
            raise ValueError(f"bad message position {pos}")
        found = self._log[pos]
        if type(found) is Message:
            return found
        if found is None:
            message = self._message(pos, self.version, self.what)
        else:
            blobs = self.ctx.blobs
            outer = blobs.missing  # what the record being decoded found missing so far
            message = found.get()  # type: ignore[union-attr]
            if blobs.missing is None:
                blobs.missing = outer
        self._log[pos] = message
        return message

    def message_range(self, start: int, count: int) -> LazyTuple[Message]:
        """Messages ``[start, start + count)`` of the log, each decoded when first read
        (at the schema version and under the name of the record that references them)."""
        if start < 0 or count < 0 or start + count > self.message_count:
            raise ValueError(f"bad message range {start}+{count}")
        log, version, what = self._log, self.version, self.what
        end = start + count
        # transcripts are prefixes of the log: a range within what is filled costs nothing
        # (a run of N turns would otherwise walk N ranges of up to N positions)
        begin = max(start, self._filled) if start <= self._filled else start
        for pos in range(begin, end):
            if log[pos] is None:
                log[pos] = Deferred(partial(self._first_read, pos, version, what))
        if start <= self._filled < end:
            self._filled = end
        return LazyTuple.view(log, start, end)

    def _first_read(self, pos: int, version: int, what: str) -> Message:
        """A message read for the first time through a transcript (not from within the
        decoding of another record: a blob found missing is its own)."""
        self.ctx.blobs.missing = None
        return self._message(pos, version, what)

    def _message(self, pos: int, version: int, what: str) -> Message:
        doc = self.message_docs[pos]
        if isinstance(doc, bytes | str):  # stored JSON, parsed only now
            doc = load_json(doc, f"message of {what}")
        if version < convert.SCHEMA_VERSION:
            doc = convert.migrate("message", doc, version, what=what)
        return self._structure(doc, Message, f"message {pos} of {what}")

    def turn_at(self, pos: int, what: str) -> Deferred[Turn]:
        """The completed turn at ``pos`` of the turn log, decoded when first read."""
        found = self.turns.get(pos)
        if found is None:
            make = partial(self._turn, self.turn_docs[pos], self.version, what)
            found = self.turns[pos] = Deferred(make)
        return found

    def _turn(self, doc: Any, version: int, what: str) -> Turn:
        what = f"completed turn of {what}"
        if isinstance(doc, bytes | str):  # stored JSON, parsed only now
            doc = load_json(doc, what)
        self.version, self.what = version, what
        self.ctx.blobs.missing = None
        if version < convert.SCHEMA_VERSION:
            doc = convert.migrate("turn", doc, version, what=what)
        return self._structure(doc, Turn, what)

    def _structure(self, doc: Any, cls: type[_R], what: str) -> _R:
        """``doc`` as a record of the run; a blob it references that the run does not
        hold (a lost blob record) raises ``CorruptCheckpoint`` naming that blob.

        ``missing`` is cleared where a decode starts (``run``, ``_turn``), not here: a
        message decoded within a record being decoded must not clear what an earlier
        field of that record found missing (cattrs goes on to the next field)."""
        blobs = self.ctx.blobs
        try:
            with reading(self.ctx) as conv:
                return conv.load(doc, cls, what)
        except CorruptCheckpoint as exc:
            if blobs.missing is None:
                raise
            raise CorruptCheckpoint(f"invalid {what}: blob {blobs.missing} is missing") from exc

    def run(self, head: Mapping[str, Any], what: str) -> Run:
        if not isinstance(head, Mapping):
            raise CorruptCheckpoint(f"invalid {what}: the head is not an object")
        version = convert.check_version(head.get("schema_version"), what=what)
        self.version, self.what = version, what
        self.ctx.blobs.missing = None
        head = upgraded_head(head, version, what)
        try:
            return self._run(head, what)
        except _DECODE_ERRORS as exc:
            raise corrupt(what, exc) from exc

    def _run(self, head: Mapping[str, Any], what: str) -> Run:
        doc = dict(head)
        m0, mn = doc.pop("$m")
        t0, tn = doc.pop("$t")
        check_parts((m0 + mn, t0 + tn), self.message_count, len(self.turn_docs), what)
        doc["schema_version"] = convert.SCHEMA_VERSION
        run = self._structure(doc, Run, what)
        self._check_blobs(m0 + mn, range(t0, t0 + tn), what)
        turns = LazyTuple[Turn]([self.turn_at(i, what) for i in range(t0, t0 + tn)])
        return attrs.evolve(run, messages=self.message_range(m0, mn), turns=turns)

    def _check_blobs(self, m_end: int, turns: range, what: str) -> None:
        """Raise ``CorruptCheckpoint`` naming the record and the blob when a message of
        the log up to ``m_end`` (a transcript or a completed turn's request may hold
        any of them) or a completed turn in ``turns`` references a blob the run lacks;
        each record is looked at once per decoder."""
        blobs = self.ctx.blobs.stored
        for pos in range(self._messages_checked, m_end):
            record = f"message {pos} of {what}"
            _no_missing_blob(self.message_docs[pos], blobs, record)
            self._messages_checked = pos + 1
        for pos in turns:
            if pos not in self._turns_checked:
                _no_missing_blob(self.turn_docs[pos], blobs, f"completed turn {pos} of {what}")
                self._turns_checked.add(pos)


def _no_missing_blob(doc: Any, blobs: Mapping[str, Any], record: str) -> None:
    missing = missing_blob(doc, blobs, record)
    if missing is not None:
        raise CorruptCheckpoint(f"invalid {record}: blob {missing} is missing")


def _state(value: Any) -> StateId:
    if value not in STATE_IDS:
        raise ValueError(f"unknown state {value!r}")
    return value  # type: ignore[no-any-return]


def _text(value: Any) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _pause_of(doc: Any, what: str) -> PauseInfo | None:
    """A head's pause (stored inline: listings read it without the run's blobs)."""
    if doc is None:
        return None
    with reading(NO_BLOBS) as conv:
        return conv.load(doc, PauseInfo, what)


def head_summary(head: Mapping[str, Any], *, what: str = "run head") -> RunSummary:
    """The listing line of a stored head, without reading its parts."""
    if head.get("schema_version") != convert.SCHEMA_VERSION:
        version = convert.check_version(head.get("schema_version"), what=what)
        head = upgraded_head(head, version, what)
    try:
        turns = head["$t"][1] + (1 if "current_turn" in head else 0)
        return RunSummary(
            _text(head["run_id"]),
            _state(head["state"]),
            _int(head["revision"]),
            _text(head["model"]),
            _int(turns),
            dec_time(head["created_at"]),
            dec_time(head["updated_at"]),
            _pause_of(head.get("pause"), what),
            None if head.get("deadline") is None else dec_time(head["deadline"]),
            _tags(head.get("tags", {})),
        )
    except _DECODE_ERRORS as exc:
        raise corrupt(what, exc) from exc


def _tags(doc: Any) -> dict[str, str]:
    """A head's tags: an object of strings."""
    if type(doc) is not dict or not all(type(v) is str for v in doc.values()):
        raise ValueError(f"tags must be an object of strings, got {doc!r}")
    return doc


def snapshot_of(revision: int) -> int:
    """The revision whose commit log entry holds the full head needed for ``revision``."""
    return revision - revision % SNAPSHOT_EVERY


def replay(
    entries: Sequence[tuple[int, Any]], revision: int, *, what: str = "run history"
) -> dict[str, Any]:
    """The head at ``revision`` from its commit log entries (from its snapshot on, in order).

    A missing entry raises ``CorruptCheckpoint`` naming its revision.
    """
    check_log(entries, snapshot_of(revision), revision, what)
    try:
        doc: dict[str, Any] | None = None
        for _, entry in entries:
            doc = entry_head(doc, entry)
        if doc is None:
            raise ValueError("no commit log entries")
        doc["revision"] = revision
        return doc
    except _DECODE_ERRORS as exc:
        raise corrupt(what, exc) from exc
