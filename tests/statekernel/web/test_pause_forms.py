"""The forms of a paused run choose nothing for the operator: an uncertain call is
resolved only once the operator says what happened to it (it ran, it failed, it did not
run), and a run is resumed without a value only when the operator says so; a form sent
without that choice is refused with a page saying why, and the run stays as it was."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import statekernel as sk
from statekernel.testing import ScriptedProvider, call
from statekernel.web import create_app

from .clients import local_client
from .test_actions import post, state_of, wait_for_state

# -- resolve: it ran, it failed or it did not run -------------------------------------

SAY_WHAT_HAPPENED = (
    "say what happened to call call_0_0: it ran and returned an output, it failed with "
    "an error, or it did not run (run it again)"
)


def test_the_resolve_form_checks_no_answer_for_the_operator(client: TestClient) -> None:
    page = client.get("/runs/uncertain").text
    radios = re.findall(r'<input type="radio" name="how"[^>]*>', page)
    assert [re.findall(r'value="([a-z]+)"', r) for r in radios] == [
        ["output"],
        ["error"],
        ["rerun"],
    ]
    assert all(" required" in r for r in radios), radios
    assert not any("checked" in r for r in radios), radios
    for said in (
        "it ran and returned this output",
        "it failed with this error",
        "it did not run (or may run again): run it again",
    ):
        assert said in page


@pytest.mark.parametrize("how", [None, "", "maybe"])
def test_a_resolve_without_saying_what_happened_is_refused(
    client: TestClient, how: str | None
) -> None:
    form = {"call_id": "call_0_0", "text": '"booked 2"'}
    if how is not None:
        form["how"] = how
    before = client.get("/runs/uncertain").text
    refused = post(client, "uncertain", "resolve", **form)
    assert refused.status_code == 400
    assert SAY_WHAT_HAPPENED in html.unescape(refused.text)
    assert "Traceback" not in refused.text
    after = client.get("/runs/uncertain").text
    assert revision_of(after) == revision_of(before), "nothing was committed"
    assert state_of(client, "uncertain") == "paused"
    assert "uncertain: may or may not have run" in after
    rerun = post(client, "uncertain", "resolve", call_id="call_0_0", how="rerun")
    assert rerun.status_code == 303  # once said, it is done
    wait_for_state(client, "uncertain", "completed")


# -- resume: with a value, or explicitly without one ------------------------------------


@sk.tool
def transfer(to: str, amount: int) -> str:
    """Send money (not idempotent)."""
    return f"sent {amount} to {to}"


class Approvals(sk.Hooks):
    """Pause before each transfer until the run is resumed with its approval: ``{"approve":
    CALL_ID}`` (JSON) or ``approve CALL_ID`` (text)."""

    def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> sk.Pause | None:
        """The approval pause, unless the resume value approves this call."""
        if run.resume_value in ({"approve": call.id}, f"approve {call.id}"):
            return None
        return sk.Pause("approval", {"call": call.id, "input": call.input})


def agent() -> dict[str, Any]:
    """Kernel keyword arguments: ``bank/m`` transfers 50 to Bob, then says "Sent."."""
    model = ScriptedProvider([call("transfer", {"to": "Bob", "amount": 50}), "Sent."])
    return {"tools": [transfer], "hooks": Approvals(), "providers": {"bank": model}}


RUNS = ("pay", "pay-by-text")


@pytest.fixture
def bank(tmp_path: Path) -> Iterator[TestClient]:
    """A client of the view over runs ``RUNS``, each paused for the approval of its
    transfer (call ``call_0_0``), at revision 2."""
    url = f"sqlite:///{tmp_path}/runs.db"

    async def paused() -> None:
        async with sk.Kernel(url, **agent()) as kernel:
            for run_id in RUNS:
                await kernel.start(model="bank/m", messages=["Pay Bob 50."], run_id=run_id)
                async for _ in kernel.run(run_id):
                    pass
                run = await kernel.get(run_id)
                assert run.pause is not None, run.state
                assert run.pause.reason == "approval"
                assert run.revision == 2

    asyncio.run(paused())
    with local_client(create_app(url, agent=agent())) as client:
        yield client


def revision_of(page: str) -> int:
    found = re.search(r'id="revision">([0-9]+)<', page)
    assert found is not None
    return int(found.group(1))


def wait_for_revision(client: TestClient, run_id: str, revision: int, wanted: str) -> None:
    """Until the run (driven by the view in the background) is at ``revision`` in the
    state ``wanted``."""
    deadline = time.monotonic() + 30
    while True:
        page = client.get(f"/runs/{run_id}").text
        state = re.search(r'id="state">([a-z_]+)<', page)
        assert state is not None
        now = (revision_of(page), state.group(1))
        if now == (revision, wanted):
            return
        assert now[0] <= revision, f"{run_id} went past revision {revision}: {now}"
        assert time.monotonic() < deadline, f"{run_id} stays at {now}, not {revision}"
        time.sleep(0.05)


NO_VALUE = (
    "no value given: type the value the run waits for (JSON or text), or tick 'resume "
    "without a value' (a hook that reads it, such as an approval, pauses the run again)"
)


def test_the_resume_form_has_an_explicit_box_for_no_value(bank: TestClient) -> None:
    page = bank.get("/runs/pay").text
    form = re.search(r'<form class="resume".*?</form>', page, re.S)
    assert form is not None
    assert '<textarea name="value"' in form.group(0)
    box = re.search(r'<input type="checkbox" name="no_value"[^>]*>', form.group(0))
    assert box is not None
    assert "checked" not in box.group(0)
    assert "resume without a value" in form.group(0)


@pytest.mark.parametrize("value", [None, "", "   \n"])
def test_an_empty_resume_is_refused_and_the_run_stays_paused(
    bank: TestClient, value: str | None
) -> None:
    form = {} if value is None else {"value": value}
    refused = post(bank, "pay", "resume", **form)
    assert refused.status_code == 400
    assert NO_VALUE in html.unescape(refused.text)
    assert "Traceback" not in refused.text
    unticked = post(bank, "pay", "resume", no_value="off", **form)
    assert unticked.status_code == 400
    page = bank.get("/runs/pay").text
    assert revision_of(page) == 2, "nothing was committed"
    assert state_of(bank, "pay") == "paused"


def test_a_value_and_the_no_value_box_together_are_refused(bank: TestClient) -> None:
    both = post(bank, "pay", "resume", value='{"approve": "call_0_0"}', no_value="on")
    assert both.status_code == 400
    said = "a value and 'resume without a value' both given: clear one of them"
    assert said in html.unescape(both.text)
    assert revision_of(bank.get("/runs/pay").text) == 2
    assert state_of(bank, "pay") == "paused"


def test_resume_without_a_value_when_the_box_is_ticked(bank: TestClient) -> None:
    done = post(bank, "pay", "resume", no_value="on")
    assert done.status_code == 303
    assert done.headers["location"].startswith("/runs/pay?note=resumed+without+a+value")
    # resumed (revision 3), and the approval hook, given no approval, pauses it again
    wait_for_revision(bank, "pay", 4, "paused")
    assert "sent 50 to Bob" not in bank.get("/runs/pay").text


@pytest.mark.parametrize(
    ("run_id", "value"),
    [("pay", '{"approve": "call_0_0"}'), ("pay-by-text", "approve call_0_0")],
)
def test_a_value_json_or_text_reaches_the_hooks(bank: TestClient, run_id: str, value: str) -> None:
    done = post(bank, run_id, "resume", value=value)
    assert done.status_code == 303
    assert done.headers["location"].startswith(f"/runs/{run_id}?note=resumed")
    wait_for_state(bank, run_id, "completed")
    page = bank.get(f"/runs/{run_id}").text
    assert "sent 50 to Bob" in page
    assert "Sent." in page
