"""The web view's pages: the runs list, a run's page, time travel, escaping, damage."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from statekernel._lifecycle.diagram import can_render_svg
from statekernel.stores import open_store
from statekernel.testing import SQLiteRecords
from statekernel.web import create_app

from .clients import local_client
from .runs_made import make_runs
from .web_agent import kernel_options


def ids_listed(html: str) -> list[str]:
    """The run ids of a list page's table, in order."""
    return re.findall(r'<td><a href="[^"]*/runs/([^"]+)">', html)


def test_the_list_shows_runs_newest_first_with_what_they_wait_for(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert ids_listed(page.text) == ["uncertain", "chat", "injected", "asking"]
    assert "waiting for" in page.text
    assert "input_required: ask_user asks &#39;How many seats?&#39;" in page.text
    assert "uncertain_tool_calls: calls call_0_0 (book)" in page.text


def test_the_list_filters_by_state_and_searches_by_id(client: TestClient) -> None:
    assert ids_listed(client.get("/?state=paused").text) == ["uncertain", "asking"]
    assert ids_listed(client.get("/?state=completed").text) == ["chat", "injected"]
    assert ids_listed(client.get("/?q=ask").text) == ["asking"]
    assert ids_listed(client.get("/?q=chat").text) == ["chat"]
    assert ids_listed(client.get("/?q=c&state=completed").text) == ["chat", "injected"]
    nothing = client.get("/?q=nobody")
    assert ids_listed(nothing.text) == []
    assert "no runs" in nothing.text


def test_the_list_pages_with_a_cursor(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/many.db"

    async def many() -> None:
        import statekernel as sk

        async with sk.Kernel(url, **kernel_options()) as kernel:
            for n in range(55):
                await kernel.start(model="chat/m", run_id=f"run-{n:02d}")

    asyncio.run(many())
    with local_client(create_app(url)) as client:
        first = client.get("/")
        listed = ids_listed(first.text)
        assert len(listed) == 50
        assert listed[0] == "run-54"
        found = re.search(r'rel="next" href="([^"]+)"', first.text)
        assert found is not None
        second = client.get(found.group(1).replace("&amp;", "&"))
        assert ids_listed(second.text) == [f"run-{n:02d}" for n in range(4, -1, -1)]
        assert 'rel="next"' not in second.text
        assert "first page" in second.text


def test_a_run_page_shows_header_transcript_events_and_timeline(client: TestClient) -> None:
    page = client.get("/runs/injected")
    assert page.status_code == 200
    text = page.text
    assert 'id="state">completed<' in text
    assert "inject/m" in text
    assert "looked it up" in text  # the assistant's answer
    assert "&rarr; lookup" in text  # the tool call, with its arguments
    assert "run_completed" in text  # the events
    assert "turn 0" in text
    assert "turn 1" in text
    assert "model " in text
    assert " s · tools " in text


def test_run_text_is_escaped(client: TestClient) -> None:
    """A tool result holding markup is shown as text, never run as a script."""
    text = client.get("/runs/injected").text
    assert "<script>window.pwned" not in text
    assert "<b>bold?</b>" not in text
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;&lt;b&gt;bold?&lt;/b&gt;" in text
    assert "<i>x</i>" not in text  # the call's arguments too
    for revision in range(5):  # and every revision's diff
        assert "<script>window" not in client.get(f"/runs/injected?revision={revision}").text


def test_uncertain_calls_are_flagged_and_questions_get_a_form(client: TestClient) -> None:
    uncertain = client.get("/runs/uncertain").text
    assert "uncertain: may or may not have run" in uncertain
    assert "Check the outside world first" in uncertain
    assert 'name="call_id" value="call_0_0"' in uncertain
    asking = client.get("/runs/asking").text
    assert "How many seats?" in asking
    assert '<input type="number" name="value" min="1" required>' in asking


def test_time_travel_shows_a_revision_and_its_change(client: TestClient) -> None:
    head = client.get("/runs/asking").text
    assert "time travel" in head
    then = client.get("/runs/asking?revision=1")
    assert then.status_code == 200
    assert "As it was at revision 1" in then.text
    assert "--- revision 0" in then.text
    assert "+++ revision 1" in then.text
    assert "How many seats?" not in then.text.split("As it was")[1].split("Events")[0]
    first = client.get("/runs/asking?revision=0").text
    assert "--- nothing" in first
    missing = client.get("/runs/asking?revision=99")
    assert missing.status_code == 404
    assert "has no revision 99" in missing.text


def test_an_unknown_run_is_a_404_page(client: TestClient) -> None:
    page = client.get("/runs/nobody")
    assert page.status_code == 404
    assert "nobody" in page.text
    assert "Traceback" not in page.text


def test_the_diagram_highlights_the_run_path(client: TestClient) -> None:
    page = client.get("/runs/asking").text
    answer = client.get("/runs/asking/diagram.svg")
    if not can_render_svg():
        assert "needs Graphviz" in page
        assert answer.status_code == 503
        return
    assert 'src="/runs/asking/diagram.svg' in page
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "image/svg+xml"
    assert b"run asking: paused at revision 3" in answer.content


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not on PATH")
def test_the_diagram_is_drawn_with_dot(client: TestClient) -> None:
    assert client.get("/runs/chat/diagram.svg").content.startswith(b"<?xml")


def test_a_damaged_run_is_shown_as_damaged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))

    async def damage() -> None:
        store = open_store(url)
        raw = SQLiteRecords()
        try:
            records = await raw.read(store, "chat")
            key = min(k for k in records if k[0] == "message")
            data = records[key]
            middle = len(data) // 2
            flipped = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
            await raw.write(store, "chat", key, flipped)
        finally:
            await store.aclose()

    asyncio.run(damage())
    with local_client(create_app(url)) as client:
        page = client.get("/runs/chat")
        assert page.status_code == 200
        assert "damaged" in page.text
        assert "statekernel doctor" in page.text
        assert "Traceback" not in page.text
        assert client.get("/").status_code == 200


def test_without_an_agent_the_view_is_read_only_and_says_why(reader: TestClient) -> None:
    page = reader.get("/runs/asking").text
    assert "read-only: no agent was given" in page
    assert "--agent package.module:function" in page
    assert "/runs/asking/answer" not in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is None  # no form at all
    refused = reader.post("/runs/asking/retry", data={"csrf_token": "x"})
    assert refused.status_code == 403


def test_no_secret_is_rendered(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"

    async def start() -> None:
        import statekernel as sk

        async with sk.Kernel(url, **kernel_options()) as kernel:
            text = "use postgresql://app:hunter2@db.internal/app please"
            await kernel.start(model="chat/m", messages=[text], run_id="secret")

    asyncio.run(start())
    with local_client(create_app(url)) as client:
        page = client.get("/runs/secret").text
        assert "hunter2" not in page
        assert "postgresql://app:***@db.internal/app" in page
        assert "hunter2" not in client.get("/runs/secret?revision=0").text


def test_a_secret_in_pause_details_is_not_rendered(tmp_path: Path) -> None:
    import statekernel as sk
    from statekernel.testing import ScriptedProvider, call

    url = f"sqlite:///{tmp_path}/runs.db"
    dsn = "postgresql://app:hunter2@db.internal/app"

    @sk.tool
    def connect(dsn: str) -> str:
        """Connect."""
        return "ok"

    class Gate(sk.Hooks):
        def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> sk.Pause:
            return sk.Pause("approval", {"input": call.input})

    async def paused() -> None:
        model = ScriptedProvider([call("connect", {"dsn": dsn}), "Done."])
        providers = {"scripted": model}
        async with sk.Kernel(url, tools=[connect], hooks=Gate(), providers=providers) as kernel:
            run = await kernel.start(model="scripted/m", messages=["Go."], run_id="gated")
            async for _ in kernel.run(run.run_id):
                pass

    asyncio.run(paused())
    agent = {"tools": [connect], "hooks": Gate()}  # with actions: the pause's form shows it
    with local_client(create_app(url, agent=agent)) as client:
        page = client.get("/runs/gated").text
        assert "hunter2" not in page
        assert "postgresql://app:***@db.internal/app" in page


def test_error_text_is_never_html(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    with local_client(create_app(url)) as client:
        bad = "<img src=x onerror=alert(1)>"
        answer = client.get(f"/runs/{bad}/diagram.svg")
        assert answer.status_code == 404
        assert not answer.headers["content-type"].startswith("text/html")


@pytest.mark.postgres
def test_a_view_without_an_agent_upgrades_no_postgres_schema(postgres_store_url: str) -> None:
    from statekernel.stores.postgres._url import parse_postgres_url

    from ...conftest import pg_admin, pg_value

    target = parse_postgres_url(postgres_store_url)

    with local_client(create_app(postgres_store_url)) as client:
        page = client.get("/")
        assert "no store" in page.text  # said, not a traceback
        assert "Traceback" not in page.text
    table = f'"{target.schema}".statekernel_schema'
    assert pg_value(target.dsn, f"SELECT to_regclass('{table}')") is None, "nothing created"

    asyncio.run(make_runs(postgres_store_url))
    pg_admin(target.dsn, f"UPDATE {table} SET version = 2")  # as an older release left it
    with local_client(create_app(postgres_store_url)) as client:
        listed = client.get("/").text
        assert "asking" in listed
        assert client.get("/runs/asking").status_code == 200
    assert pg_value(target.dsn, f"SELECT max(version) FROM {table}") == 2, "not upgraded"


def test_a_run_page_shows_the_typed_output(tmp_path: Path) -> None:
    import statekernel as sk
    from statekernel.testing import ScriptedProvider

    url = f"sqlite:///{tmp_path}/runs.db"
    schema = {"title": "Verdict", "type": "object", "required": ["ok"]}

    async def typed() -> None:
        providers = {"scripted": ScriptedProvider(["{}", '{"ok": "<b>yes</b>"}'])}
        async with sk.Kernel(url, providers=providers) as kernel:
            async for _ in kernel.start_and_run(
                model="scripted/m", messages=["Go."], run_id="typed", output_type=schema
            ):
                pass

    asyncio.run(typed())
    with local_client(create_app(url)) as client:
        page = client.get("/runs/typed").text
        assert "output type" in page
        assert "Verdict (retries 1)" in page  # the answer sent back once was reset
        assert "&lt;b&gt;yes&lt;/b&gt;" in page  # the output, escaped
        assert "<b>yes</b>" not in page


def test_a_run_page_shows_when_its_pause_times_out(tmp_path: Path) -> None:
    import statekernel as sk
    from statekernel.testing import ScriptedProvider, call

    url = f"sqlite:///{tmp_path}/runs.db"
    ask = sk.ask_user(timeout=3600, on_timeout="<i>nobody</i>")

    async def paused() -> None:
        providers = {"scripted": ScriptedProvider([call("ask_user", {"question": "?"})])}
        async with sk.Kernel(url, tools=[ask], providers=providers) as kernel:
            run = await kernel.start(model="scripted/m", messages=["Go."], run_id="asking")
            async for _ in kernel.run(run.run_id):
                pass

    asyncio.run(paused())
    with local_client(create_app(url)) as client:
        page = client.get("/runs/asking").text
        assert "times out" in page
        assert "&#34;&lt;i&gt;nobody&lt;/i&gt;&#34;" in page or "&lt;i&gt;nobody" in page
        assert "<i>nobody</i>" not in page
