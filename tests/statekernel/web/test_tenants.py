"""Tenants: an ``authorize`` hook that refuses ``view`` on another tenant's runs hides them
from every response — the list and its pages, the search, the list's live notices, a
run's tree of children and its parent link: a refused run is never named or hinted at."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

import statekernel as sk
from statekernel.web import create_app

from .clients import local_client
from .runs_made import drive
from .serving import served
from .web_agent import kernel_options

MINE = ("a-first", "a-parent")
THEIRS = ("b-secret", "b-child-of-a")
"""Runs of tenant ``a`` and of tenant ``b``: ``b-child-of-a`` is a child run of
``a-parent`` that belongs to ``b``; ``a-grandchild`` is its child (hidden with it)."""


def tenant_of(run_id: str) -> str:
    return run_id.split("-", 1)[0]


def tenants(request: Request, action: str, run_id: str | None) -> bool:
    """Tenant ``X-Tenant`` may see the list and its own runs (by their id's prefix)."""
    tenant = request.headers.get("x-tenant", "")
    return run_id is None or tenant_of(run_id) == tenant


async def _make(url: str) -> None:
    async with sk.Kernel(url, **kernel_options()) as kernel:
        for run_id in ("a-first", "b-secret", "a-parent"):
            await kernel.start(model="chat/m", messages=["hello"], run_id=run_id)
            await drive(kernel, run_id)
        await kernel.start(
            model="chat/m",
            messages=["go"],
            run_id="b-child-of-a",
            parent_run_id="a-parent",
            parent_call_id="c1",
        )
        await kernel.start(
            model="chat/m",
            messages=["go"],
            run_id="a-grandchild",
            parent_run_id="b-child-of-a",
            parent_call_id="c2",
        )


@pytest.fixture
def url(tmp_path: Path) -> str:
    store = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(_make(store))
    return store


@pytest.fixture
def client(url: str) -> Iterator[TestClient]:
    with local_client(create_app(url, authorize=tenants), headers={"X-Tenant": "a"}) as c:
        yield c


def _never_named(text: str) -> None:
    for run_id in THEIRS:
        assert run_id not in text, f"{run_id} is named"


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/?fragment=1",
        "/?state=completed",
        "/?state=init",
        "/?q=b-",
        "/?q=b-secret",
        "/?q=secret",
        "/?q=child",
        "/runs/a-parent",
        "/runs/a-parent?fragment=1",
    ],
)
def test_no_page_names_another_tenants_run(client: TestClient, path: str) -> None:
    page = client.get(path)
    assert page.status_code == 200
    query = httpx.URL(path).params.get("q", "")
    _never_named(page.text.replace(f"{query}", "") if query else page.text)  # its echo
    if query.startswith("b-"):
        assert "no runs matching" in page.text


def test_the_list_shows_the_tenants_own_runs(client: TestClient) -> None:
    page = client.get("/").text
    for run_id in MINE:
        assert run_id in page
    assert "a-first" in client.get("/?q=first").text
    assert "a-parent" in client.get("/?q=a-").text


def test_the_tree_hides_a_refused_child_and_what_is_below_it(client: TestClient) -> None:
    page = client.get("/runs/a-parent").text
    assert "a-grandchild" not in page  # its parent is refused: it would hint at it
    grandchild = client.get("/runs/a-grandchild")  # its own: shown, its parent not named
    assert grandchild.status_code == 200
    _never_named(grandchild.text)


@pytest.mark.parametrize("run_id", THEIRS)
def test_another_tenants_run_is_refused(client: TestClient, run_id: str) -> None:
    for path in (f"/runs/{run_id}", f"/runs/{run_id}/stream", f"/runs/{run_id}/diagram.svg"):
        assert client.get(path).status_code == 403


def test_the_other_tenant_sees_its_own(url: str) -> None:
    with local_client(create_app(url, authorize=tenants), headers={"X-Tenant": "b"}) as c:
        page = c.get("/").text
        assert "b-secret" in page
        assert "b-child-of-a" in page
        assert "a-first" not in page
        assert "a-parent" not in page


def test_the_list_pages_on_past_refused_runs(tmp_path: Path) -> None:
    """A page of the list is never short of runs the request may see because the store's
    page was full of refused ones."""
    store = f"sqlite:///{tmp_path}/many.db"

    async def make() -> None:
        async with sk.Kernel(store, **kernel_options()) as kernel:
            await kernel.start(model="chat/m", messages=["hi"], run_id="a-oldest")
            for n in range(60):  # newer than a-oldest: the store's first page is all b's
                await kernel.start(model="chat/m", messages=["hi"], run_id=f"b-{n}")

    asyncio.run(make())
    app = create_app(store, authorize=tenants)
    with local_client(app, headers={"X-Tenant": "a"}) as c:
        page = c.get("/").text
        assert "a-oldest" in page
        assert "b-" not in page.split("<tbody", 1)[-1]


def test_live_notices_name_only_the_tenants_runs(url: str) -> None:
    """The list's stream tells tenant ``a`` of its own commits, not of tenant ``b``'s: a
    commit to ``b-secret`` is never sent, the next one to ``a-first`` is."""
    app = create_app(url, authorize=tenants)
    notices: list[str] = []
    subscribed = threading.Event()

    async def commit(run_id: str) -> None:
        async with sk.Kernel(url, **kernel_options()) as kernel:
            await kernel.send(run_id, "again")
            await drive(kernel, run_id)

    with (
        served(app) as base,
        httpx.stream("GET", f"{base}/stream", headers={"X-Tenant": "a"}, timeout=60) as s,
    ):
        event = ""
        for line in s.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                if event == "hello" and not subscribed.is_set():
                    subscribed.set()
                    asyncio.run(commit("b-secret"))
                    asyncio.run(commit("a-first"))
                elif event == "changed":
                    notices.append(line.removeprefix("data: "))
                    if "a-first" in notices:
                        break
    assert "a-first" in notices
    assert "b-secret" not in notices, json.dumps(notices)
