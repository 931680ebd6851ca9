"""The web view in a real browser: headless Chromium (the system's ``chromium``, driven
by Playwright) opens the list, answers a paused run's question in its form, watches
the run complete live, and resolves an uncertain call, with nothing blocked by the
Content-Security-Policy. A screenshot of the run page
is written to the test's folder (and to ``$STATEKERNEL_WEB_SCREENSHOT`` when set)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from statekernel.web import create_app

from .runs_made import make_runs
from .serving import served
from .web_agent import kernel_options

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


def test_answer_a_question_watch_it_complete_and_resolve_a_call(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url = f"sqlite:///{tmp_path}/runs.db"
    asyncio.run(make_runs(url))
    with (
        served(create_app(url, agent=kernel_options())) as base,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(30_000)
            refused: list[str] = []  # what the Content-Security-Policy blocked
            page.on(
                "console",
                lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None,
            )
            expect.set_options(timeout=30_000)
            page.goto(base + "/")
            expect(page.locator("table.runs")).to_contain_text("asking")
            expect(page.locator("table.runs")).to_contain_text("input_required")

            page.click("text=asking")
            expect(page.locator("#state")).to_have_text("paused")
            expect(page.locator("form.answer")).to_contain_text("How many seats?")
            page.fill("form.answer input[name=value]", "2")
            page.click("form.answer button[type=submit]")
            expect(page.locator(".note")).to_contain_text("answered")
            expect(page.locator("#state")).to_have_text("completed")  # live, no reload
            expect(page.locator("section.transcript")).to_contain_text("booked for you")
            expect(page.locator("#events")).to_contain_text("run_completed")
            assert page.evaluate("window.pwned") is None
            shot = tmp_path / "web-view.png"
            # caret="initial": hiding the caret, older Playwright injects a style the
            # view's policy refuses (and reports), which is Playwright's, not the view's
            page.screenshot(path=str(shot), full_page=True, caret="initial")
            assert shot.stat().st_size > 10_000
            if target := os.environ.get("STATEKERNEL_WEB_SCREENSHOT"):
                shutil.copyfile(shot, target)

            page.goto(base + "/runs/injected")
            expect(page.locator("section.transcript")).to_contain_text("<script>window.pwned")
            assert page.evaluate("window.pwned") is None  # shown, never run

            page.goto(base + "/runs/uncertain")
            expect(page.locator(".said.uncertain").first).to_be_visible()
            expect(page.locator(".warning")).to_contain_text("may or may not have run")
            page.fill("form.resolve input[name=text]", '"booked 2"')
            # no choice made for the operator: the form is not sent until one is checked
            assert page.eval_on_selector("form.resolve", "f => f.checkValidity()") is False
            page.check("form.resolve input[name=how][value=output]")  # it ran and returned
            assert page.eval_on_selector("form.resolve", "f => f.checkValidity()") is True
            page.click("form.resolve button[type=submit]")
            expect(page.locator("#state")).to_have_text("completed")
            expect(page.locator("section.transcript")).to_contain_text("booked 2")
            assert refused == [], "the pages need nothing the policy forbids"
        finally:
            browser.close()
