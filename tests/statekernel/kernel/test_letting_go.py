"""A drive gives the run's lease up with the commit that brings the run to rest
(``ReleasesWithCommit``), without a release of its own, on every store; a store without
it releases after the last commit as before."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest

import statekernel as sk
from statekernel.stores import CheckpointStore, Lease, ReleasesWithCommit, StoreWrapper, open_store
from statekernel.testing import Reply, ScriptedProvider, call


@sk.tool
def note(text: str) -> str:
    """Write a note."""
    return f"noted {text}"


def script() -> list[Reply]:
    return [Reply(tool_calls=(call("note", {"text": "a"}),)), Reply("done")]


def counting(store: CheckpointStore) -> Counter[str]:
    """Count the store's ``release`` and ``commit_and_release`` calls (its own methods,
    wrapped on the instance)."""
    calls: Counter[str] = Counter()
    for name in ("release", "commit_and_release"):
        method = getattr(store, name, None)
        if method is None:
            continue

        def wrapped(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
            calls[_name] += 1
            return _method(*args, **kw)

        setattr(store, name, wrapped)
    return calls


async def test_a_run_at_rest_gives_its_lease_up_with_its_last_commit(every_store_url: str) -> None:
    if every_store_url == "memory://":  # a name, so that the other kernel's store shares it
        every_store_url = f"memory://letting-go-{uuid.uuid4().hex}"
    store = open_store(every_store_url)
    calls = counting(store)
    kernel = sk.Kernel(store, tools=[note], providers={"scripted": ScriptedProvider(script())})
    other = sk.Kernel(every_store_url, busy_timeout=0, providers={"scripted": ScriptedProvider([])})
    try:
        run = await kernel.start(model="scripted/m", messages=["go"])
        kinds = [e.type async for e in kernel.run(run.run_id) if e.persisted]
        assert kinds[-1] == "run_completed"
        if isinstance(store, ReleasesWithCommit):
            assert calls == {"commit_and_release": 1}, calls
        else:
            assert calls == {"release": 1}, calls
        assert not kernel.holds(run.run_id)
        # another process's kernel takes the run at once (busy_timeout=0: RunBusy if held)
        await other.send(run.run_id, "and now?")
        assert (await kernel.get(run.run_id)).state == "preparing_turn"
    finally:
        await other.aclose()
        await kernel.aclose()
        await store.aclose()


class NoRelease(StoreWrapper):
    """A store that cannot give a lease up with a commit (a wrapper declares only what
    it forwards)."""


async def test_without_it_the_lease_is_released_after_the_last_commit() -> None:
    store = NoRelease(open_store("memory://"))
    assert not isinstance(store, ReleasesWithCommit)
    released: list[Lease] = []
    inner_release = store.release

    async def release(lease: Lease) -> None:
        released.append(lease)
        await inner_release(lease)

    store.release = release  # type: ignore[method-assign]
    kernel = sk.Kernel(store, tools=[note], providers={"scripted": ScriptedProvider(script())})
    try:
        run = await kernel.start(model="scripted/m", messages=["go"])
        async for _ in kernel.run(run.run_id):
            pass
        assert [lease.run_id for lease in released] == [run.run_id]
        assert (await kernel.get(run.run_id)).state == "completed"
    finally:
        await kernel.aclose()


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
async def test_a_command_at_the_rest_event_hands_the_drive_a_new_lease(
    url: str, tmp_path: Any
) -> None:
    """The caller sends new input while the drive's generator is suspended at its
    ``run_completed`` event: the lease went with that commit, so the command takes one
    and hands it to the drive, which goes on from the command's commit in the same loop
    (as it did when it kept the lease), and gives it up again at the next rest."""
    store_url = f"sqlite:///{tmp_path}/runs.db" if url == "sqlite" else url
    replies = [*script(), Reply("second answer")]
    store = open_store(store_url)
    calls = counting(store)
    kernel = sk.Kernel(store, tools=[note], providers={"scripted": ScriptedProvider(replies)})
    try:
        run = await kernel.start(model="scripted/m", messages=["go"])
        completed = 0
        async for event in kernel.run(run.run_id):
            if event.type == "run_completed":
                completed += 1
                if completed == 1:
                    await kernel.send(run.run_id, "once more")
        assert completed == 2, "the drive did not go on from the command's commit"
        done = await kernel.get(run.run_id)
        assert (done.state, done.output) == ("completed", "second answer")
        assert not kernel.holds(run.run_id)
        assert calls == {"commit_and_release": 2}, calls
    finally:
        await kernel.aclose()
        await store.aclose()


async def test_a_pause_with_a_call_still_running_keeps_the_lease_until_the_drive_ends() -> None:
    """An approval pause while another call of the turn runs: the pause's commit does not
    give the lease up (the running call's result is committed before the drive lets go)."""
    gate = asyncio.Event()

    @sk.tool
    async def slow(text: str) -> str:
        """Take a while."""
        await gate.wait()
        return text

    class Approve(sk.Hooks):
        def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> Any:
            return sk.Pause("approval") if call.name == "note" else None

    replies = [Reply(tool_calls=(call("slow", {"text": "s"}), call("note", {"text": "n"})))]
    store = open_store("memory://")
    calls = counting(store)
    kernel = sk.Kernel(
        store,
        tools=[note, slow],
        hooks=Approve(),
        providers={"scripted": ScriptedProvider(replies)},
    )
    try:
        run = await kernel.start(model="scripted/m", messages=["go"])
        drive = kernel.run(run.run_id)
        kinds: list[str] = []
        async for event in drive:
            if event.persisted:
                kinds.append(event.type)
            if event.type == "tool_call_started":
                gate.set()
        paused = await kernel.get(run.run_id)
        assert paused.state == "paused", kinds
        assert calls["release"] + calls["commit_and_release"] == 1, calls
        assert not kernel.holds(run.run_id)
    finally:
        await kernel.aclose()
        await store.aclose()
