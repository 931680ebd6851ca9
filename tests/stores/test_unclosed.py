"""A SQLite store never closed: the process still exits, and the store says so."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

from statekernel._storage.closing import Closing
from statekernel.stores import SQLiteStore, open_store

HUNG = 120.0
"""Seconds after which a program that should have exited is taken for hung."""


def test_an_unclosed_sqlite_store_lets_the_process_exit(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, sys
            from statekernel.stores import open_store

            async def main():
                store = open_store(sys.argv[1])
                print(len((await store.list_runs()).runs), flush=True)

            asyncio.run(main())
            """
        )
    )
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    try:
        done = subprocess.run(
            [sys.executable, str(script), url], capture_output=True, text=True, timeout=HUNG
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the program never exited: {exc.stderr!r}")
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr


async def test_a_store_collected_unclosed_warns_and_ends_its_thread(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    before = set(threading.enumerate())
    store = SQLiteStore(url)
    await store.list_runs()
    (thread,) = set(threading.enumerate()) - before
    assert thread.daemon
    del store
    with pytest.warns(ResourceWarning, match=rf"unclosed SQLiteStore '{url}'"):
        gc.collect()
    thread.join(timeout=HUNG)
    assert not thread.is_alive()


async def test_a_closed_store_ends_its_thread_without_warning(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    store = SQLiteStore(f"sqlite:///{tmp_path / 'runs.db'}")
    await store.list_runs()
    (thread,) = set(threading.enumerate()) - before
    await store.aclose()
    thread.join(timeout=HUNG)
    assert not thread.is_alive()
    gc.collect()  # what earlier tests of this process left is collected (and warns) first
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del store
        gc.collect()
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


async def test_async_with_closes_the_store_and_its_thread(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    before = set(threading.enumerate())
    async with SQLiteStore(url) as store:
        assert (await store.list_runs()).runs == ()
        (thread,) = set(threading.enumerate()) - before
    thread.join(timeout=HUNG)
    assert not thread.is_alive()
    del store
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        gc.collect()  # closed: nothing to warn about


async def test_every_store_is_an_async_context_manager(every_store_url: str) -> None:
    store = open_store(every_store_url)
    assert isinstance(store, Closing)
    async with store as entered:
        assert entered is store
        assert (await store.list_runs()).runs == ()
    await store.aclose()  # closing again does nothing
