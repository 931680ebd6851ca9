"""Every response of the view (pages, streams, static files, errors) cannot be framed,
loads nothing from elsewhere, is not sniffed and sends referrers to the view only; the
pages hold no inline script or style (the policy would block them); a page shows a
note only when the view issued it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request

import statekernel as sk
from statekernel.web import create_app

from .clients import local_client
from .runs_made import make_runs
from .serving import answer_to_head, served
from .test_actions import post, token
from .web_agent import kernel_options


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store holding the test runs."""
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    return url


def assert_guarded(headers: Mapping[str, str], what: str) -> None:
    """The headers of a response that cannot be framed, sniffed or leak its address."""
    assert headers.get("x-frame-options") == "DENY", what
    assert headers.get("x-content-type-options") == "nosniff", what
    assert headers.get("referrer-policy") == "same-origin", what
    policy = headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in policy, what
    assert "default-src 'self'" in policy or "default-src 'none'" in policy, what


def test_every_response_carries_the_security_headers(url: str) -> None:
    def refuse_deleting(request: Request, action: str, run_id: str | None) -> bool:
        if run_id == "nobody-may-ask":
            return None  # type: ignore[return-value]  # a hook's bug: a 500
        return action != "delete"

    app = create_app(url, agent=kernel_options(), authorize=refuse_deleting)
    with local_client(app, raise_server_exceptions=False) as client:
        answers = {
            path: client.get(path)
            for path in (
                "/",
                "/?fragment=1",
                "/runs/asking",
                "/runs/asking?fragment=1",
                "/runs/asking?revision=1",
                "/runs/asking?revision=x",
                "/runs/nobody",
                "/runs/nobody-may-ask",
                "/runs/asking/diagram.svg",
                "/runs/asking/stream?until=rest",
                "/static/web.css",
                "/static/web.js",
                "/static/htmx.min.js",
                "/static/nothing.js",
                "/no/such/page",
            )
        }
        answers["POST without a token"] = client.post("/runs/chat/send", data={"text": "hi"})
        answers["POST refused"] = post(client, "chat", "delete", confirm="chat")
        answers["POST done"] = post(client, "chat", "send", text="hi")
        answers["GET of a POST"] = client.get("/runs/chat/send")
        answers["another Host"] = client.get("/", headers={"host": "attacker.example"})
        too_large = client.post("/runs/chat/send", content=b"x" * 300_000)
        answers["too large"] = too_large
    statuses = {what: answer.status_code for what, answer in answers.items()}
    assert statuses["/runs/nobody-may-ask"] == 500
    assert statuses["POST done"] == 303
    assert statuses["too large"] == 413
    assert {400, 403, 404, 405}.issubset(statuses.values())
    for what, answer in answers.items():
        assert_guarded(answer.headers, what)
    assert (
        answers["/runs/asking"].headers["content-security-policy"].startswith("default-src 'self'")
    )


def test_a_live_stream_of_a_real_server_carries_them(url: str) -> None:
    with (
        served(create_app(url)) as base,
        httpx.stream("GET", f"{base}/stream", timeout=60) as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert_guarded(stream.headers, "/stream")
        too_large = answer_to_head(
            base, f"POST /runs/chat/send HTTP/1.1\r\nHost: {base[7:]}\r\n"
            "Content-Length: 999999999\r\n\r\n",
        )  # fmt: skip
        head = httpx.Response(200, headers=parse_head(too_large))
        assert_guarded(head.headers, "413 of a real server")


def parse_head(answer: bytes) -> list[tuple[str, str]]:
    lines = answer.partition(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
    return [(name, value.strip()) for name, _, value in (line.partition(":") for line in lines)]


INLINE = [
    (re.compile(r"\sstyle\s*=", re.IGNORECASE), "a style attribute"),
    (re.compile(r"<style", re.IGNORECASE), "a style element"),
    (re.compile(r"<script(?![^>]*\ssrc=)[^>]*>", re.IGNORECASE), "an inline script"),
    (re.compile(r"\son[a-z]+\s*=", re.IGNORECASE), "an event handler attribute"),
    (re.compile(r"javascript:", re.IGNORECASE), "a javascript: link"),
]


def test_the_pages_hold_no_inline_script_or_style(tmp_path: Path) -> None:
    from statekernel.testing import Reply, ScriptedProvider, call

    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    helper = sk.delegate("helper", "Help.", model="kid/m")
    asks = Reply(tool_calls=[call("helper", {"task": "a"}, id="a")])
    providers = {
        "lead": ScriptedProvider([asks, "done"]),
        "kid": ScriptedProvider(["helped"], repeat_last=True),
    }

    async def family() -> None:
        async with sk.Kernel(url, tools=[helper], providers=providers) as kernel:
            await kernel.start(model="lead/m", messages=["go"], run_id="parent")
            async for _ in kernel.run("parent"):
                pass

    asyncio.run(family())
    with local_client(create_app(url, agent=kernel_options())) as client:
        pages = {
            path: client.get(path).text
            for path in (
                "/",
                "/?fragment=1",
                "/runs/asking",
                "/runs/uncertain",
                "/runs/injected",
                "/runs/injected?revision=2",
                "/runs/chat",
                "/runs/parent",
                "/runs/parent?fragment=1",
                "/runs/nobody",
            )
        }
    assert 'class="depth-1"' in pages["/runs/parent"], "the child runs are listed"
    assert "<svg" in pages["/runs/injected"], "the timeline is drawn"
    for path, html in pages.items():
        for pattern, what in INLINE:
            found = pattern.search(html)
            assert found is None, f"{what} in {path}: {html[found.start() - 80 : found.end() + 80]}"


def test_a_note_shows_only_when_the_view_issued_it(url: str) -> None:
    with local_client(create_app(url, agent=kernel_options())) as client:
        made_up = "Your session expired: sign in again at evil.example"
        for path in ("/runs/chat", "/"):
            page = client.get(path, params={"note": made_up}).text
            assert "evil.example" not in page
        done = post(client, "chat", "send", text="hi")
        location = done.headers["location"]
        page = client.get(location).text
        assert '<p class="note" role="status">sent; the run goes on</p>' in page
        signature = re.search(r"note_sig=([0-9a-f]+)", location)
        assert signature is not None
        forged = client.get("/runs/chat", params={"note": made_up, "note_sig": signature[1]})
        assert "evil.example" not in forged.text
        assert '<p class="note"' not in forged.text
        sent = token(client, "/runs/chat")
        deleted = client.post(
            f"/runs/chat/delete?csrf_token={sent}", data={"confirm": "chat"}, follow_redirects=False
        )
        listed = deleted.headers["location"]
        assert "deleted run chat" in client.get(listed).text
    with local_client(create_app(url)) as other:  # another view: another secret
        again = other.get(listed)
        assert again.status_code == 200
        assert "deleted run chat" not in again.text
