"""The web view's actions: each a POST with the page's CSRF token, authorized by the
hook, done by the acting kernel; a refused one answers a page saying why."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from statekernel.errors import ConfigError
from statekernel.stores import open_store
from statekernel.web import create_app

from .clients import local_client
from .runs_made import make_runs
from .web_agent import kernel_options

TOKEN = re.compile(r'action="[^"?]*\?csrf_token=([^"&]+)"')
"""The token in the address a form of a page posts to."""


def token(client: TestClient, path: str = "/") -> str:
    """The CSRF token of the page at ``path`` (its cookie is then the client's)."""
    found = TOKEN.search(client.get(path).text)
    if found is None:  # the list has no form: take a run page's
        found = TOKEN.search(client.get("/runs/asking").text)
    assert found is not None
    return found.group(1)


def state_of(client: TestClient, run_id: str) -> str:
    found = re.search(r'id="state">([a-z_]+)<', client.get(f"/runs/{run_id}").text)
    assert found is not None
    return found.group(1)


def wait_for_state(client: TestClient, run_id: str, state: str) -> None:
    """Until the run (driven by the view in the background) is in ``state``."""
    deadline = time.monotonic() + 30
    while (now := state_of(client, run_id)) != state:
        assert time.monotonic() < deadline, f"{run_id} stays {now}, not {state}"
        time.sleep(0.05)


def post(client: TestClient, run_id: str, action: str, **form: str) -> Any:
    """Post ``form`` to the action as the run's page does (the token in the address)."""
    sent = token(client, f"/runs/{run_id}")
    url = f"/runs/{run_id}/{action}?csrf_token={sent}"
    return client.post(url, data=form, follow_redirects=False)


def test_a_question_is_answered_from_its_form_and_the_run_completes(client: TestClient) -> None:
    wrong = post(client, "asking", "answer", value="0")
    assert wrong.status_code == 400
    assert "does not fit the question" in wrong.text
    assert "0 is less than the minimum of 1" in wrong.text
    not_a_number = post(client, "asking", "answer", value="two")
    assert not_a_number.status_code == 400
    assert "answer must be an integer of at most 18 digits" in not_a_number.text
    assert state_of(client, "asking") == "paused"
    done = post(client, "asking", "answer", value="2")
    assert done.status_code == 303
    assert done.headers["location"].startswith("/runs/asking?note=answered")
    wait_for_state(client, "asking", "completed")
    page = client.get("/runs/asking").text
    assert "booked for you" in page


def test_every_post_needs_the_csrf_token(client: TestClient) -> None:
    mine = token(client, "/runs/asking")
    missing = client.post("/runs/asking/answer", data={"value": "2"})
    assert missing.status_code == 403
    assert "CSRF" in missing.text
    forged = client.post("/runs/asking/answer?csrf_token=a.b", data={"value": "2"})
    assert forged.status_code == 403
    in_the_body = client.post("/runs/asking/answer", data={"value": "2", "csrf_token": mine})
    assert in_the_body.status_code == 403, "read before the body: in the address or a header"
    other = local_client(client.app)  # another browser: its own cookie, not this token
    stolen = other.post(f"/runs/asking/answer?csrf_token={mine}", data={"value": "2"})
    assert stolen.status_code == 403
    assert state_of(client, "asking") == "paused"
    by_header = client.post(
        "/runs/asking/answer",
        data={"value": "2"},
        headers={"X-CSRF-Token": mine},
        follow_redirects=False,
    )
    assert by_header.status_code == 303


def test_an_uncertain_call_is_resolved_and_the_run_goes_on(client: TestClient) -> None:
    unknown = post(client, "uncertain", "resolve", call_id="nope", how="rerun")
    assert unknown.status_code == 400
    done = post(client, "uncertain", "resolve", call_id="call_0_0", how="output", text='"booked 2"')
    assert done.status_code == 303
    wait_for_state(client, "uncertain", "completed")
    page = client.get("/runs/uncertain").text
    assert "booked 2" in page
    assert "uncertain: may or may not have run" not in page


def test_send_retry_fork_and_delete(client: TestClient) -> None:
    sent = post(client, "chat", "send", text="are you there?")
    assert sent.status_code == 303
    wait_for_state(client, "chat", "completed")
    assert "are you there?" in client.get("/runs/chat").text
    not_failed = post(client, "chat", "retry")
    assert not_failed.status_code == 400
    forked = post(client, "chat", "fork", revision="1")
    assert forked.status_code == 303
    location = forked.headers["location"]
    new_id = location.split("/runs/")[1].split("?")[0]
    assert new_id != "chat"
    assert client.get(f"/runs/{new_id}").status_code == 200
    unconfirmed = post(client, new_id, "delete", confirm="wrong")
    assert unconfirmed.status_code == 400
    assert f"type the run id ({new_id})" in unconfirmed.text
    deleted = post(client, new_id, "delete", confirm=new_id)
    assert deleted.status_code == 303
    assert client.get(f"/runs/{new_id}").status_code == 404


def test_a_paused_run_is_cancelled_from_its_page_and_retried(client: TestClient) -> None:
    page = client.get("/runs/asking").text
    assert 'action="/runs/asking/cancel?csrf_token=' in page
    done = post(client, "asking", "cancel", reason="the user left")
    assert done.status_code == 303
    assert done.headers["location"].startswith("/runs/asking?note=cancelled")
    assert state_of(client, "asking") == "failed"
    page = client.get("/runs/asking").text
    assert "the user left" in page
    assert 'action="/runs/asking/cancel?' not in page  # nothing to cancel any more
    again = post(client, "asking", "cancel")
    assert again.status_code == 303
    assert "unchanged" in again.headers["location"]
    retried = post(client, "asking", "retry")
    assert retried.status_code == 303
    wait_for_state(client, "asking", "paused")  # back at its question


def test_a_run_another_process_holds_is_busy(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))

    holder = open_store(url)

    async def take() -> None:
        await holder.acquire("asking", "someone-else/4242", ttl=60.0)

    asyncio.run(take())
    with local_client(create_app(url, agent=kernel_options())) as client:
        busy = post(client, "asking", "answer", value="2")
        assert busy.status_code == 409
        text = busy.text
        assert "busy: run asking is owned by someone-else/4242" in text
        assert "Traceback" not in text
    asyncio.run(holder.aclose())


def test_the_authorize_hook_decides(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    asked: list[tuple[str, str | None]] = []

    async def authorize(request: Request, action: str, run_id: str | None) -> bool:
        asked.append((action, run_id))
        return action in ("view", "send")

    with local_client(create_app(url, agent=kernel_options(), authorize=authorize)) as client:
        assert client.get("/runs/asking").status_code == 200
        refused = post(client, "chat", "delete", confirm="chat")
        assert refused.status_code == 403
        assert "not allowed: delete on run chat" in refused.text
        allowed = post(client, "chat", "send", text="hi")
        assert allowed.status_code == 303
    assert ("delete", "chat") in asked
    assert ("send", "chat") in asked
    assert ("view", "asking") in asked


def test_deleting_with_children_needs_each_child_allowed(tmp_path: Path) -> None:
    import statekernel as sk
    from statekernel.testing import Reply, ScriptedProvider, call

    url = f"sqlite:///{tmp_path}/runs.db"
    helper = sk.delegate("helper", "Help.", model="kid/m")
    asks = Reply(tool_calls=[call("helper", {"task": t}, id=t) for t in ("a", "b")])
    providers = {
        "lead": ScriptedProvider([asks, "done"]),
        "kid": ScriptedProvider(["helped"], repeat_last=True),
    }

    async def family() -> None:
        async with sk.Kernel(url, tools=[helper], providers=providers) as kernel:
            await kernel.start(model="lead/m", messages=["go"], run_id="parent")
            async for _ in kernel.run("parent"):
                pass
            assert [r.run_id for _, r in await kernel.tree("parent")][1:] == [
                sk.child_run_id("parent", "a"),
                sk.child_run_id("parent", "b"),
            ]

    asyncio.run(family())
    kid_b = sk.child_run_id("parent", "b")

    held_when_asked: list[bool] = []

    async def authorize(request: Request, action: str, run_id: str | None) -> bool:
        if action == "delete" and run_id != "parent":
            # asked about a child once the tree is held: no child can start meanwhile
            store = open_store(url)
            try:
                lease = await store.acquire("parent", "someone-else", ttl=5)
            except sk.RunBusy:
                held_when_asked.append(True)
            else:
                await store.release(lease)
                held_when_asked.append(False)
            finally:
                await store.aclose()
        return not (action == "delete" and run_id == kid_b)

    everyone = [sk.child_run_id("parent", "a"), kid_b, "parent"]
    with local_client(create_app(url, agent=kernel_options(), authorize=authorize)) as client:
        refused = post(client, "parent", "delete", confirm="parent", children="on")
        assert refused.status_code == 403
        assert "not allowed: delete on a child run of run parent" in refused.text
        assert kid_b not in refused.text  # the refused child is not named
        assert held_when_asked == [True, True]
        for run_id in everyone:  # nothing was deleted
            assert client.get(f"/runs/{run_id}").status_code == 200

    async def unsure(request: Request, action: str, run_id: str | None) -> Any:
        return None if action == "delete" and run_id == kid_b else True

    with local_client(create_app(url, agent=kernel_options(), authorize=unsure)) as client:
        with pytest.raises(ConfigError, match="must return True or False, got None"):
            post(client, "parent", "delete", confirm="parent", children="on")
        for run_id in everyone:  # nothing was deleted, and the leases were given back
            assert client.get(f"/runs/{run_id}").status_code == 200
    with local_client(create_app(url, agent=kernel_options())) as client:
        done = post(client, "parent", "delete", confirm="parent", children="on")
        assert done.status_code == 303
        for run_id in everyone:
            assert client.get(f"/runs/{run_id}").status_code == 404


@pytest.mark.parametrize("answer", [None, "no", 1])
def test_an_authorize_hook_answering_other_than_a_bool_is_a_config_error(
    tmp_path: Path, answer: object
) -> None:
    # None: a missing return; "no" and 1: truthy, which a bool() of the answer let through
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))

    def authorize(request: Request, action: str, run_id: str | None) -> Any:
        return answer

    app = create_app(url, agent=kernel_options(), authorize=authorize)
    with local_client(app) as client, pytest.raises(ConfigError, match=f"got {answer!r}"):
        client.get("/runs/asking")
