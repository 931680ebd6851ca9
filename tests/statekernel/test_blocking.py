"""KernelThread: a kernel on a loop of its own thread, called from sync code."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

import statekernel as sk
from statekernel.blocking import KernelThread
from statekernel.errors import InvalidArgument, RunNotFound, StatekernelError
from statekernel.testing import Fail, ScriptedProvider


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
    with pytest.raises(InvalidArgument, match="must return a Kernel"):
        KernelThread(lambda: "memory://", name="failing-start")  # type: ignore[arg-type, return-value]
    # (its own name: the count of all threads moves with whatever else the process runs)
    left = [t for t in threading.enumerate() if t.name == "failing-start"]
    assert not left, "a failed start leaves no thread"


def test_close_ends_a_call_still_running_instead_of_leaving_it_waiting() -> None:
    blocking = KernelThread(lambda: _maker("memory://closing"))
    entered = threading.Event()
    outcome: list[BaseException | object] = []

    async def forever(kernel: sk.Kernel) -> None:
        entered.set()
        await asyncio.Event().wait()  # never set: only close ends it

    def caller() -> None:
        try:
            outcome.append(blocking.call(forever))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert entered.wait(60)
    blocking.close()
    thread.join(60)
    assert not thread.is_alive(), "the call returned"
    (got,) = outcome
    assert isinstance(got, StatekernelError)
    assert "closed while the call ran" in str(got)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_is_told_to_make_its_own() -> None:
    with KernelThread(lambda: _maker("memory://forked")) as blocking:
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: no loop thread was copied; a call must not hang
            try:
                blocking.call(lambda k: k.get("missing"))
                said = b"no error"
            except StatekernelError as exc:
                said = str(exc).encode()
            except BaseException as exc:
                said = repr(exc).encode()
            os.write(writer, said)
            os._exit(0)
        os.close(writer)
        with os.fdopen(reader, "rb") as pipe:
            heard = pipe.read().decode()
        os.waitpid(pid, 0)
        assert "before a fork" in heard, heard
        with pytest.raises(RunNotFound):  # the parent's goes on working
            blocking.call(lambda k: k.get("missing"))


def test_a_calls_own_cancellation_is_not_taken_for_a_close() -> None:
    import concurrent.futures

    with KernelThread(lambda: _maker("memory://cancelled")) as blocking:

        async def cancelled(kernel: sk.Kernel) -> None:
            raise asyncio.CancelledError

        with pytest.raises(concurrent.futures.CancelledError):
            blocking.call(cancelled)
        with pytest.raises(RunNotFound):  # and it goes on serving
            blocking.call(lambda k: k.get("missing"))


def test_drive_raises_on_failure_when_asked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    refusing = ScriptedProvider([Fail(ValueError("the model is down"), times=2)])

    def make() -> sk.Kernel:
        return sk.Kernel(url, providers={"refusing": refusing})

    with KernelThread(make) as blocking:
        run = blocking.call(lambda k: k.start(model="refusing/m", messages=["Hi"]))
        assert blocking.drive(run.run_id).state == "failed"  # by default: the run, failed
        blocking.call(lambda k: k.retry(run.run_id))
        with pytest.raises(sk.RunFailed, match="the model is down") as failed:
            blocking.drive(run.run_id, raise_on_failure=True)
        assert failed.value.run_id == run.run_id
