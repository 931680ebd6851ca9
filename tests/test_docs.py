"""The docs site (``docs/``, ``mkdocs.yml``): it builds with warnings as errors, every
code block in it runs as pasted or says why it cannot, and the reference pages name what
the code has.

Most pages' python blocks run one by one (``tests/markdown_blocks.py``). The pages of
``SESSIONS`` are walked through as a reader pastes them instead: their blocks run in
order in one folder, a block whose fence says ``title="NAME"`` is saved as that file, a
shell block runs in bash (``statekernel ui`` is served on a free port, read, and stopped
with Ctrl-C's signal), and every python process shows its ``ResourceWarning``s.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import statekernel
from statekernel import errors
from statekernel._records.events import LIVE_EVENTS, PERSISTED_EVENTS
from statekernel.testing._servers import free_port

from .markdown_blocks import HUNG, REDIS_PLACEHOLDER, ROOT, Block, blocks, openai_url, run_block

__all__ = ["openai_url"]  # the fixture the blocks' tests use

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
BLOCKS = [block for page in [ROOT / "README.md", *PAGES] for block in blocks(page)]
OTHER_STORED_EVENTS = {
    "context_updated",
    "tags_updated",
    "tool_call_resolved",
    "timer_fired",
    "run_forked",
}
FIRST_AGENT = DOCS / "first-agent.md"
SESSIONS = (FIRST_AGENT, DOCS / "guides" / "cli.md")
"""Pages run as one session each, in order (see above)."""
SHELLS = {"bash", "sh", "shell"}
TITLE = re.compile(r'\btitle="([^"]+)"')
REDIS_FIXTURE = "statekernel_redis_url"
"""The plugin's redis-server fixture: a block whose test takes it runs against the suite's
server (``REDIS_URL``), and is marked ``redis`` like the blocks that name a Redis host."""


def saved_as(block: Block) -> str | None:
    """The file name a block's fence gives it (``title="shop.py"``), if any."""
    fence = block.path.read_text().splitlines()[block.line - 1]
    found = TITLE.search(fence)
    return found.group(1) if found else None


def in_a_session(block: Block) -> bool:
    """Whether the session test of its page runs ``block`` (as a file or a command)."""
    return block.path in SESSIONS and block.marker is None


def needs_redis(block: Block) -> bool:
    return REDIS_PLACEHOLDER in block.code or REDIS_FIXTURE in block.code


def alone(found: list[Block]) -> list[object]:
    """pytest params of the blocks that run one by one (``redis``-marked where they need
    a Redis server)."""
    return [
        pytest.param(block, id=block.id, marks=[pytest.mark.redis] * needs_redis(block))
        for block in found
        if block.runs and block.path not in SESSIONS
    ]


def test_the_docs_have_pages_and_runnable_blocks() -> None:
    assert len(PAGES) >= 25
    assert sum(block.runs for block in BLOCKS if block.path != ROOT / "README.md") >= 8


def test_every_block_runs_or_says_why_not() -> None:
    unmarked = [
        block.id
        for block in BLOCKS
        if not block.runs
        and not in_a_session(block)
        and block.marker is None
        and block.lang != "mermaid"
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


def test_every_guide_runs_code() -> None:
    guides = sorted((DOCS / "guides").glob("*.md"))
    assert guides
    ran = {b.path for b in BLOCKS if (b.runs and b.path not in SESSIONS) or in_a_session(b)}
    assert [str(p.relative_to(DOCS)) for p in guides if p not in ran] == []


@pytest.mark.parametrize("block", alone([b for b in BLOCKS if b.path != ROOT / "README.md"]))
def test_a_docs_block_runs_as_pasted(
    block: Block,
    tmp_path: Path,
    openai_url: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if REDIS_FIXTURE in block.code:
        monkeypatch.setenv("REDIS_URL", request.getfixturevalue("redis_url"))
    run_block(block, tmp_path, openai_url, request)


# -- pages run as one session ---------------------------------------------------------


def session_env() -> dict[str, str]:
    """The environment of a session's commands: this Python's scripts first on PATH (its
    ``python``, ``statekernel``, ``pytest``), no statekernel settings, and every
    ``ResourceWarning`` shown (as ``-X dev`` shows them, without its slower asyncio)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEKERNEL_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONWARNINGS"] = "always::ResourceWarning"
    return env


def run_shell(block: Block, folder: Path, env: dict[str, str]) -> str:
    """Run a shell block in bash (stopping at the first failing command); its output."""
    with subprocess.Popen(
        ["bash", "-e", "-c", block.code],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as shell:
        try:
            out = shell.communicate(timeout=HUNG)[0]
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)  # the shell and what it started
            pytest.fail(f"{block.id}: the block never ended: {shell.communicate()[0]}")
    assert shell.returncode == 0, f"{block.id} exited {shell.returncode}:\n{out}"
    return out


def serve(block: Block, folder: Path, env: dict[str, str]) -> str:
    """Serve ``statekernel ui ...`` on a free port, once it answers read its runs list,
    then stop it with Ctrl-C's signal; the list page and what the command printed."""
    command = [*shlex.split(block.code, comments=True), "--port", str(free_port())]
    url = f"http://127.0.0.1:{command[-1]}/"
    with subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as server:
        try:
            page: str | None = None
            deadline = time.monotonic() + HUNG
            while page is None and server.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url, timeout=HUNG) as answer:
                        page = answer.read().decode()
                except urllib.error.URLError:  # not listening yet
                    time.sleep(0.05)
        finally:
            server.send_signal(signal.SIGINT)
            out = server.communicate(timeout=HUNG)[0]
    assert page is not None, f"{block.id}: the view never answered:\n{out}"
    return page + out


def run_session(page: Path, folder: Path) -> dict[str, str]:
    """Run ``page``'s blocks in order in ``folder``, as pasted; each block's output by id."""
    (folder / ".git").mkdir()  # the project's root: config is not looked for above it
    env = session_env()
    outputs: dict[str, str] = {}
    for block in blocks(page):
        if not in_a_session(block):
            continue
        name = saved_as(block)
        if name is not None:
            (folder / name).write_text(block.code)
        elif block.lang not in SHELLS:
            pytest.fail(f"{block.id}: give it a file name (title=) or mark it not run")
        elif block.code.startswith("statekernel ui"):
            outputs[block.id] = serve(block, folder, env)
        else:
            outputs[block.id] = run_shell(block, folder, env)
    for block_id, out in outputs.items():
        assert "ResourceWarning" not in out, f"{block_id}:\n{out}"
        assert "Traceback" not in out, f"{block_id}:\n{out}"
    return outputs


def test_the_first_agent_page_runs_as_pasted_kill_9_included(tmp_path: Path) -> None:
    outputs = list(run_session(FIRST_AGENT, tmp_path).values())
    # one charge per order, though each process died in the middle of its charge
    assert (tmp_path / "ledger.txt").read_text().splitlines() == [
        "order-1:call_1_0 2400",
        "order-2:call_1_0 2400",
    ]
    assert not (tmp_path / "bank-reply.txt").exists()  # so no charge ever returned

    async def read(run_id: str) -> tuple[statekernel.Run, list[str]]:
        async with statekernel.Kernel(f"sqlite:///{tmp_path / 'shop.db'}") as kernel:
            run = await kernel.get(run_id)
            events = await kernel.events(run_id)
        pauses = [e.data["reason"] for e in events if e.type == "run_paused"]
        return run, pauses

    for order in ("order-1", "order-2"):
        run, pauses = asyncio.run(read(order))
        assert (run.state, run.output) == ("completed", "Paid: 2 mugs, 24.00."), order
        assert pauses == ["approval", "uncertain_tool_calls"], order
    assert any("order-1" in out and "order-2" in out and "<html" in out for out in outputs)
    assert re.search(r"\b1 passed\b", outputs[-1]), outputs[-1]


def test_the_command_line_guide_runs_as_pasted(tmp_path: Path) -> None:
    out = "\n".join(run_session(DOCS / "guides" / "cli.md", tmp_path).values())
    assert "uncertain_tool_calls" in out
    assert "completed" in out


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is missing: pip install -e '.[docs]'")
        pytest.skip("mkdocs is missing (pip install -e '.[docs]')")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "PYTHONSAFEPATH": "1"},  # the installed package, not ./statekernel
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
