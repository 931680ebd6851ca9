"""The view cannot be framed by another site's page (clickjacking), in a real browser:
headless Chromium (the system's ``chromium``, driven by Playwright), already holding
the view's cookie, opens a page of another origin (the same host, another port) that
frames the run page of a failed run, and clicks where that page's retry button is.
Chromium refuses to show the view in the frame (``X-Frame-Options: DENY``,
``frame-ancestors 'none'``) and says so, and the run is still failed; the same click on
the run page itself retries it (the button the frame would have offered acts)."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

import statekernel as sk
from statekernel.errors import AuthenticationFailed
from statekernel.stores import open_store
from statekernel.testing import Fail, ScriptedProvider
from statekernel.web import create_app

from .serving import served

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium on PATH (Debian: apt-get install chromium); .ci/run installs it",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None,
        reason="playwright is not installed (pip install -e '.[test]')",
    ),
]

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]

WIDTH, HEIGHT = 1000, 900
"""The frame's size, and the viewport of the page the retry button is measured on."""


async def failed_run(url: str) -> sk.Run:
    """The run ``broken`` in the store at ``url``, failed (the model refused the key)."""
    model = ScriptedProvider([Fail(AuthenticationFailed("no API key: set THE_KEY"))])
    async with sk.Kernel(url, providers={"broken": model}) as kernel:
        await kernel.start(model="broken/m", messages=["go"], run_id="broken")
        async for _ in kernel.run("broken"):
            pass
        return await kernel.get("broken")


def stored(url: str) -> sk.Run:
    """The run ``broken`` as the store holds it (read in a thread of its own: the
    browser's driver runs an event loop in this one)."""

    async def load() -> sk.Run:
        store = open_store(url)
        try:
            return await store.load("broken")
        finally:
            await store.aclose()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, load()).result()


def framing_app(target: str) -> Starlette:
    """Another site: one page framing ``target`` at its top left corner, the size of
    ``WIDTH`` x ``HEIGHT``, noting on ``window.frameLoaded`` that the frame loaded."""

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(
            "<!doctype html><html><head><title>win a prize</title></head>"
            '<body style="margin:0">'
            f'<iframe name="view" src="{target}" width="{WIDTH}" height="{HEIGHT}" '
            'style="border:0;display:block" onload="window.frameLoaded = true"></iframe>'
            "</body></html>"
        )

    return Starlette(routes=[Route("/", page)])


def test_another_site_framing_a_run_page_gets_nothing_to_click(tmp_path: Path) -> None:
    from playwright.sync_api import ConsoleMessage, expect, sync_playwright

    url = f"sqlite:///{tmp_path}/runs.db"
    before = asyncio.run(failed_run(url))
    assert before.state == "failed", before.state
    agent: dict[str, Any] = {"providers": {"broken": ScriptedProvider(["recovered"])}}
    with (
        served(create_app(url, agent=agent)) as base,
        served(framing_app(f"{base}/runs/broken")) as other,
        sync_playwright() as playwright,
    ):
        assert other.rsplit(":", 1)[0] == base.rsplit(":", 1)[0]  # the same host
        assert other != base  # another port: another origin, the same site
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
            context.set_default_timeout(30_000)
            expect.set_options(timeout=30_000)

            # the operator's own tab: the view's cookie, and where its retry button is
            own = context.new_page()
            own.goto(f"{base}/runs/broken")
            expect(own.locator("#state")).to_have_text("failed")
            retry = own.locator("button", has_text="retry from")
            expect(retry).to_be_visible()
            box = retry.bounding_box()
            assert box is not None
            x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2

            def refusal(message: ConsoleMessage) -> bool:
                text = message.text
                return base in text and ("frame-ancestors" in text or "X-Frame-Options" in text)

            attacker = context.new_page()
            with attacker.expect_console_message(refusal) as reported:
                attacker.goto(f"{other}/")
                attacker.wait_for_function("window.frameLoaded === true")
                frame = attacker.frame(name="view")
                assert frame is not None
                assert not frame.url.startswith(base), f"the view was shown in a frame: {frame.url}"
                assert frame.locator("#state").count() == 0
                assert frame.locator("form").count() == 0
                assert "retry from" not in frame.content()

                attacker.mouse.click(x, y)  # where the frame would show the retry button
                frame = attacker.frame(name="view")
                assert frame is not None
                assert not frame.url.startswith(base), f"the click opened the view: {frame.url}"
            said = reported.value.text
            assert "frame-ancestors 'none'" in said or "'X-Frame-Options' to 'deny'" in said, said

            after = stored(url)
            assert after.state == "failed", "the framed click acted"
            assert after.revision == before.revision

            # the button the frame would have offered acts on the view's own page
            own.mouse.click(x, y)
            expect(own.locator(".note")).to_contain_text("retried")
            expect(own.locator("#state")).to_have_text("completed")
            assert stored(url).state == "completed"
        finally:
            browser.close()
