"""Bodies: an action checks its CSRF token and the ``authorize`` hook before it reads a
byte of its body, a ``Content-Length`` over the bound is refused (413) unread, a body
without one is cut off once over it, and forms are read with tight limits."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from statekernel.web import create_app
from statekernel.web.bodies import MAX_BODY, MAX_FIELDS
from statekernel.web.security import COOKIE

from .clients import local_client
from .runs_made import make_runs
from .serving import answer_to_head, served
from .test_actions import TOKEN, post
from .web_agent import kernel_options


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store holding the test runs."""
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    return url


def head(base: str, path: str, length: int, *more: str) -> str:
    """The head of a form POST declaring a body of ``length`` bytes."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {base.removeprefix('http://')}",
        "Content-Type: application/x-www-form-urlencoded",
        f"Content-Length: {length}",
        *more,
    ]
    return "\r\n".join(lines) + "\r\n\r\n"


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def credentials(base: str) -> tuple[str, str]:
    """A token of a page and the cookie it came with, as a browser holds them (the
    token of a page without a form is its cookie's)."""
    with httpx.Client(base_url=base) as browser:
        found = TOKEN.search(browser.get("/runs/asking").text)
        sent = found.group(1) if found is not None else browser.cookies[COOKIE]
        cookie = "; ".join(f"{name}={value}" for name, value in browser.cookies.items())
    return sent, cookie


def test_a_body_declared_over_the_bound_is_refused_unread(url: str) -> None:
    with served(create_app(url, agent=kernel_options())) as base:
        sent, cookie = credentials(base)
        answer = answer_to_head(
            base,
            head(base, f"/runs/asking/answer?csrf_token={sent}", MAX_BODY + 1, f"Cookie: {cookie}"),
            then_closed=True,  # not one byte of the body was sent, nor will be read
        )
        assert status(answer) == 413
        assert f"over {MAX_BODY} bytes".encode() in answer
        gigabyte = answer_to_head(base, head(base, "/runs/asking/answer", 10**9), then_closed=True)
        assert status(gigabyte) == 413


def test_the_token_and_authorize_are_checked_before_the_body(url: str) -> None:
    def only_viewing(request: Request, action: str, run_id: str | None) -> bool:
        return action == "view"

    within = MAX_BODY - 1  # a body the view would take: none of it is ever sent
    with served(create_app(url, agent=kernel_options(), authorize=only_viewing)) as base:
        sent, cookie = credentials(base)
        no_token = answer_to_head(base, head(base, "/runs/asking/answer", within))
        assert status(no_token) == 403
        assert b"CSRF token" in no_token
        refused = answer_to_head(
            base,
            head(base, f"/runs/asking/answer?csrf_token={sent}", within, f"Cookie: {cookie}"),
        )
        assert status(refused) == 403
        assert b"not allowed: answer on run asking" in refused
    with served(create_app(url)) as base:  # read-only: no agent
        sent, cookie = credentials(base)
        read_only = answer_to_head(
            base,
            head(base, f"/runs/asking/answer?csrf_token={sent}", within, f"Cookie: {cookie}"),
        )
        assert status(read_only) == 403
        assert b"read-only" in read_only


def test_a_body_without_a_length_is_cut_off_over_the_bound(url: str) -> None:
    pulled = 0
    total = 64 * 1024 * 1024

    def body() -> Iterator[bytes]:
        nonlocal pulled
        while pulled < total:
            pulled += 16 * 1024
            yield b"a" * (16 * 1024)

    with served(create_app(url, agent=kernel_options())) as base:
        sent, cookie = credentials(base)
        answer = httpx.post(
            f"{base}/runs/asking/answer?csrf_token={sent}",
            content=body(),  # chunked: no Content-Length
            headers={"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"},
            timeout=60,
        )
    assert answer.status_code == 413
    assert answer.headers["connection"] == "close"
    assert pulled < total, "the client was stopped long before it sent it all"


def revision_of(client: TestClient, run_id: str) -> str:
    found = re.search(r'id="revision">([0-9]+)<', client.get(f"/runs/{run_id}").text)
    assert found is not None
    return found.group(1)


def test_forms_are_read_with_tight_limits(url: str) -> None:
    with local_client(create_app(url, agent=kernel_options())) as client:
        before = revision_of(client, "chat")
        fields = {f"f{n}": "x" for n in range(MAX_FIELDS + 1)}
        many = post(client, "chat", "send", text="hi", **fields)
        assert many.status_code == 400
        assert "Too many fields" in many.text
        sent = re.search(r"csrf_token=([^&]+)", many.request.url.query.decode())
        assert sent is not None
        a_file = client.post(
            f"/runs/chat/send?csrf_token={sent[1]}",
            data={"text": "hi"},
            files={"upload": ("notes.txt", b"hello")},
        )
        assert a_file.status_code == 400
        assert "Too many files" in a_file.text
        large = client.post(
            f"/runs/chat/send?csrf_token={sent[1]}", data={"text": "x" * (MAX_BODY + 1)}
        )
        assert large.status_code == 413
        assert revision_of(client, "chat") == before, "nothing was sent"
        fits = post(client, "chat", "send", text="y" * (MAX_BODY // 2))
        assert fits.status_code == 303
