"""A long run holds each message once: its transcript and every turn's request share
their messages, live and loaded from every store, so its memory grows linearly."""

from __future__ import annotations

import gc
import tracemalloc

import attrs

import statekernel as sk
from statekernel._records.run import Run
from statekernel.stores import open_store
from statekernel.testing import ScriptedProvider, call


@sk.tool
def lookup(query: str, page: int) -> str:
    """About 1 KB of results for ``query``."""
    return f"page {page} of {query}: " + "result text " * 85


def _script(turns: int) -> list[object]:
    steps: list[object] = [
        call("lookup", {"query": f"question {t} " * 12, "page": t}) for t in range(1, turns)
    ]
    return [*steps, "done"]


async def _drive(url: str, turns: int) -> tuple[Run, sk.Kernel]:
    provider = ScriptedProvider(_script(turns))
    kernel = sk.Kernel(url, tools=[lookup], providers={"scripted": provider}, max_turns=None)
    run = await kernel.start(model="scripted/x", messages=["go"])
    async for _ in kernel.run(run.run_id):
        pass
    final = await kernel.store.load(run.run_id)
    assert final.state == "completed"
    return final, kernel


def _assert_shared(run: Run) -> None:
    """Every request sent the transcript as it was, as a view of the transcript's own
    buffer (no copy), and every answer is the transcript's message object."""
    assert len(run.turns) > 3
    for turn in run.turns:
        sent = turn.request.messages
        assert run.messages.shares_prefix(sent) == len(sent), f"turn {turn.index} copied"
        assert turn.result is not None
        assert turn.result.message is run.messages[len(sent)]


async def test_requests_share_the_transcript_live_and_loaded(every_store_url: str) -> None:
    live, kernel = await _drive(every_store_url, 12)
    _assert_shared(live)
    await kernel.aclose()
    if every_store_url == "memory://":
        return  # the store lives and dies with its kernel
    store = open_store(every_store_url)
    loaded = await store.load(live.run_id)
    await store.aclose()
    assert loaded == live
    _assert_shared(loaded)


async def test_a_request_a_hook_extends_shares_the_transcript_and_reads_back_exactly() -> None:
    """A hook sends the transcript and a note after it: the request shares the
    transcript's messages (it holds only the note), the transcript goes on growing in
    its own buffer, and the request reads back exactly as sent, live and loaded."""

    class Note(sk.Hooks):
        def on_turn_prepared(self, run: Run, request: sk.ModelRequest) -> sk.ModelRequest:
            note = sk.Message.user(f"note {len(run.turns)}")
            return attrs.evolve(request, messages=run.messages + (note,))  # noqa: RUF005

    provider = ScriptedProvider(_script(6))
    kernel = sk.Kernel(
        "memory://", tools=[lookup], providers={"scripted": provider}, hooks=Note(), max_turns=None
    )
    run = await kernel.start(model="scripted/x", messages=["go"])
    async for _ in kernel.run(run.run_id):
        pass
    final = await kernel.store.load(run.run_id)
    sent = [list(request.messages) for request in provider.requests]
    assert [list(t.request.messages) for t in final.turns] == sent
    assert [m.text for m in sent[-1][-1:]] == ["note 5"]
    for request in provider.requests:
        shared = request.messages.shares_prefix(provider.requests[-1].messages)
        assert shared == len(request.messages) - 1, "the request copied the transcript"
    await kernel.aclose()


async def _held_bytes(turns: int) -> int:
    """Memory held by a finished run of ``turns`` turns loaded from ``memory://`` (the
    kernel and its store closed and gone)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run, kernel = await _drive("memory://", turns)
        await kernel.aclose()
        del kernel
        assert all(turn.result is not None for turn in run.turns)  # every turn decoded
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


async def test_memory_held_grows_linearly_with_turns() -> None:
    """Twice the turns hold about twice the memory (as tuples of the whole transcript in
    every request, it was about four times)."""
    small = await _held_bytes(150)
    large = await _held_bytes(300)
    assert large / small < 2.4, (small, large)
