"""KernelThread: a kernel on a loop of its own thread, called from sync code."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import statekernel as sk
from statekernel.blocking import KernelThread
from statekernel.errors import InvalidArgument, RunNotFound, StatekernelError
from statekernel.testing import ScriptedProvider


def _maker(url: str) -> sk.Kernel:
    model = ScriptedProvider(["Hello."], repeat_last=True)
    return sk.Kernel(url, providers={"scripted": model})


def test_sync_code_drives_runs_from_several_threads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    done: list[str] = []
    with KernelThread(lambda: _maker(url)) as blocking:

        def one() -> None:
            run = blocking.call(lambda k: k.start(model="scripted/m", messages=["Hi"]))
            done.append(blocking.drive(run.run_id).state)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert done == ["completed"] * 4
        with pytest.raises(RunNotFound):  # the error of the coroutine, in this thread
            blocking.call(lambda k: k.get("missing"))
        thread = blocking._thread
    assert not thread.is_alive(), "close stops the loop's thread"
    with pytest.raises(StatekernelError, match="closed"):
        blocking.call(lambda k: k.get("missing"))
    blocking.close()  # again: nothing


def test_make_is_checked() -> None:
    with pytest.raises(InvalidArgument, match="callable"):
        KernelThread("memory://")  # type: ignore[arg-type]
    before = threading.active_count()
    with pytest.raises(InvalidArgument, match="must return a Kernel"):
        KernelThread(lambda: "memory://")  # type: ignore[arg-type, return-value]
    assert threading.active_count() == before, "a failed start leaves no thread"
