"""Numbers a request gives (``?revision=``, ``?after=``, the fork's revision, the
``Content-Length``) are ASCII digits only, at most 18 of them: anything else is a 400
naming the parameter, never an error of ``int``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from statekernel.web import create_app
from statekernel.web.numbers import BadNumber, whole_number

from .clients import local_client
from .runs_made import make_runs
from .test_actions import post
from .web_agent import kernel_options

NOT_NUMBERS = [
    "\u00b2",  # a superscript 2: int() refuses it with a ValueError
    "\u0663",  # an Arabic-Indic 3: int() takes it
    "9" * 5000,  # int() refuses it (over 4,300 digits) after a while
    "1" * 19,
    "-1",
    "+1",
    "1_000",
    " 1",
    "1 ",
    "0x1",
    "1e3",
    "1.0",
]


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store holding the test runs."""
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    return url


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_a_revision_that_is_no_number_is_a_400_naming_it(url: str, text: str) -> None:
    with local_client(create_app(url, agent=kernel_options())) as client:
        page = client.get("/runs/chat", params={"revision": text})
        assert page.status_code == 400
        assert "revision must be a whole number of at most 18 digits" in page.text
        stream = client.get("/runs/chat/stream", params={"after": text, "until": "rest"})
        assert stream.status_code == 400
        assert "after must be a whole number of at most 18 digits" in stream.text
        forked = post(client, "chat", "fork", revision=text)
        assert forked.status_code == 400
        assert "revision must be a whole number of at most 18 digits" in forked.text
        listed = client.get("/").text
        assert listed.count("/runs/chat") == 1, "nothing was forked"


def test_eighteen_digits_are_a_number(url: str) -> None:
    with local_client(create_app(url, agent=kernel_options())) as client:
        far = "9" * 18
        page = client.get("/runs/chat", params={"revision": far})
        assert page.status_code == 404
        assert f"run chat has no revision {far}" in page.text
        assert client.get("/runs/chat", params={"revision": "0001"}).status_code == 200
        stream = client.get("/runs/chat/stream", params={"after": far, "until": "rest"})
        assert stream.status_code == 200
        assert "event: events" not in stream.text
        assert post(client, "chat", "fork", revision="1").status_code == 303


@pytest.mark.parametrize("length", ["\u00b2", "1" * 19, "-1", "1_0", "0x10"])
def test_a_content_length_that_is_no_number_is_a_400(url: str, length: str) -> None:
    with local_client(create_app(url, agent=kernel_options())) as client:
        sent = client.post("/runs/chat/send", headers={b"content-length": length.encode("latin-1")})
        assert sent.status_code == 400
        assert "Content-Length must be a whole number" in sent.text


def test_whole_number_takes_ascii_digits_only() -> None:
    assert whole_number("0", "n") == 0
    assert whole_number("9" * 18, "n") == 10**18 - 1
    for text in ["", *NOT_NUMBERS]:
        with pytest.raises(BadNumber, match=r"^n must be a whole number"):
            whole_number(text, "n")
