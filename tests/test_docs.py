"""The docs site (``docs/``, ``mkdocs.yml``): it builds with warnings as errors, every
code block in it runs as pasted or says why it cannot, and the reference pages name what
the code has."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import statekernel
from statekernel import errors
from statekernel._records.events import LIVE_EVENTS, PERSISTED_EVENTS

from .markdown_blocks import ROOT, Block, blocks, openai_url, params, run_block

__all__ = ["openai_url"]  # the fixture the blocks' tests use

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
BLOCKS = [block for page in [ROOT / "README.md", *PAGES] for block in blocks(page)]
OTHER_STORED_EVENTS = {"context_updated", "tool_call_resolved", "run_forked"}


def test_the_docs_have_pages_and_runnable_blocks() -> None:
    assert len(PAGES) >= 25
    assert sum(block.runs for block in BLOCKS if block.path != ROOT / "README.md") >= 8


def test_every_block_runs_or_says_why_not() -> None:
    unmarked = [
        block.id
        for block in BLOCKS
        if not block.runs and block.marker is None and block.lang != "mermaid"
    ]
    assert not unmarked, f"mark these <!-- not run: REASON --> or make them python: {unmarked}"
    fragments = [b.id for b in BLOCKS if b.marker == "fragment" and b.lang != "python"]
    assert not fragments, f"'fragment' is for python blocks; use 'not run' for {fragments}"


def test_blocks_in_lists_admonitions_and_tilde_fences_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "1. In a list:\n\n"
        "    <!-- not run: an example -->\n"
        "    ```bash\n    echo hi\n      indented\n    ```\n\n"
        '!!! note\n    ```python\n    print("in a note")\n    ```\n\n'
        "~~~python\nprint(1)\n~~~\n"
    )
    found = [(b.line, b.lang, b.code, b.marker) for b in blocks(page)]
    assert found == [
        (4, "bash", "echo hi\n  indented\n", "not run"),
        (10, "python", 'print("in a note")\n', None),
        (14, "python", "print(1)\n", None),
    ]


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(DOCS)) for p in PAGES if str(p.relative_to(DOCS)) not in nav]
    assert not missing


def test_the_site_shows_the_generated_lifecycle_diagram() -> None:
    page = (DOCS / "concepts" / "lifecycle.md").read_text()
    assert '```mermaid\n--8<-- "diagrams/run_lifecycle.mmd"\n```' in page
    assert "../assets/run_lifecycle.svg" in page


def test_the_error_tree_page_draws_statekernel_errors() -> None:
    page = (DOCS / "reference" / "errors.md").read_text()
    tree = page.split("```text\n", 1)[1].split("```", 1)[0]
    drawn: dict[str, str] = {}
    stack: list[str] = []
    for line in tree.splitlines():
        name = re.sub(r" \(.*\)$", "", line.lstrip("│├└─ "))
        depth = (len(line) - len(line.lstrip("│├└─ "))) // 4
        del stack[depth:]
        drawn[name] = stack[-1] if stack else "Exception"
        stack.append(name)
    actual = {name: getattr(errors, name).__bases__[0].__name__ for name in errors.__all__}
    assert drawn == actual


def test_the_events_page_names_every_event_type() -> None:
    page = (DOCS / "reference" / "events.md").read_text()
    named = set(re.findall(r"^\| `(\w+)` \|", page, re.M))
    assert named == PERSISTED_EVENTS | LIVE_EVENTS | OTHER_STORED_EVENTS


@pytest.mark.parametrize("block", params([b for b in BLOCKS if b.path != ROOT / "README.md"]))
def test_a_docs_block_runs_as_pasted(
    block: Block, tmp_path: Path, openai_url: str, request: pytest.FixtureRequest
) -> None:
    run_block(block, tmp_path, openai_url, request)


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is missing: pip install -e '.[docs]'")
        pytest.skip("mkdocs is missing (pip install -e '.[docs]')")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    api = (site / "reference" / "stores" / "index.html").read_text()
    assert "SQLiteStore" in api
    assert ":class:" not in api
    assert statekernel.Kernel.__name__ in (site / "reference" / "api" / "index.html").read_text()
    assert "runs resume" in (site / "reference" / "cli" / "index.html").read_text()
    assert (site / "assets" / "run_lifecycle.svg").exists()
