"""The web view's run queue pages and their actions (requeue, drop): each a POST with
the page's CSRF token, authorized by the hook; refused without them, and in a read-only
view."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

import statekernel as sk
from statekernel._storage.queues import RunQueues
from statekernel.testing import ScriptedProvider
from statekernel.web import create_app
from statekernel.web.security import COOKIE

from ..cli.test_cli_queues import _filled
from .clients import local_client

TOKEN = re.compile(r'action="[^"?]*\?csrf_token=([^"&]+)')
AGENT = {"providers": {"scripted": ScriptedProvider([])}}


def allow(request: Request, action: str, run_id: str | None) -> bool:
    """Anyone looks; only an admin changes a queue."""
    if action in ("requeue", "drop"):
        return request.headers.get("x-role") == "admin"
    return True


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def url(request: pytest.FixtureRequest) -> str:
    found = str(request.getfixturevalue(f"{request.param}_store_url"))
    _filled(found)
    return found


@pytest.fixture
def client(url: str) -> Iterator[TestClient]:
    with local_client(create_app(url, agent=AGENT, authorize=allow)) as made:
        yield made


def token(client: TestClient) -> str:
    found = TOKEN.search(client.get("/queues/jobs").text)
    assert found is not None
    return found.group(1)


def post(client: TestClient, action: str, run_id: str | None, **form: str) -> Any:
    query = f"csrf_token={token(client)}" + (f"&run_id={run_id}" if run_id else "")
    headers = {"x-role": "admin"}
    return client.post(
        f"/queues/jobs/{action}?{query}", data=form, headers=headers, follow_redirects=False
    )


def dead_letters(url: str) -> list[str]:
    async def go() -> list[str]:
        async with sk.Kernel(url) as kernel:
            assert isinstance(kernel.store, RunQueues)
            return [d.run_id for d in await kernel.store.run_queue("jobs").dead_letters()]

    return asyncio.run(go())


def test_the_queues_and_a_queue_are_shown(client: TestClient) -> None:
    listed = client.get("/queues")
    assert listed.status_code == 200
    assert re.search(r">jobs</a></td>\s*<td>1</td><td>1</td><td>2</td>", listed.text)
    shown = client.get("/queues/jobs")
    assert shown.status_code == 200
    assert "the model gave up" in shown.text
    assert "<td>taken</td>" in shown.text
    assert "<td>waiting</td>" in shown.text
    assert client.get("/queues/no%20spaces").status_code == 400


def test_a_dead_letter_is_requeued_and_an_entry_dropped(client: TestClient, url: str) -> None:
    done = post(client, "requeue", "dead-1")
    assert done.status_code == 303, done.text
    assert "put+run+dead-1+back" in done.headers["location"]
    assert "put run dead-1 back on the queue" in client.get(done.headers["location"]).text
    assert dead_letters(url) == ["dead-2"]
    assert post(client, "requeue", "dead-1").status_code == 400  # none left of it
    unsure = post(client, "drop", "waits")
    assert unsure.status_code == 400
    assert "sure" in unsure.text
    assert post(client, "drop", "waits", confirm="on").status_code == 303
    assert ">waits</a>" not in client.get("/queues/jobs").text
    assert post(client, "requeue", None).status_code == 303  # every dead letter
    assert dead_letters(url) == []


def test_actions_need_the_token_and_the_hooks_leave(client: TestClient, url: str) -> None:
    no_token = client.post(
        "/queues/jobs/requeue?run_id=dead-1", headers={"x-role": "admin"}, follow_redirects=False
    )
    assert no_token.status_code == 403
    sent = token(client)
    not_admin = client.post(
        f"/queues/jobs/requeue?csrf_token={sent}&run_id=dead-1", follow_redirects=False
    )
    assert not_admin.status_code == 403
    assert "not allowed: requeue on run dead-1" in not_admin.text
    assert dead_letters(url) == ["dead-1", "dead-2"]
    assert post(client, "nothing", "dead-1").status_code == 404


def test_a_read_only_view_shows_and_refuses(url: str) -> None:
    with local_client(create_app(url)) as reader:
        shown = reader.get("/queues/jobs")
        assert shown.status_code == 200
        assert "requeue</button>" not in shown.text
        sent = reader.cookies.get(COOKIE)  # the page's token: the view's signed cookie
        assert sent
        refused = reader.post(
            f"/queues/jobs/requeue?csrf_token={sent}&run_id=dead-1", follow_redirects=False
        )
        assert refused.status_code == 403
    assert dead_letters(url) == ["dead-1", "dead-2"]


def test_a_store_without_queues_says_so(tmp_path: Path) -> None:
    with local_client(create_app(f"sqlite:///{tmp_path / 'runs.db'}")) as reader:
        assert "has no run queues" in reader.get("/queues").text
        assert reader.get("/queues/jobs").status_code == 404
