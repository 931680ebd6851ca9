"""Pages of a run's long parts: its page shows the latest ``MESSAGES_SHOWN`` messages of
the transcript, the latest ``EVENTS_SHOWN`` events and the latest ``TURNS_SHOWN`` turns
of the timeline, with links to the ones before.

An earlier page is named by where it ends: ``?transcript_before=N`` shows the messages
before the one at position ``N``, ``?events_before=S`` the events before the one
numbered ``S`` (its ``seq``). The latest page has no parameter, so it follows the run
as it grows (the stream adds its events, the live part its messages).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlencode

import attrs

from statekernel import Event, Run
from statekernel.web.views import Said, transcript

__all__ = [
    "EVENTS_SHOWN",
    "MESSAGES_SHOWN",
    "PAGE_PARAMS",
    "TURNS_SHOWN",
    "Window",
    "events_window",
    "messages_window",
    "page_link",
    "transcript_page",
]

MESSAGES_SHOWN = 200
"""Messages of the transcript a run's page shows at once."""

EVENTS_SHOWN = 200
"""Events a run's page shows at once."""

TURNS_SHOWN = 200
"""Turns the timeline of a run's page shows (the latest)."""

PAGE_PARAMS = ("revision", "transcript_before", "events_before")
"""The query parameters a link to another page of a run's page keeps."""


@attrs.frozen
class Window:
    """Entries ``[start, stop)`` of ``total`` shown, and the links to the pages around
    them (``""``: none): ``earlier`` and ``later`` ones, and the ``latest``."""

    start: int
    stop: int
    total: int
    earlier: str = ""
    later: str = ""
    latest: str = ""

    @property
    def at_latest(self) -> bool:
        """True when no entry after the shown ones is left out."""
        return self.stop >= self.total

    @property
    def paged(self) -> bool:
        """True when some entries are not shown."""
        return self.start > 0 or self.stop < self.total


def page_link(base: str, params: Mapping[str, int | str | None], anchor: str = "") -> str:
    """``base`` with the query ``params`` (those that are None left out) and ``anchor``."""
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return base + (f"?{query}" if query else "") + (f"#{anchor}" if anchor else "")


def _window(
    total: int,
    stop: int,
    size: int,
    link: Mapping[str, int | str | None],
    name: str,
    base: str,
    anchor: str,
    at: Callable[[int], int] | None = None,
) -> Window:
    """The window of ``size`` entries ending at ``stop`` (or the first ``size``, when
    fewer come before ``stop``); ``at(i)`` is the parameter ``name`` of the page ending
    before entry ``i`` (``i`` itself without ``at``)."""
    stop = max(stop, min(size, total))
    start = max(0, stop - size)

    def to(end: int | None) -> str:
        value = None if end is None else (end if at is None else at(end))
        return page_link(base, {**link, name: value}, anchor)

    earlier = to(start) if start > 0 else ""
    later = to(stop + size if stop + size < total else None) if stop < total else ""
    latest = to(None) if stop < total else ""
    return Window(start, stop, total, earlier, later, latest)


def messages_window(
    total: int,
    before: int | None,
    link: Mapping[str, int | str | None],
    base: str,
    size: int = MESSAGES_SHOWN,
) -> Window:
    """The page of a transcript of ``total`` messages ending before the message at
    ``before`` (None: the latest page); ``link`` holds the query of the page it is on
    (at ``base``), which its links keep."""
    stop = total if before is None else min(before, total)
    return _window(total, stop, size, link, "transcript_before", base, "transcript")


def events_window(
    events: Sequence[Event],
    before: int | None,
    link: Mapping[str, int | str | None],
    base: str,
    size: int = EVENTS_SHOWN,
) -> Window:
    """The page of ``events`` (in ``seq`` order) ending before the event numbered
    ``before`` (None: the latest page); ``link`` and ``base`` as ``messages_window``."""
    total = len(events)
    stop = total if before is None else bisect.bisect_left(events, before, key=_seq)

    def seq_at(index: int) -> int:
        return events[index].seq

    return _window(total, stop, size, link, "events_before", base, "events-page", seq_at)


def _seq(event: Event) -> int:
    return event.seq


def transcript_page(run: Run, window: Window) -> list[Said]:
    """The conversation of the messages ``window`` shows (with the calls of the turn in
    progress when it is the latest page), as ``transcript`` gives it."""
    shown = attrs.evolve(
        run,
        messages=run.messages[window.start : window.stop],
        current_turn=run.current_turn if window.at_latest else None,
    )
    return transcript(shown)
