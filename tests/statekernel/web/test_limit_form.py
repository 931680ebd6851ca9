"""A run paused with ``limit_reached`` shows its page the limit, what the run used and what
it allowed, and a form that raises it and resumes the run (the run's other limits kept);
the form is CSRF-checked and authorized like every action, and a value that would pause
the run again at once, or is not a number, is refused with nothing committed."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

import statekernel as sk
from statekernel.testing import ScriptedProvider, call
from statekernel.web import create_app

from .clients import local_client
from .test_actions import post, state_of, wait_for_state
from .test_pause_forms import revision_of


@sk.tool
def note(text: str) -> str:
    """Note something down."""
    return f"noted {text}"


def agent() -> dict[str, Any]:
    """Kernel keyword arguments: ``notes/m`` notes twice, then answers "done"."""
    script = [call("note", {"text": "a"}), call("note", {"text": "b"}), "done"]
    return {"tools": [note], "providers": {"notes": ScriptedProvider(script)}}


LIMITS = sk.Limits(tool_calls=1, total_tokens=1_000)


def make(url: str) -> None:
    """Run ``capped`` paused at its limit of one tool call, run ``free`` completed."""

    async def runs() -> None:
        async with sk.Kernel(url, **agent()) as kernel:
            await kernel.start(model="notes/m", messages=["go"], run_id="capped", limits=LIMITS)
            await kernel.start(model="notes/m", messages=["go"], run_id="free")
            for run_id in ("capped", "free"):
                async for _ in kernel.run(run_id):
                    pass

    asyncio.run(runs())


@pytest.fixture
def url(tmp_path: Path) -> str:
    store = f"sqlite:///{tmp_path}/runs.db"
    make(store)
    return store


@pytest.fixture
def client(url: str) -> Iterator[TestClient]:
    with local_client(create_app(url, agent=agent())) as test_client:
        yield test_client


def load(url: str, run_id: str = "capped") -> sk.Run:
    async def get() -> sk.Run:
        async with sk.Kernel(url, **agent()) as kernel:
            return await kernel.get(run_id)

    return asyncio.run(get())


def test_the_page_shows_the_limit_and_a_form_to_raise_it(client: TestClient) -> None:
    page = client.get("/runs/capped").text
    assert re.search(r'id="limit"><code>tool_calls</code>: used 1, allowed 1<', page)
    assert "total_tokens=1000 tool_calls=1 (tool calls 1)" in page
    form = re.search(r'<form class="limit".*?</form>', page, re.S)
    assert form is not None
    action = re.search(r'action="([^"]+)"', form.group(0))
    assert action is not None
    assert html.unescape(action.group(1)).startswith("/runs/capped/raise_limit?csrf_token=")
    assert '<input type="hidden" name="limit" value="tool_calls">' in form.group(0)
    field = re.search(r'<input type="number" name="value"[^>]*>', form.group(0))
    assert field is not None
    assert all(f in field.group(0) for f in ('min="2"', 'step="1"', 'value="2"', "required"))
    assert "used 1 of 1 allowed" in form.group(0)
    assert '<form class="resume"' not in page  # this form resumes it
    free = client.get("/runs/free").text
    assert '<form class="limit"' not in free
    assert 'id="limit"' not in free
    assert 'id="limits"' not in free  # a run without limits shows none


@pytest.mark.parametrize(
    ("form", "says"),
    [
        ({"value": "1"}, "has used 1 of limit tool_calls: a limit of 1 pauses it again at once"),
        ({"value": "0"}, "has used 1 of limit tool_calls"),
        ({"value": "two"}, "value must be a whole number of at most 18 digits"),
        ({"value": "1.5"}, "value must be a whole number"),
        ({"value": "-3"}, "value must be a whole number"),
        ({"value": ""}, "value must be a whole number"),
        ({"value": "9" * 19}, "value must be a whole number of at most 18 digits"),
        ({"limit": "budget", "value": "5"}, "no limit 'budget': a limit is one of"),
    ],
)
def test_a_value_that_cannot_be_the_limit_is_refused(
    client: TestClient, url: str, form: dict[str, str], says: str
) -> None:
    before = revision_of(client.get("/runs/capped").text)
    refused = post(client, "capped", "raise_limit", **{"limit": "tool_calls", **form})
    assert refused.status_code == 400
    assert says in html.unescape(refused.text)
    assert "Traceback" not in refused.text
    assert revision_of(client.get("/runs/capped").text) == before, "nothing was committed"
    assert load(url).limits == LIMITS


def test_a_run_not_paused_at_a_limit_has_none_to_raise(client: TestClient) -> None:
    refused = post(client, "free", "raise_limit", limit="tool_calls", value="5")
    assert refused.status_code == 400
    assert "the run is not paused at a limit" in html.unescape(refused.text)
    assert state_of(client, "free") == "completed"


def test_the_raised_limit_resumes_the_run_keeping_its_other_limits(
    client: TestClient, url: str
) -> None:
    done = post(client, "capped", "raise_limit", limit="tool_calls", value="5")
    assert done.status_code == 303
    assert done.headers["location"].startswith(
        "/runs/capped?note=raised+limit+tool_calls+to+5%3B+the+run+goes+on"
    )
    wait_for_state(client, "capped", "completed")  # driven by the view
    run = load(url)
    assert run.limits == sk.Limits(tool_calls=5, total_tokens=1_000)
    assert run.output == "done"
    assert "noted b" in client.get("/runs/capped").text


def test_the_form_needs_its_token_and_the_authorize_hooks_yes(url: str) -> None:
    asked: list[tuple[str, str | None]] = []

    def authorize(request: Request, action: str, run_id: str | None) -> bool:
        asked.append((action, run_id))
        return action == "view" or request.headers.get("x-role") == "operator"

    with local_client(create_app(url, agent=agent(), authorize=authorize)) as client:
        forged = client.post("/runs/capped/raise_limit?csrf_token=a.b", data={"value": "5"})
        assert forged.status_code == 403
        assert "CSRF" in forged.text
        refused = post(client, "capped", "raise_limit", limit="tool_calls", value="5")
        assert refused.status_code == 403
        assert "not allowed: raise_limit on run capped" in refused.text
        assert ("raise_limit", "capped") in asked
        assert state_of(client, "capped") == "paused"
        assert load(url).limits == LIMITS
        client.headers["x-role"] = "operator"
        done = post(client, "capped", "raise_limit", limit="tool_calls", value="5")
        assert done.status_code == 303
        wait_for_state(client, "capped", "completed")
