"""Reasoning sent inside the answer's text: a ``<think>...</think>`` section (or
``<thought>...</thought>``) at the start of the content, as open-weight reasoning
models write it. ``ThinkSplitter`` takes the content as it streams, in pieces cut
anywhere (inside a tag too), and gives reasoning and text apart.

The content is the model's: each piece costs time in proportion to its own length,
never to what came before it (whitespace before the section is set aside piece by
piece, and only the end of the text that could still start a tag is held back).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

from statekernel._storage.provider import ReasoningDelta, StreamPart, TextDelta

__all__ = ["ThinkSplitter", "split_think"]

_TAGS = {"<think>": "</think>", "<thought>": "</thought>"}


class ThinkSplitter:
    """Splits streamed content into reasoning (the leading tagged section) and text.

    Only a section that opens the content (after whitespace) counts: a tag later in the
    text is text. A piece that could still be the start of a tag is held back until
    the next piece decides it; ``end`` gives back whatever is held. ``examined`` counts
    the characters of held text each piece made the splitter look at: it grows with the
    length of the content, whatever the pieces.
    """

    def __init__(self) -> None:
        self.examined = 0
        self._space: list[str] = []
        """Whitespace before anything else: text if no section follows."""
        self._held = ""
        self._mode = "start"  # start -> reasoning -> text, or start -> text
        self._close = ""
        self._skip = False
        """Newlines after a tag are dropped, however the stream cut them."""

    def feed(self, piece: str) -> Iterator[StreamPart]:
        """The parts ``piece`` completes."""
        if self._mode == "start" and not self._held:
            lead = piece.lstrip()
            self._space.append(piece[: len(piece) - len(lead)])
            piece = lead
        self._held += piece
        while self._held:
            self.examined += len(self._held)
            if self._skip:
                self._held = self._held.lstrip("\n")
                if not self._held:
                    return
                self._skip = False
            if self._mode == "text":
                yield TextDelta(self._held)
                self._held = ""
                return
            moved = self._opening() if self._mode == "start" else (yield from self._reasoning())
            if not moved:
                return

    def end(self) -> Iterator[StreamPart]:
        """What is held back when the content ends (an unclosed section is reasoning)."""
        held, self._held = self._held, ""
        if self._mode == "start":
            held = "".join(self._space) + held
        self._space.clear()
        if held and self._mode == "reasoning":
            yield ReasoningDelta(held)
        elif held:
            yield TextDelta(held)

    def _opening(self) -> bool:
        """Decide how the content starts; False while the held text cannot tell yet (the
        held text starts after the whitespace set aside)."""
        lead = self._held
        for opening, closing in _TAGS.items():
            if lead.startswith(opening):
                self._mode, self._close = "reasoning", closing
                self._held, self._skip = lead[len(opening) :], True
                self._space.clear()
                return True
            if opening.startswith(lead):
                return False  # maybe a tag, cut short
        self._mode = "text"
        self._held = "".join(self._space) + lead
        self._space.clear()
        return True

    def _reasoning(self) -> Generator[StreamPart, None, bool]:
        """Reasoning up to the closing tag; returns False while more is needed."""
        at = self._held.find(self._close)
        if at >= 0:
            if at:
                yield ReasoningDelta(self._held[:at])
            self._mode = "text"
            self._held, self._skip = self._held[at + len(self._close) :], True
            return True
        keep = _partial_suffix(self._held, self._close)
        if len(self._held) > keep:
            yield ReasoningDelta(self._held[: len(self._held) - keep])
            self._held = self._held[len(self._held) - keep :]
        return False


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def split_think(content: str) -> tuple[str, str]:
    """(reasoning, text) of a whole content string."""
    splitter = ThinkSplitter()
    parts = [*splitter.feed(content), *splitter.end()]
    reasoning = "".join(p.text for p in parts if isinstance(p, ReasoningDelta))
    text = "".join(p.text for p in parts if isinstance(p, TextDelta))
    return reasoning, text
