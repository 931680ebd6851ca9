"""Ids and names are checked as a whole: a trailing newline is no part of a run id, a
queue name or a child run id, on every store (``"r1\\n"`` beside ``"r1"`` would be two
runs that print alike)."""

from __future__ import annotations

import re

import pytest

import statekernel as sk
from statekernel._storage.queues import RunQueues, checked_queue_name
from statekernel.errors import InvalidArgument
from statekernel.stores import Checkpoint, MemoryStore, open_store
from statekernel.testing import ScriptedProvider, call
from statekernel.testing._store_cases import sample_run

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
"""What a run id the kernel makes or takes looks like, as a whole."""


def _refusal_names(info: pytest.ExceptionInfo[InvalidArgument], value: str) -> None:
    assert repr(value) in str(info.value), f"{info.value} does not name {value!r}"


async def _run_ids(kernel: sk.Kernel) -> list[str]:
    return sorted(s.run_id for s in (await kernel.store.list_runs()).runs)


def test_the_queue_name_check_takes_the_whole_name() -> None:
    assert checked_queue_name("q") == "q"
    with pytest.raises(InvalidArgument) as info:
        checked_queue_name("q\n")
    _refusal_names(info, "q\n")


async def test_a_run_id_ending_in_a_newline_is_refused(every_store_url: str) -> None:
    kernel = sk.Kernel(every_store_url, providers={"scripted": ScriptedProvider([])})
    try:
        await kernel.start(model="scripted/m", messages=["go"], run_id="r1")
        with pytest.raises(InvalidArgument) as info:
            await kernel.start(model="scripted/m", messages=["go"], run_id="r1\n")
        _refusal_names(info, "r1\n")
        assert await _run_ids(kernel) == ["r1"]
    finally:
        await kernel.aclose()


async def test_a_queue_name_ending_in_a_newline_is_refused(every_store_url: str) -> None:
    store = open_store(every_store_url)
    try:
        await store.commit(Checkpoint.between(None, sample_run("r1")))
        if not isinstance(store, RunQueues):
            return  # no queues on this store: the name check above is all there is
        with pytest.raises(InvalidArgument) as info:
            await store.submit("r1", queue="q\n")
        _refusal_names(info, "q\n")
        with pytest.raises(InvalidArgument) as info:
            store.run_queue("q\n")
        _refusal_names(info, "q\n")
        queue = store.run_queue("q")
        try:
            await queue.prepare()
            assert await queue.waiting() == 0  # nothing was submitted anywhere
        finally:
            await queue.aclose()
    finally:
        await store.aclose()


async def test_a_child_id_ending_in_a_newline_is_refused(every_store_url: str) -> None:
    """A call id ending in a newline gives a child run id of the digest form, and a
    child run id ending in a newline given to ``start`` is refused."""
    derived = sk.child_run_id("lead-1", "d1\n")
    assert derived != "lead-1.d1\n"
    assert RUN_ID.fullmatch(derived)
    helper = sk.delegate("helper", "Help.", model="helper/small")
    providers = {
        "scripted": ScriptedProvider([call("helper", {"task": "t"}, id="d1\n"), "done"]),
        "helper": ScriptedProvider(["helped"]),
    }
    kernel = sk.Kernel(every_store_url, tools=[helper], providers=providers)
    try:
        await kernel.start(model="scripted/lead", messages=["go"], run_id="lead-1")
        async for _ in kernel.run("lead-1"):
            pass
        assert (await kernel.get("lead-1")).state == "completed"
        assert await _run_ids(kernel) == sorted(["lead-1", derived])
        with pytest.raises(InvalidArgument) as info:
            await kernel.start(
                model="scripted/lead",
                messages=["go"],
                run_id="lead-1.d1\n",
                parent_run_id="lead-1",
                parent_call_id="d1\n",
            )
        _refusal_names(info, "lead-1.d1\n")
        assert await _run_ids(kernel) == sorted(["lead-1", derived])
    finally:
        await kernel.aclose()


async def test_a_fork_to_an_id_ending_in_a_newline_is_refused() -> None:
    kernel = sk.Kernel(MemoryStore(), providers={"scripted": ScriptedProvider([])})
    try:
        await kernel.start(model="scripted/m", messages=["go"], run_id="r1")
        with pytest.raises(InvalidArgument) as info:
            await kernel.fork("r1", new_run_id="r2\n")
        _refusal_names(info, "r2\n")
    finally:
        await kernel.aclose()
