"""Every way a turn closes applies the same rules: its calls' context patches apply to
the run's context in call order and their results go to the transcript in that order,
whether the turn closes because its calls completed, because new input interrupted it
(``send`` or ``run(run_id, text)``), or with a finish or a pause decided at its end; on
every store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool
def note(key: str, value: str) -> sk.ToolReturn:
    """Note ``value`` under ``key`` in the run's context."""
    return sk.ToolReturn(f"noted {key}", context={key: value})


ASK = sk.ask_user()


class EndsTurn(sk.Hooks):
    """Ends the first turn with a decision: finish the run, or pause it."""

    def __init__(self, decision: sk.Decision) -> None:
        self.decision = decision

    def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision | None:
        return self.decision if turn.index == 0 else None


def _kernel(store: object, script: list[object], hooks: sk.Hooks | None = None) -> sk.Kernel:
    provider = ScriptedProvider(script)
    tools = [note, ASK]
    return sk.Kernel(store, tools=tools, providers={"scripted": provider}, hooks=hooks)  # type: ignore[arg-type]


async def _drive(kernel: sk.Kernel, run_id: str, *text: str) -> sk.Run:
    async for _ in kernel.run(run_id, *text):
        pass
    return await kernel.get(run_id)


def _results(run: sk.Run) -> list[tuple[str, str, bool]]:
    """The transcript's tool results: (call id, text, is_error), in transcript order."""
    return [
        (p.tool_call_id, p.content, p.is_error)
        for m in run.messages
        for p in m.content
        if isinstance(p, sk.ToolResult)
    ]


async def _turn_completed(kernel: sk.Kernel, run_id: str) -> list[object]:
    events = await kernel.events(run_id)
    return [e.data.get("context_patched_by") for e in events if e.type == "turn_completed"]


TURN = [
    call("note", {"key": "city", "value": "Oslo"}, id="n1"),
    call("ask_user", {"question": "When?"}, id="q"),
    call("note", {"key": "city", "value": "Rome"}, id="n2"),  # a later call wins
]


async def _by_send(kernel: sk.Kernel, run_id: str) -> sk.Run:
    await kernel.send(run_id, "skip that, go on")
    return await _drive(kernel, run_id)


async def _by_run_with_text(kernel: sk.Kernel, run_id: str) -> sk.Run:
    return await _drive(kernel, run_id, "skip that, go on")


@pytest.mark.parametrize("new_input", [_by_send, _by_run_with_text])
async def test_new_input_instead_of_an_answer_applies_the_patches_in_call_order(
    new_input: Callable[[sk.Kernel, str], Awaitable[sk.Run]], every_store_url: str
) -> None:
    kernel = _kernel(every_store_url, [TURN, "going on"])
    run = await kernel.start(model="scripted/x", messages=["plan"], context={"keep": 1})
    paused = await _drive(kernel, run.run_id)
    assert paused.pause is not None
    assert paused.pause.reason == "input_required"
    assert paused.context == {"keep": 1}, "applied only when the turn closes"

    final = await new_input(kernel, run.run_id)
    assert final.state == "completed"
    assert final.context == {"keep": 1, "city": "Rome"}
    assert _results(final) == [
        ("n1", "noted city", False),
        ("q", "not answered: the run received new input", True),
        ("n2", "noted city", False),
    ]
    assert [m.text for m in final.messages if m.role == "user"][-1] == "skip that, go on"
    assert await _turn_completed(kernel, run.run_id) == [["n1", "n2"], None]
    await kernel.aclose()


@pytest.mark.parametrize(
    ("decision", "state"),
    [(sk.Finish("enough"), "completed"), (sk.Pause("review"), "paused"), (None, "completed")],
)
async def test_a_turn_that_finishes_pauses_or_goes_on_applies_the_patches_in_call_order(
    decision: sk.Decision | None, state: str, every_store_url: str
) -> None:
    turn = [TURN[0], TURN[2]]
    hooks = EndsTurn(decision) if decision else None
    kernel = _kernel(every_store_url, [turn, "done"], hooks)
    run = await kernel.start(model="scripted/x", messages=["plan"], context={"keep": 1})
    final = await _drive(kernel, run.run_id)
    assert final.state == state
    assert final.context == {"keep": 1, "city": "Rome"}
    assert _results(final) == [("n1", "noted city", False), ("n2", "noted city", False)]
    patched = await _turn_completed(kernel, run.run_id)
    assert patched[0] == ["n1", "n2"]
    await kernel.aclose()
