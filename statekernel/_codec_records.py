"""Stored encoding of each record type (short keys, defaults left out, references).

Messages, content parts, tool call records and usage are arrays; turns, requests,
results and the run head are objects with short keys, so head revisions can be
stored as small patches. References instead of copies:

* a request's messages that are a prefix of the transcript: ``{"$r": [pos, n]}``
  (positions in the run's append-only message log);
* a result message that is in the transcript: ``{"$m": pos}``;
* a tool call record whose id, name and arguments are the result's ``k``-th tool
  call: its first element is ``k``; its input parsed from its arguments: ``{"$a": 1}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from statekernel._codec_base import (
    BlobReader,
    BlobWriter,
    canonical,
    dec_time,
    enc_time,
    load_json,
    same,
)
from statekernel._lazy import LazyTuple
from statekernel._messages import (
    ContentPart,
    ImagePart,
    Message,
    ModelRequest,
    ModelResult,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
)
from statekernel._run import STATE_IDS, FailureInfo, PauseInfo, StateId, ToolCallRecord, Turn

__all__ = ["Reader", "Writer"]

_ROLES: dict[str, str] = {"system": "s", "user": "u", "assistant": "a", "tool": "t"}
_ROLE_OF: dict[str, Role] = {"s": "system", "u": "user", "a": "assistant", "t": "tool"}
_STATES = frozenset(STATE_IDS)
_RECORD_DEFAULTS = (None, None, None, 0, None, None, False)


def _trim(items: list[Any], defaults: Sequence[Any]) -> list[Any]:
    """Drop trailing items equal (strictly) to their defaults."""
    keep = len(items)
    offset = len(items) - len(defaults)
    while keep > offset and keep > 0 and same(items[keep - 1], defaults[keep - 1 - offset]):
        keep -= 1
    return items[:keep]


def state_id(value: Any) -> StateId:
    if value not in _STATES:
        raise ValueError(f"unknown state {value!r}")
    return value  # type: ignore[no-any-return]


_TOOLS_BLOB_MIN = 48
"""Tool specs repeat in every request of a run: stored as a blob unless tiny."""


def _parses_to(arguments: str, value: Any) -> bool:
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return False
    return same(parsed, value)


def _tools_raw(tools: tuple[ToolSpec, ...]) -> list[list[Any]]:
    return [[t.name, t.description, t.parameters] for t in tools]


_TOOLS_TEXT: dict[int, tuple[tuple[ToolSpec, ...], str]] = {}


def _tools_text(tools: tuple[ToolSpec, ...]) -> str:
    """The canonical text of tool specs. The kernel hands the same tuple to every request
    of every run, and each commit of a turn encodes its request again: that tuple's text
    is made once (an identity cache; specs are frozen records)."""
    hit = _TOOLS_TEXT.get(id(tools))
    if hit is not None and hit[0] is tools:
        return hit[1]
    text = canonical(_tools_raw(tools))
    if len(_TOOLS_TEXT) >= 64:
        _TOOLS_TEXT.clear()
    _TOOLS_TEXT[id(tools)] = (tools, text)
    return text


class Writer(BlobWriter):
    """Encodes records; ``transcript`` and ``m0`` place the run's transcript in its log."""

    def __init__(self, known: frozenset[str], transcript: LazyTuple[Message], m0: int) -> None:
        super().__init__(known)
        self.transcript = transcript
        self.m0 = m0

    def message(self, msg: Message) -> list[Any]:
        """A message: ``[role, parts, name?]``."""
        doc = [_ROLES[msg.role], [self.part(p) for p in msg.content]]
        if msg.name is not None:
            doc.append(msg.name)
        return doc

    def part(self, part: ContentPart) -> Any:
        """A content part: text as a plain string, the others as tagged arrays."""
        if isinstance(part, TextPart):
            return self.s(part.text)
        if isinstance(part, ToolCall):
            return ["c", part.id, part.name, self.s(part.arguments)]
        if isinstance(part, ToolResult):
            return _trim(
                ["o", part.tool_call_id, part.name, self.s(part.content), part.is_error], (False,)
            )
        if isinstance(part, ReasoningPart):
            doc = ["r", self.s(part.text), self.opt(part.signature), part.redacted]
            return _trim(doc, (None, False))
        if isinstance(part, ImagePart):
            return _trim(
                ["i", self.opt(part.url), self.opt(part.data), part.media_type], (None, None, None)
            )
        raise TypeError(f"unknown content part {type(part).__name__}")

    @staticmethod
    def usage(usage: Usage) -> list[int]:
        """Token counts, trailing zeros left out."""
        doc = [usage.input_tokens, usage.output_tokens, usage.cache_read_tokens,
               usage.cache_write_tokens, usage.reasoning_tokens]  # fmt: skip
        return _trim(doc, (0, 0, 0, 0, 0))

    def _messages(self, msgs: LazyTuple[Message]) -> Any:
        n, t = len(msgs), self.transcript
        k = t.shares_prefix(msgs)
        while k < n and k < len(t) and (msgs[k] is t[k] or msgs[k] == t[k]):
            k += 1
        if k == n:
            return {"$r": [self.m0, n]}
        inline = [self.message(m) for m in msgs[k:]]
        return {"$r": [self.m0, k], "x": inline} if k else inline

    def tools(self, tools: tuple[ToolSpec, ...]) -> Any:
        """Tool specs, as one blob unless tiny (they repeat in every request)."""
        text = _tools_text(tools)
        if len(text) >= _TOOLS_BLOB_MIN:
            return {"$v": self._put(text)}
        return self.json(_tools_raw(tools))

    def request(self, req: ModelRequest) -> dict[str, Any]:
        """A model request; its messages by reference where they are the transcript."""
        doc: dict[str, Any] = {"M": req.model, "m": self._messages(req.messages)}
        if req.tools:
            doc["T"] = self.tools(req.tools)
        if req.tool_choice is not None:
            doc["tc"] = req.tool_choice
        if req.max_tokens is not None:
            doc["mt"] = req.max_tokens
        if req.temperature is not None:
            doc["t"] = req.temperature
        if req.stop:
            doc["st"] = [self.s(s) for s in req.stop]
        if not (type(req.options) is dict and not req.options):
            doc["o"] = self.json(req.options)
        return doc

    def _message_ref(self, msg: Message, after: int) -> Any:
        t = self.transcript
        for i in (after, len(t) - 1):
            if 0 <= i < len(t) and (t[i] is msg or t[i] == msg):
                return {"$m": self.m0 + i}
        return self.message(msg)

    def result(self, res: ModelResult, after: int) -> dict[str, Any]:
        """A model result; its message by reference when it is in the transcript."""
        doc: dict[str, Any] = {"m": self._message_ref(res.message, after)}
        if res.usage != Usage():
            doc["u"] = self.usage(res.usage)
        if res.finish_reason != "stop":
            doc["f"] = res.finish_reason
        if res.model is not None:
            doc["M"] = res.model
        return doc

    def record(self, rec: ToolCallRecord, calls: dict[str, tuple[int, ToolCall]]) -> list[Any]:
        """A tool call record: ``[k | id, name, arguments, input, output, error, ...]``."""
        hit = calls.get(rec.id)
        head: list[Any]
        if hit is not None and hit[1].name == rec.name and hit[1].arguments == rec.arguments:
            head = [hit[0]]
        else:
            head = [rec.id, rec.name, self.s(rec.arguments)]
        parsed = rec.input is not None and _parses_to(rec.arguments, rec.input)
        tail = [
            {"$a": 1} if parsed else self.json(rec.input),
            self.json(rec.output),
            self.opt(rec.error),
            rec.attempt,
            None if rec.started_at is None else enc_time(rec.started_at),
            None if rec.finished_at is None else enc_time(rec.finished_at),
            rec.resolved,
        ]
        return head + _trim(tail, _RECORD_DEFAULTS)

    def turn(self, turn: Turn) -> dict[str, Any]:
        """A turn: index, request, result, model attempts and its tool call records."""
        doc: dict[str, Any] = {"i": turn.index, "q": self.request(turn.request)}
        calls: dict[str, tuple[int, ToolCall]] = {}
        if turn.result is not None:
            doc["a"] = self.result(turn.result, len(turn.request.messages))
            for k, call in enumerate(turn.result.tool_calls):
                calls.setdefault(call.id, (k, call))
        if turn.model_attempts:
            doc["n"] = turn.model_attempts
        for key, recs in (("p", turn.pending), ("f", turn.in_flight), ("d", turn.completed)):
            if recs:
                doc[key] = [self.record(r, calls) for r in recs]
        return doc

    def pause(self, info: PauseInfo) -> list[Any]:
        """Pause info: ``[reason, resume_to, metadata?]``."""
        doc = [self.s(info.reason), info.resume_to]
        if not (type(info.metadata) is dict and not info.metadata):
            doc.append(self.json(info.metadata))
        return doc

    def failure(self, info: FailureInfo) -> list[Any]:
        """Failure info: ``[error, message, failed_in]``."""
        return [self.s(info.error), self.s(info.message), info.failed_in]


class Reader(BlobReader):
    """Decodes records; ``message_at(pos)`` resolves positions in the message log."""

    def __init__(
        self,
        blobs: Any,
        message_at: Callable[[int], Message] | None = None,
        message_range: Callable[[int, int], LazyTuple[Message]] | None = None,
    ) -> None:
        super().__init__(blobs)
        self._message_at = message_at
        self._message_range = message_range
        self._tools: dict[str, tuple[ToolSpec, ...]] = {}
        self._usages: dict[tuple[int, ...], Usage] = {}

    def at(self, pos: Any) -> Message:
        """The message at ``pos`` of the run's message log."""
        if self._message_at is None or type(pos) is not int or pos < 0:
            raise ValueError(f"bad message reference {pos!r}")
        return self._message_at(pos)

    def message(self, doc: Any) -> Message:
        """A message."""
        name = doc[2] if len(doc) > 2 else None
        if name is not None and type(name) is not str:
            raise TypeError("message name is not a string")
        part = self.part
        return Message(_ROLE_OF[doc[0]], tuple([part(p) for p in doc[1]]), name)

    def part(self, doc: Any) -> ContentPart:
        """A content part."""
        if type(doc) is not list:
            return TextPart(self.s(doc))
        code = doc[0]
        if code == "c":
            return ToolCall(_str(doc[1]), _str(doc[2]), self.s(doc[3]))
        if code == "o":
            error = doc[4] if len(doc) > 4 else False
            return ToolResult(_str(doc[1]), _str(doc[2]), self.s(doc[3]), _bool(error))
        if code == "r":
            signature, redacted = _pad(doc, 2, (None, False))
            return ReasoningPart(self.s(doc[1]), self.opt(signature), _bool(redacted))
        if code == "i":
            url, data, media = _pad(doc, 1, (None, None, None))
            return ImagePart(self.opt(url), self.opt(data), _opt_str(media))
        raise ValueError(f"unknown content part {code!r}")

    def usage(self, doc: Any) -> Usage:
        """Token counts (equal counts share one ``Usage``: it is immutable)."""
        if type(doc) is not list or len(doc) > 5 or any(type(v) is not int for v in doc):
            raise TypeError("usage is not a list of up to five integers")
        key = tuple(doc)
        found = self._usages.get(key)
        if found is None:
            found = self._usages[key] = Usage(*doc)
        return found

    def _messages(self, doc: Any) -> LazyTuple[Message]:
        if type(doc) is list:
            return LazyTuple([self.message(m) for m in doc])
        start, n = doc["$r"]
        if self._message_range is None or type(start) is not int or type(n) is not int:
            raise ValueError(f"bad message reference {doc!r}")
        found = self._message_range(start, n)
        return found + tuple([self.message(m) for m in doc.get("x", ())])

    def tools(self, doc: Any) -> tuple[ToolSpec, ...]:
        """Tool specs; the same stored blob gives the same tuple (requests repeat them)."""
        key = doc.get("$v") if type(doc) is dict and len(doc) == 1 else None
        if type(key) is str:
            found = self._tools.get(key)
            if found is None:
                found = self._tools[key] = self._tool_specs(doc)
            return found
        return self._tool_specs(doc)

    def _tool_specs(self, doc: Any) -> tuple[ToolSpec, ...]:
        return tuple([ToolSpec(_str(n), _str(d), p) for n, d, p in self.json(doc)])

    def request(self, doc: dict[str, Any]) -> ModelRequest:
        """A model request."""
        return ModelRequest(
            model=_str(doc["M"]),
            messages=self._messages(doc["m"]),
            tools=self.tools(doc["T"]) if "T" in doc else (),
            tool_choice=_opt_str(doc.get("tc")),
            max_tokens=doc.get("mt"),
            temperature=doc.get("t"),
            stop=tuple([self.s(s) for s in doc["st"]]) if "st" in doc else (),
            options=self.json(doc["o"]) if "o" in doc else {},
        )

    def result(self, doc: dict[str, Any]) -> ModelResult:
        """A model result."""
        msg = doc["m"]
        message = self.at(msg["$m"]) if type(msg) is dict else self.message(msg)
        usage = self.usage(doc["u"]) if "u" in doc else Usage()
        return ModelResult(message, usage, doc.get("f", "stop"), _opt_str(doc.get("M")))

    def record(self, doc: list[Any], calls: tuple[ToolCall, ...]) -> ToolCallRecord:
        """A tool call record."""
        if type(doc[0]) is int:
            call = calls[doc[0]]
            call_id, name, arguments, start = call.id, call.name, call.arguments, 1
        else:
            call_id, name, arguments, start = _str(doc[0]), _str(doc[1]), self.s(doc[2]), 3
        raw_input, output, error, attempt, started, finished, resolved = _pad(
            doc, start, _RECORD_DEFAULTS
        )
        if type(raw_input) is dict and raw_input.keys() == {"$a"}:
            value = load_json(arguments, "tool call arguments") if arguments.strip() else {}
        else:
            value = self.json(raw_input)
        return ToolCallRecord(
            call_id, name, arguments, value, self.json(output), self.opt(error), _int(attempt),
            None if started is None else dec_time(started),
            None if finished is None else dec_time(finished), resolved is True,
        )  # fmt: skip

    def turn(self, doc: dict[str, Any]) -> Turn:
        """A turn."""
        result = self.result(doc["a"]) if "a" in doc else None
        calls = result.tool_calls if result is not None else ()
        record = self.record
        return Turn(
            _int(doc["i"]),
            self.request(doc["q"]),
            result,
            _int(doc.get("n", 0)),
            tuple([record(r, calls) for r in doc["p"]]) if "p" in doc else (),
            tuple([record(r, calls) for r in doc["f"]]) if "f" in doc else (),
            tuple([record(r, calls) for r in doc["d"]]) if "d" in doc else (),
        )

    def pause(self, doc: list[Any]) -> PauseInfo:
        """Pause info."""
        metadata = self.json(doc[2]) if len(doc) > 2 else {}
        return PauseInfo(self.s(doc[0]), state_id(doc[1]), metadata)

    def failure(self, doc: list[Any]) -> FailureInfo:
        """Failure info."""
        return FailureInfo(self.s(doc[0]), self.s(doc[1]), state_id(doc[2]))


def _pad(doc: list[Any], start: int, defaults: tuple[Any, ...]) -> list[Any]:
    """``doc[start:]`` with left-out trailing defaults put back."""
    rest = doc[start:]
    if len(rest) > len(defaults):
        raise ValueError("too many fields")
    return [*rest, *defaults[len(rest) :]]


def _str(value: Any) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value
