"""The view on a long run: 2,000 turns in a SQLite store, then one revision that rewrites
the whole transcript (a hook redacting every tool result). Its page shows the latest
page of its transcript and events with links to the earlier ones, a revision page
shows what that revision changed (bounded), and while a revision's change is computed
the view goes on serving other pages."""

from __future__ import annotations

import asyncio
import html
import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

import attrs
import httpx
import pytest
from starlette.testclient import TestClient

import statekernel as sk
from statekernel.stores import Checkpoint, open_store
from statekernel.web import create_app, diffs
from statekernel.web.paging import EVENTS_SHOWN, MESSAGES_SHOWN, TURNS_SHOWN

from .clients import LOCAL, local_client
from .serving import served

TURNS = 2000
"""Completed turns of the long run (revision ``r`` of 1..TURNS completed turn ``r - 1``)."""

LAST = TURNS + 1
"""The revision that rewrote the transcript."""

T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def _make_long_run(url: str) -> None:
    """Run ``long``: one commit per turn (a text and a tool call, then its result, with
    a ``turn_started`` and a ``turn_completed`` event), then at revision ``LAST`` every
    tool result of the transcript replaced by ``[redacted]``."""
    store = open_store(url)
    try:
        first = (sk.Message.system("You help."), sk.Message.user("Count the days."))
        run = sk.Run(run_id="long", model="scripted/long", state="calling_model",
                     messages=first, created_at=T0, updated_at=T0)  # fmt: skip
        await store.commit(Checkpoint.between(None, run))
        for i in range(TURNS):
            at = T0 + timedelta(seconds=i + 1)
            call = sk.ToolCall(f"call_{i}", "count", f'{{"day": {i}}}')
            answer = sk.Message.assistant(f"turn {i} text", tool_calls=[call])
            result = sk.Message.tool(call.id, call.name, f"day {i} counted")
            record = sk.ToolCallRecord(call.id, call.name, call.arguments, {"day": i},
                                       f"day {i} counted", attempt=1, started_at=at,
                                       finished_at=at)  # fmt: skip
            request = sk.ModelRequest(run.model, run.messages)
            turn = sk.Turn(i, request, sk.ModelResult(answer, finish_reason="tool_calls"), 1,
                           completed=(record,))  # fmt: skip
            nxt = attrs.evolve(run, revision=run.revision + 1, updated_at=at,
                               messages=run.messages.grow((answer, result)),
                               turns=run.turns.grow((turn,)),
                               event_count=run.event_count + 2)  # fmt: skip
            events = (
                sk.Event("turn_started", "long", nxt.revision, run.event_count, {"index": i}, at),
                sk.Event("turn_completed", "long", nxt.revision, run.event_count + 1,
                         {"index": i}, at),
            )  # fmt: skip
            await store.commit(Checkpoint.appended(run, nxt, events))
            run = nxt
        redacted = list(run.messages)
        for i in range(TURNS):  # the result of turn i follows its answer
            redacted[3 + 2 * i] = sk.Message.tool(f"call_{i}", "count", "[redacted]")
        last = attrs.evolve(run, revision=LAST, state="completed", messages=redacted,
                            updated_at=run.updated_at + timedelta(seconds=1))  # fmt: skip
        await store.commit(Checkpoint.between(run, last))
    finally:
        await store.aclose()


@pytest.fixture(scope="module")
def long_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite store holding the long run."""
    path = tmp_path_factory.mktemp("long") / "runs.db"
    url = f"sqlite:///{path}?synchronous=normal"
    asyncio.run(_make_long_run(url))
    return url


@pytest.fixture(scope="module")
def view(long_url: str) -> Iterator[TestClient]:
    """A test client of the read-only view of the long run's store."""
    with local_client(create_app(long_url)) as client:
        yield client


def _diff_lines(page: str) -> list[str]:
    found = re.search(r'<pre class="diff">(.*?)</pre>', page, re.S)
    assert found is not None, "no diff on the page"
    return [html.unescape(re.sub(r"<[^>]+>", "", line)) for line in found.group(1).split("\n")
            if line]  # fmt: skip


def _link(page: str, kind: str) -> str:
    found = re.search(rf'<a class="{kind}" href="([^"]+)"', page)
    assert found is not None, f"no {kind} link"
    return html.unescape(found.group(1))


def _shown_events(page: str) -> list[int]:
    return [int(n) for n in re.findall(r'<td class="num">#(\d+)</td>', page)]


def test_the_page_shows_the_latest_transcript_and_events_with_links_before(
    view: TestClient,
) -> None:
    page = view.get("/runs/long")
    assert page.status_code == 200
    text = page.text
    assert _shown_events(text) == list(range(2 * TURNS - EVENTS_SHOWN, 2 * TURNS))
    assert '<tbody id="events">' in text  # the latest page takes what the stream sends
    assert f"the latest {EVENTS_SHOWN} of {2 * TURNS} events" in text
    messages = 2 + 2 * TURNS
    assert f"the latest {MESSAGES_SHOWN} of {messages} messages" in text
    first_shown = (messages - MESSAGES_SHOWN - 2) // 2  # the turn of the first message shown
    assert f"turn {TURNS - 1} text" in text
    assert f"turn {first_shown} text" in text
    assert f"turn {first_shown - 1} text" not in text
    assert len(re.findall(r'<div class="turn">', text)) == TURNS_SHOWN

    earlier = view.get(_link(text, "earlier"))  # the transcript's link comes first
    assert earlier.status_code == 200
    assert f"turn {first_shown - 1} text" in earlier.text
    assert f"turn {first_shown - MESSAGES_SHOWN // 2} text" in earlier.text
    assert f"turn {first_shown} text" not in earlier.text
    range_shown = f"messages {messages - 2 * MESSAGES_SHOWN + 1}\u2013{messages - MESSAGES_SHOWN}"
    assert range_shown in earlier.text
    live = re.search(r'data-fragment="([^"]+)"', earlier.text)
    assert live is not None
    assert html.unescape(live.group(1)).endswith(
        f"fragment=1&transcript_before={messages - MESSAGES_SHOWN}"
    )  # the live part keeps to that page

    before = _link(text.split('id="events-page"')[1], "earlier")
    assert before.endswith(f"?events_before={2 * TURNS - EVENTS_SHOWN}#events-page")
    older = view.get(before).text
    shown = list(range(2 * TURNS - 2 * EVENTS_SHOWN, 2 * TURNS - EVENTS_SHOWN))
    assert _shown_events(older) == shown
    assert '<tbody id="events-before">' in older  # not the stream's to add to
    events_part = older.split('id="events-page"')[1]
    assert _link(events_part, "later").endswith("/runs/long#events-page")  # the latest again
    assert f"turn {TURNS - 1} text" in older  # the transcript stays at its latest page


def test_paging_numbers_are_read_strictly(view: TestClient) -> None:
    for bad in ("events_before=x", "transcript_before=-1", "events_before=1e3"):
        answer = view.get(f"/runs/long?{bad}")
        assert answer.status_code == 400
        assert bad.split("=")[0] in answer.text


def test_a_revision_page_shows_only_what_that_revision_changed(view: TestClient) -> None:
    middle = TURNS // 2
    page = view.get(f"/runs/long?revision={middle}")
    assert page.status_code == 200
    lines = _diff_lines(page.text)
    assert lines[:2] == [f"--- revision {middle - 1}", f"+++ revision {middle}"]
    hunks = [line for line in lines if line.startswith("@@")]
    index = 2 * middle  # its two messages are the ones after 2 + 2 * (middle - 1)
    assert hunks == [
        f"@@ messages[{index}] added",
        f"@@ messages[{index + 1}] added",
        f"@@ turns[{middle - 1}] added",
    ]
    assert f'+   "text": "turn {middle - 1} text",' in lines
    assert f'+  "messages": "messages[0:{index}] of the run",' in lines  # not sent again
    assert len(lines) < diffs.MAX_LINES
    assert "more line" not in lines[-1]


def test_the_revision_that_rewrote_the_transcript_shows_a_bounded_change(
    view: TestClient,
) -> None:
    page = view.get(f"/runs/long?revision={LAST}")
    assert page.status_code == 200
    lines = _diff_lines(page.text)
    assert lines[:4] == [
        f"--- revision {LAST - 1}",
        f"+++ revision {LAST}",
        "@@ state",
        '-"calling_model"',
    ]
    assert "@@ messages[3].content[0].content" in lines
    assert '-"day 0 counted"' in lines
    assert '+"[redacted]"' in lines
    more = re.fullmatch(r"… (\d+) more lines", lines[-1])
    assert more is not None, lines[-1]
    shown = len(lines) - 1
    assert shown <= diffs.MAX_LINES
    assert shown + int(more.group(1)) == 2 + 3 + 3 * TURNS  # headers, state, each result
    assert len(page.text) < 2_000_000


def _computing(code: object) -> tuple[int, list[str]] | None:
    """The thread running ``code`` now, with the names of the functions on its stack."""
    for ident, frame in sys._current_frames().items():
        names: list[str] = []
        found = False
        walk: FrameType | None = frame
        while walk is not None:
            names.append(walk.f_code.co_name)
            found = found or walk.f_code is code
            walk = walk.f_back
        if found:
            return ident, names
    return None


def test_other_pages_are_served_while_a_revision_is_compared(long_url: str) -> None:
    """The list page asked for while the change of the rewriting revision is being
    computed is answered before that computation ends."""
    code = diffs.revision_diff.__code__
    headers = {"host": LOCAL.removeprefix("http://")}
    with (
        served(create_app(long_url)) as base,
        ThreadPoolExecutor(1) as pool,
        httpx.Client(base_url=base, headers=headers, timeout=600) as client,
        httpx.Client(base_url=base, headers=headers, timeout=600) as other,
    ):
        assert client.get("/").status_code == 200
        big: Future[httpx.Response] = pool.submit(other.get, f"/runs/long?revision={LAST}")
        while (seen := _computing(code)) is None:  # wait for the comparison to start
            assert not big.done(), "the revision page answered before its diff was seen"
            time.sleep(0.001)
        ident, stack = seen
        assert "run_page" not in stack, "the diff runs on the event loop"
        listed = client.get("/")
        still = _computing(code)
        assert listed.status_code == 200
        assert "long" in listed.text
        assert still is not None, "the list page waited for the diff to end"
        assert still[0] == ident
        answer = big.result()
        assert answer.status_code == 200
        assert '+"[redacted]"' in html.unescape(answer.text)


def _chat(*texts: str, context: dict[str, Any] | None = None) -> sk.Run:
    """A run at revision 0 whose transcript says ``texts``."""
    messages = tuple(sk.Message.user(t) for t in texts)
    return sk.Run(run_id="r", model="m/m", context=context or {}, messages=messages,
                  created_at=T0, updated_at=T0)  # fmt: skip


def test_a_diff_follows_a_change_down_to_the_values_that_differ() -> None:
    before = _chat("a", "b", "c", context={"user": "u1", "gone": 1})
    after = attrs.evolve(_chat("a", "B", "c", context={"user": "u2", "new": [1]}), revision=1)
    hunks = [line for line in diffs.revision_diff(before, after) if line.startswith("@@")]
    assert hunks == [
        "@@ context.user",
        "@@ context.gone removed",
        "@@ context.new added",
        "@@ messages[1].content[0].text",
    ]
    lines = diffs.revision_diff(before, after)
    assert lines[-2:] == ['-"b"', '+"B"']


def test_a_shortened_transcript_shows_what_it_lost_and_gained() -> None:
    before = _chat("keep", *(f"old {i}" for i in range(5)), "last")
    after = attrs.evolve(_chat("keep", "summary", "last"), revision=1)
    hunks = [line for line in diffs.revision_diff(before, after) if line.startswith("@@")]
    assert hunks == [*(f"@@ messages[{i}] removed" for i in range(1, 6)), "@@ messages[1] added"]


def test_a_diff_is_bounded_in_lines_and_characters() -> None:
    before = _chat()
    after = attrs.evolve(_chat(*(f"m{i}" for i in range(100))), revision=1)
    lines = diffs.revision_diff(before, after, max_lines=50)
    assert len(lines) == 51
    assert re.fullmatch(r"… \d+ more lines", lines[-1])
    long = attrs.evolve(_chat("x" * 50_000), revision=1)
    cut = diffs.revision_diff(before, long, max_chars=10_000)
    assert sum(map(len, cut)) < 10_000 + diffs.LINE_CHARS
    assert any("more characters)" in line for line in cut)
    created = diffs.revision_diff(None, before)
    assert created[:3] == ["--- nothing", "+++ revision 0", "@@ run created"]
    same = diffs.revision_diff(before, attrs.evolve(before, revision=1))
    assert same[2] == " (nothing changed but the revision, its time and its events)"
