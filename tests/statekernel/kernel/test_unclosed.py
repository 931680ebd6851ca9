"""A program that never closes its kernel still exits, and is told what it left open.

Each program runs in a real subprocess; the timeout is generous and only fails a
process that hangs.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HUNG = 120.0
"""Seconds after which a program that should have exited is taken for hung."""

PROGRAM = """
import asyncio, sys
import statekernel as sk
from statekernel.testing import ScriptedProvider

async def main():
    kernel = sk.Kernel(sys.argv[1], providers={"scripted": ScriptedProvider(["hello"])})
    if sys.argv[2] != "unused":
        run = await kernel.start(model="scripted/x", messages=["go"], run_id="r1")
        async for event in kernel.run(run.run_id):
            pass
        print("completed", flush=True)
    if sys.argv[2] == "raise":
        raise RuntimeError("the program fails after building its kernel")

asyncio.run(main())
"""


def run_program(tmp_path: Path, url: str, mode: str) -> subprocess.CompletedProcess[str]:
    """Run ``PROGRAM`` (ResourceWarnings shown); fail when it does not exit."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM))
    command = [sys.executable, "-W", "always::ResourceWarning", str(script), url, mode]
    try:
        return subprocess.run(
            command, cwd=tmp_path, capture_output=True, text=True, timeout=HUNG, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the program never exited ({mode}, {url}): {exc.stderr!r}")


async def stored_state(url: str) -> str:
    from statekernel.stores import open_store

    store = open_store(url)
    try:
        return (await store.load("r1")).state
    finally:
        await store.aclose()


@pytest.mark.parametrize("mode", ["return", "raise"])
def test_an_unclosed_sqlite_kernel_lets_the_process_exit(tmp_path: Path, mode: str) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    done = run_program(tmp_path, url, mode)
    assert done.stdout == "completed\n", done.stderr
    if mode == "raise":
        assert done.returncode == 1
        assert "RuntimeError: the program fails after building its kernel" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
    assert "ResourceWarning: unclosed Kernel" in done.stderr
    assert f"SQLiteStore({url!r})" in done.stderr
    assert asyncio.run(stored_state(url)) == "completed"  # nothing committed was lost


def test_the_warning_never_shows_a_password(tmp_path: Path) -> None:
    url = "redis://user:s3cret-Pw@127.0.0.1:1/0"  # never connected to
    done = run_program(tmp_path, url, "unused")
    assert done.returncode == 0, done.stderr
    assert "unclosed Kernel" in done.stderr
    assert "redis://user:***@127.0.0.1:1/0" in done.stderr
    assert "s3cret-Pw" not in done.stderr


def test_a_closed_kernel_does_not_warn(tmp_path: Path) -> None:
    script = tmp_path / "closed.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, sys
            import statekernel as sk

            async def main():
                async with sk.Kernel(sys.argv[1]) as kernel:
                    await kernel.store.list_runs()

            asyncio.run(main())
            """
        )
    )
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    command = [sys.executable, "-W", "error::ResourceWarning", str(script), url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=HUNG, check=False)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr
