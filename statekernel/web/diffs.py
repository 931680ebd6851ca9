"""What changed from one revision of a run to the next, as a revision page shows it.

The two runs are compared as records, field by field, never as the whole text of
either: a list (the transcript, the completed turns, a turn's tool calls) by the
items it keeps at its start and at its end, so a commit that appended two messages
to a transcript of thousands costs those two; a record changed in place is followed
down to the values that differ. Completed turns are only ever appended (the kernel
adds one as it closes it, the stores keep them in an append-only log): when the
later revision has at least the turns of the earlier one and the last of those is
unchanged, the ones before it are not read. A request's messages are the transcript
as it was sent: they are shown as the part of the transcript they are
(``"messages[0:40] of the run"``), not again in full.

Each change is a hunk, ``@@ path`` (``added``, ``removed``) followed by the value
before (``-``) and after (``+``) as indented JSON. The lines are bounded
(``MAX_LINES``, ``MAX_CHARS``, ``LINE_CHARS`` for one line): what is left out is
counted in a last line, ``… N more lines``.

The comparison is CPU work that grows with what changed (and with the transcript,
whose messages are compared one by one): ``revision_change`` does it in a worker
thread, so the view goes on serving its other pages and streams meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from statekernel import Message, ModelRequest, Run, Turn, to_plain
from statekernel._front.reach import LazyTuple

__all__ = [
    "COUNT_LIMIT",
    "LINE_CHARS",
    "MAX_CHARS",
    "MAX_LINES",
    "revision_change",
    "revision_diff",
]

MAX_LINES = 400
"""The most lines of a change a revision page shows."""

MAX_CHARS = 100_000
"""The most characters of a change a revision page shows (all its lines together)."""

LINE_CHARS = 2_000
"""The most characters of one line (a long value is cut, saying how much is left)."""

COUNT_LIMIT = 100_000
"""Lines past the shown ones are counted up to this many (then: "more than")."""

_NOT_SHOWN = frozenset({"revision", "updated_at", "event_count"})
"""Fields of a run every commit changes by itself."""


class _Full(Exception):
    """The lines past the bound reached ``COUNT_LIMIT``: stop counting."""


class _Lines:
    """The lines of a change: kept up to the bounds, then only counted."""

    def __init__(self, max_lines: int, max_chars: int) -> None:
        self.max_lines = max_lines
        self.room = max_chars
        self.kept: list[str] = []
        self.more = 0

    def add(self, line: str) -> None:
        if self.more:
            self.more += 1
            if self.more > COUNT_LIMIT:
                raise _Full
            return
        if len(line) > LINE_CHARS:
            line = f"{line[:LINE_CHARS]}… ({len(line) - LINE_CHARS} more characters)"
        if len(self.kept) >= self.max_lines or len(line) > self.room:
            self.more = 1
            return
        self.kept.append(line)
        self.room -= len(line)

    def hunk(self, path: str, what: str = "") -> None:
        self.add(f"@@ {path}{' ' + what if what else ''}")

    def value(self, sign: str, value: Any, run: Run | None) -> None:
        """``value`` as indented JSON, each line after ``sign`` (its requests' messages
        as the part of ``run``'s transcript they are)."""
        text = json.dumps(_plain(value, run), ensure_ascii=False, indent=1, sort_keys=True,
                          default=_json_default)  # fmt: skip
        for line in text.split("\n"):
            self.add(sign + line)


def revision_diff(
    before: Run | None,
    after: Run,
    *,
    max_lines: int = MAX_LINES,
    max_chars: int = MAX_CHARS,
) -> list[str]:
    """What changed from ``before`` (None: the run did not exist) to ``after``: a
    header (``--- revision N``, ``+++ revision M``) then a hunk per changed value (the
    revision, its time and the event count, which every commit changes, left out), at
    most ``max_lines`` lines and ``max_chars`` characters of them, then
    ``… N more lines`` when more are left out.

    Runs in the calling thread and may take a while on a long run (see
    ``revision_change``).
    """
    out = _Lines(max_lines, max_chars)
    out.add(f"--- revision {before.revision}" if before is not None else "--- nothing")
    out.add(f"+++ revision {after.revision}")
    try:
        if before is None:
            out.hunk("run", "created")
            out.value("+", after, after)
        else:
            _Compare(out, before, after).record("", before, after)
    except _Full:
        return [*out.kept, f"… more than {COUNT_LIMIT} more lines"]
    if len(out.kept) == 2 and not out.more:
        out.add(" (nothing changed but the revision, its time and its events)")
    if out.more:
        return [*out.kept, f"… {out.more} more line{'s' if out.more > 1 else ''}"]
    return out.kept


async def revision_change(before: Run | None, after: Run) -> list[str]:
    """``revision_diff(before, after)`` computed in a worker thread: the event loop
    serves other requests meanwhile. Nothing else may read ``before`` or ``after``
    until it returns (a run loaded from a store decodes its records on first read).

    Raises:
        CorruptCheckpoint: a stored record of either run cannot be read.
    """
    work = functools.partial(revision_diff, before, after)
    return await asyncio.to_thread(work)


@attrs.frozen
class _Compare:
    """The walk over two revisions of a run, writing to ``out``."""

    out: _Lines
    before: Run
    after: Run

    def record(self, path: str, old: Any, new: Any) -> None:
        """The changes from ``old`` to ``new`` at ``path``."""
        if old is new:
            return
        kind = type(old)
        if kind is type(new) and attrs.has(kind):
            for field in attrs.fields(kind):
                if kind is Run and field.name in _NOT_SHOWN:
                    continue
                name = field.name
                where = f"{path}.{name}" if path else name
                self.record(where, getattr(old, name), getattr(new, name))
        elif kind is type(new) is dict:
            self._mapping(path, old, new)
        elif _listed(old) and _listed(new):
            if path == "turns":
                self._turns(old, new)
            else:
                self.items(path, old, new, _same)
        elif not _same(old, new):
            self.out.hunk(path)
            self.out.value("-", old, self.before)
            self.out.value("+", new, self.after)

    def _mapping(self, path: str, old: Mapping[Any, Any], new: Mapping[Any, Any]) -> None:
        for key, value in old.items():
            where = _key_path(path, key)
            if key in new:
                self.record(where, value, new[key])
            else:
                self.out.hunk(where, "removed")
                self.out.value("-", value, self.before)
        for key, value in new.items():
            if key not in old:
                self.out.hunk(_key_path(path, key), "added")
                self.out.value("+", value, self.after)

    def _turns(self, old: Sequence[Turn], new: Sequence[Turn]) -> None:
        """The completed turns: appended to only, so the earlier revision's are taken
        as kept when the last of them is (without reading the others)."""
        n = len(old)
        if 0 < n <= len(new) and _same_turn(old[n - 1], new[n - 1]):
            self.items("turns", old, new, _same_turn, kept=n)
        else:
            self.items("turns", old, new, _same_turn)

    def items(
        self,
        path: str,
        old: Sequence[Any],
        new: Sequence[Any],
        same: Callable[[Any, Any], bool],
        kept: int | None = None,
    ) -> None:
        """The changes of a list: the items it keeps at its start (``kept`` when known)
        and at its end are passed over; the others are compared pairwise when as many
        were taken out as put in, else shown as removed and added."""
        n_old, n_new = len(old), len(new)
        start = kept if kept is not None else _common(old, new, same, range(min(n_old, n_new)))
        room = min(n_old, n_new) - start
        end = _common(old, new, same, (-1 - i for i in range(room)))
        gone = range(start, n_old - end)
        came = range(start, n_new - end)
        if len(gone) == len(came):
            for i in gone:
                self.record(f"{path}[{i}]", old[i], new[i])
            return
        for i in gone:
            self.out.hunk(f"{path}[{i}]", "removed")
            self.out.value("-", old[i], self.before)
        for i in came:
            self.out.hunk(f"{path}[{i}]", "added")
            self.out.value("+", new[i], self.after)


def _common(
    old: Sequence[Any], new: Sequence[Any], same: Callable[[Any, Any], bool], at: Any
) -> int:
    """How many of the positions ``at`` (in order) hold the same item in both lists
    before the first that does not."""
    count = 0
    for i in at:
        if not same(old[i], new[i]):
            break
        count += 1
    return count


def _listed(value: Any) -> bool:
    return isinstance(value, list | tuple | LazyTuple)


def _same(a: Any, b: Any) -> bool:
    """Equal values of one type (``1``, ``1.0`` and ``True`` differ)."""
    return a is b or (type(a) is type(b) and bool(a == b))


def _same_turn(a: Turn, b: Turn) -> bool:
    """Equal completed turns, their requests' messages compared by their number and
    their last one (comparing them all would cost the transcript for every turn)."""
    if a is b:
        return True
    for field in attrs.fields(Turn):
        if field.name != "request" and not _same(getattr(a, field.name), getattr(b, field.name)):
            return False
    x, y = a.request, b.request
    for field in attrs.fields(ModelRequest):
        if field.name != "messages" and not _same(getattr(x, field.name), getattr(y, field.name)):
            return False
    sent, also = x.messages, y.messages
    return len(sent) == len(also) and (not sent or _same(sent[-1], also[-1]))


def _key_path(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False, default=str)}]"


def _plain(value: Any, run: Run | None) -> Any:
    """``value`` as plain JSON data (``to_plain``), with the messages of each request in
    it that begin as ``run``'s transcript does shown as that part of the transcript."""
    if isinstance(value, ModelRequest):
        doc = {f.name: to_plain(getattr(value, f.name)) for f in attrs.fields(ModelRequest)
               if f.name != "messages"}  # fmt: skip
        doc["messages"] = _sent(value.messages, run)
        return doc
    if isinstance(value, Run | Turn):
        return {f.name: _plain(getattr(value, f.name), run) for f in attrs.fields(type(value))}
    if _listed(value):
        return [_plain(item, run) for item in value]
    return to_plain(value)


def _sent(messages: Sequence[Message], run: Run | None) -> Any:
    """A request's messages: the part of ``run``'s transcript they begin with (named),
    then the others."""
    transcript = run.messages if run is not None else LazyTuple[Message]()
    shared = _transcript_part(messages, transcript)
    if shared == 0:
        return [to_plain(m) for m in messages]
    named = f"messages[0:{shared}] of the run"
    rest = [to_plain(m) for m in messages[shared:]]
    return [named, *rest] if rest else named


def _json_default(value: Any) -> Any:
    """Times as ISO 8601 (as the records write them), anything else as its text."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _transcript_part(messages: Sequence[Message], transcript: LazyTuple[Message]) -> int:
    """How many of ``messages`` begin ``transcript``: those that are views of its buffer
    by construction, then the next ones compared one by one."""
    n = min(len(messages), len(transcript))
    shared = messages.shares_prefix(transcript) if isinstance(messages, LazyTuple) else 0
    shared = min(shared, n)
    return shared + _common(messages, transcript, _same, range(shared, n))
