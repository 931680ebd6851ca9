"""The ``Host`` check: the view answers only requests addressed to the names it was
given (loopback's by default), whatever serves it; its links are paths, never built
from the request's ``Host``."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from statekernel.errors import ConfigError
from statekernel.web import create_app

from .clients import local_client
from .runs_made import make_runs
from .serving import answer_to_head, served
from .test_actions import token
from .web_agent import kernel_options

PATHS = [
    "/",
    "/?fragment=1",
    "/runs/asking",
    "/runs/asking?revision=1",
    "/runs/asking/stream?until=rest",
    "/runs/asking/diagram.svg",
    "/static/web.css",
    "/static/htmx.min.js",
]

LINK = re.compile(r'(?:href|src|action|data-stream|data-fragment|data-refresh)="([^"]*)"')


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store holding the test runs."""
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    return url


@pytest.mark.parametrize(
    "host",
    [
        "attacker.example",
        "attacker.example:8000",
        "localhost.attacker.example",
        "127.0.0.1.nip.io",
        "localhost.",
        "[::2]:80",
        "localhost:http",
        "",
    ],
)
def test_a_request_addressed_to_another_name_gets_400_and_nothing_of_the_store(
    url: str, host: str
) -> None:
    with local_client(create_app(url, agent=kernel_options())) as client:
        sent = token(client, "/runs/asking")
        for path in PATHS:
            answer = client.get(path, headers={"host": host})
            assert answer.status_code == 400, path
            assert "asking" not in answer.text
            assert "unknown host" in answer.text
        posted = client.post(
            f"/runs/asking/answer?csrf_token={sent}", data={"value": "2"}, headers={"host": host}
        )
        assert posted.status_code == 400
        assert "paused" in client.get("/runs/asking").text, "not answered"


def test_the_loopback_names_are_answered_with_any_port(url: str) -> None:
    with TestClient(create_app(url)) as client:
        for host in ("localhost", "LocalHost:8000", "127.0.0.1", "127.0.0.1:1", "[::1]:8000"):
            answer = client.get("/runs/asking", headers={"host": host})
            assert answer.status_code == 200, host
            assert "asking" in answer.text
        assert client.get("/").status_code == 400, "Starlette's testserver is no such name"


def test_a_real_server_refuses_a_request_without_a_host(url: str) -> None:
    with served(create_app(url)) as base:
        bare = answer_to_head(base, "GET /runs/asking HTTP/1.0\r\n\r\n")
        assert bare.startswith(b"HTTP/1.1 400 ")
        assert b"asking" not in bare
        rebound = answer_to_head(base, "GET / HTTP/1.1\r\nHost: attacker.example\r\n\r\n")
        assert rebound.startswith(b"HTTP/1.1 400 ")
        named = answer_to_head(base, f"GET / HTTP/1.1\r\nHost: {base[7:]}\r\n\r\n")
        assert named.startswith(b"HTTP/1.1 200 ")


def test_allowed_hosts_are_the_names_answered(url: str) -> None:
    app = create_app(url, allowed_hosts=["runs.example.com", "10.1.2.3", "::1"])
    with TestClient(app, base_url="http://runs.example.com") as client:
        assert client.get("/runs/asking").status_code == 200
        for host in ("RUNS.example.com:8443", "10.1.2.3:80", "[::1]", "[0::1]:9"):
            assert client.get("/", headers={"host": host}).status_code == 200, host
        for host in ("localhost", "127.0.0.1", "example.com", "x.runs.example.com"):
            assert client.get("/", headers={"host": host}).status_code == 400, host


@pytest.mark.parametrize(
    "hosts",
    [["*"], ["*.example.com"], [], ["runs.example.com:80"], ["http://runs.example.com"],
     ["a/b"], "runs.example.com", [1]],
)  # fmt: skip
def test_allowed_hosts_refuses_what_is_no_name(url: str, hosts: Any) -> None:
    with pytest.raises(ConfigError, match="allowed_hosts"):
        create_app(url, allowed_hosts=hosts)


def links(html: str) -> list[str]:
    return LINK.findall(html)


def test_links_are_paths_never_built_from_the_host(url: str) -> None:
    app = create_app(url, agent=kernel_options(), allowed_hosts=["localhost", "evil.example"])
    with TestClient(app, base_url="http://evil.example:8123") as client:
        for path in ("/", "/runs/asking", "/runs/uncertain", "/runs/chat?revision=1"):
            found = links(client.get(path).text)
            assert found, path
            for link in found:
                assert link.startswith("/"), link
                assert not link.startswith("//"), link
        sent = token(client, "/runs/chat")
        done = client.post(
            f"/runs/chat/send?csrf_token={sent}", data={"text": "hi"}, follow_redirects=False
        )
        assert done.status_code == 303
        assert done.headers["location"].startswith("/runs/chat?note=")


def test_a_mounted_view_links_under_its_path(url: str) -> None:
    view = create_app(url, agent=kernel_options())
    app = Starlette(routes=[Mount("/agent-runs", app=view)], lifespan=view.router.lifespan_context)
    with local_client(app) as client:
        page = client.get("/agent-runs/runs/chat").text
        for link in links(page):
            assert link.startswith("/agent-runs/"), link
        sent = token(client, "/agent-runs/runs/chat")
        done = client.post(
            f"/agent-runs/runs/chat/send?csrf_token={sent}",
            data={"text": "hi"},
            follow_redirects=False,
        )
        assert done.status_code == 303
        assert done.headers["location"].startswith("/agent-runs/runs/chat?note=")
        rebound = client.get("/agent-runs/", headers={"host": "attacker.example"})
        assert rebound.status_code == 400
