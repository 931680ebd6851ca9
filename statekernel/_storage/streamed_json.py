"""A JSON object as it streams in pieces (a tool call's arguments): whether the pieces so
far already form a whole object, found in time linear in the text however it is cut.

Re-parsing the whole text at each piece that ends in ``}`` would be quadratic in what
the model writes; instead each piece is scanned once, following strings and braces to
where the top-level object closes, and the text is parsed once, there.
"""

from __future__ import annotations

import json
import re

__all__ = ["StreamedObject"]

_IN_STRING = re.compile(r'["\\]')
_OUTSIDE = re.compile(r'["{}]')
_BLANK = " \t\n\r"
"""JSON's whitespace."""


class StreamedObject:
    """The pieces of one JSON text, and whether they form a whole JSON object yet.

    ``examined`` counts the characters scanned: at most the length of the text.
    """

    def __init__(self) -> None:
        self.examined = 0
        self._pieces: list[str] = []
        self._joined: str | None = ""
        self._state = "lead"  # lead -> body -> tail (closed), or never
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._length = 0
        self._end = 0
        """Where the top-level object closed (its length), once in ``tail``."""
        self._parsed: bool | None = None

    @property
    def text(self) -> str:
        """The pieces so far, joined."""
        if self._joined is None:
            self._joined = "".join(self._pieces)
            self._pieces = [self._joined]
        return self._joined

    def add(self, piece: str) -> None:
        """Take the next piece."""
        self._pieces.append(piece)
        self._joined = None
        start, self._length = self._length, self._length + len(piece)
        if self._state != "never":
            self._scan(piece, start)

    @property
    def whole(self) -> bool:
        """True when the text is one JSON object (and JSON whitespace after it)."""
        if self._state != "tail":
            return False
        if self._parsed is None:
            try:
                self._parsed = isinstance(json.loads(self.text[: self._end]), dict)
            except ValueError:
                self._parsed = False
        return self._parsed

    def _scan(self, piece: str, start: int) -> None:
        at = 0
        if self._state == "lead":
            rest = piece.lstrip(_BLANK)
            self.examined += len(piece) - len(rest) + bool(rest)
            if not rest:
                return
            if rest[0] != "{":
                self._state = "never"
                return
            self._state, self._depth = "body", 1
            at = len(piece) - len(rest) + 1
        if self._state == "body":
            at = self._body(piece, at)
            if self._state != "tail":
                return
            self._end = start + at
        tail = piece[at:]
        self.examined += len(tail)
        if tail.strip(_BLANK):
            self._state = "never"

    def _body(self, piece: str, at: int) -> int:
        """Follow ``piece`` from ``at``; where the top-level object closed (else its end)."""
        while at < len(piece):
            if self._escaped:
                self._escaped, at = False, at + 1
                self.examined += 1
                continue
            found = (_IN_STRING if self._in_string else _OUTSIDE).search(piece, at)
            if found is None:
                self.examined += len(piece) - at
                return len(piece)
            self.examined += found.end() - at
            at, char = found.end(), found.group()
            if char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = not self._in_string
            elif char == "{":
                self._depth += 1
            else:
                self._depth -= 1
                if not self._depth:
                    self._state = "tail"
                    return at
        return at
