"""Property: whatever hooks and the provider hand the kernel, every committed run loads back.

Hooks answer with drawn values and the provider streams drawn parts, right or wrong
(``statekernel.testing.strategies.hook_answers`` and ``stream_answers``). The drive never
lets anything but a ``StatekernelError`` escape; afterwards the run, each of its turns,
every revision committed on the way and its events load from a fresh store, in a state at
rest; and the run failed exactly when a wrong value was handed over, with the typed error
naming it (``InvalidArgument`` from a hook, ``ProviderError`` from the stream). On every
store.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import statekernel as sk
from statekernel.errors import StatekernelError
from statekernel.providers import StreamPart
from statekernel.stores import open_store
from statekernel.testing import strategies as sts
from statekernel.testing._fuzz import run_history_ok

from ...conftest import STORE_KINDS

STORES = STORE_KINDS


@sk.tool
def record(item: str) -> str:
    """Record an item."""
    return f"recorded {item}"


class Drawn:
    """What one example hands the kernel, and whether a wrong value was handed over."""

    def __init__(self, answers: dict[str, list[sts.Answer]], streams: Sequence[sts.Answer]) -> None:
        self.answers = {name: list(items) for name, items in answers.items()}
        self.streams = list(streams)
        self.wrong: list[str] = []

    def take(self, answer: sts.Answer, argument: Any) -> Any:
        if answer.wrong and not self.wrong:
            self.wrong.append(answer.label)
        return answer.make(argument)


class Hooks(sk.Hooks):
    """Hooks that answer with the drawn answers, in order (then None)."""

    def __init__(self, drawn: Drawn) -> None:
        self.drawn = drawn

    def _next(self, name: str, argument: Any) -> Any:
        queue = self.drawn.answers.get(name)
        return self.drawn.take(queue.pop(0), argument) if queue else None

    def on_turn_prepared(self, run: sk.Run, request: sk.ModelRequest) -> Any:
        return self._next("on_turn_prepared", request)

    def on_model_completed(self, run: sk.Run, result: sk.ModelResult) -> Any:
        return self._next("on_model_completed", result)

    def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> Any:
        return self._next("on_tool_call_started", call)

    def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> Any:
        return self._next("on_turn_completed", turn)


class Provider:
    """Streams the drawn answer of each turn (the last one again past the end)."""

    def __init__(self, drawn: Drawn) -> None:
        self.drawn = drawn
        self.turn = 0

    async def stream(self, request: sk.ModelRequest) -> AsyncIterator[StreamPart]:
        streams = self.drawn.streams
        answer = streams[min(self.turn, len(streams) - 1)]
        self.turn += 1
        for part in self.drawn.take(answer, None):
            yield part

    async def aclose(self) -> None:
        """Nothing to close."""


def _url(kind: str, folder: str) -> str:
    if "://" in kind:  # a server's store, shared by the examples (each run has its own id)
        return kind
    if kind == "memory":
        return f"memory://{Path(folder).name}"
    if kind == "file":
        return f"file://{folder}/runs"
    return f"sqlite:///{folder}/runs.db"


async def _case(kind: str, drawn: Drawn) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(_url(kind, folder))
        provider = Provider(drawn)
        kernel = sk.Kernel(
            store, tools=[record], providers={"p": provider}, hooks=Hooks(drawn), max_turns=3
        )
        try:
            run = await kernel.start(model="p/model", messages=["go"])
            try:
                async for _ in kernel.run(run.run_id):
                    pass
            except StatekernelError:
                pass  # typed: allowed (the run must still load)
        finally:
            await kernel.aclose()
        fresh = open_store(_url(kind, folder))
        try:
            loaded = await fresh.load(run.run_id)
            assert loaded == await store.load(run.run_id)
            for turn in loaded.turns:  # completed turns are decoded when read
                assert turn.result is not None
            events = await fresh.events(run.run_id)
            assert events[-1].revision == loaded.revision
            await run_history_ok(fresh, run.run_id)  # every revision committed loads back
        finally:
            await fresh.aclose()
            await store.aclose()
    assert loaded.is_terminal, loaded.state
    event(f"{'wrong' if drawn.wrong else 'right'} values, run {loaded.state}")
    if drawn.wrong:
        assert loaded.state == "failed", (drawn.wrong, loaded.state)
        assert loaded.failure is not None
        assert loaded.failure.error in ("InvalidArgument", "ProviderError"), loaded.failure
    else:
        assert loaded.state != "failed", loaded.failure


def _answers() -> st.SearchStrategy[dict[str, list[sts.Answer]]]:
    return st.fixed_dictionaries(
        {name: st.lists(sts.hook_answers(name), max_size=3) for name in sts.HOOK_ANSWERS}
    )


@pytest.mark.parametrize("kind", STORES)
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(answers=_answers(), streams=st.lists(sts.stream_answers(), min_size=1, max_size=3))
def test_every_committed_run_loads_back(
    kind: str,
    request: pytest.FixtureRequest,
    answers: dict[str, list[sts.Answer]],
    streams: list[sts.Answer],
) -> None:
    if kind in ("redis", "redis-cluster", "postgres"):
        kind = str(request.getfixturevalue(f"{kind.replace('-', '_')}_store_url"))
    asyncio.run(_case(kind, Drawn(answers, streams)))
