"""Eager dispatch: a call whose arguments have finished streaming starts before the
model's answer ends, its intent committed first with the answer so far; the dispatch
rules hold; an answer cut off after calls started (a failed stream, a stopped drive, a
crash) is closed as committed, never asked again, and no call runs twice."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import ProviderError
from statekernel.middleware import ToolInvocation
from statekernel.stores import MemoryStore
from statekernel.testing import (
    Crash,
    CrashAt,
    FaultPlan,
    FaultyProvider,
    Reply,
    ScriptedProvider,
    call,
)

EAGER = sk.DispatchPolicy(eager=True)


class Log:
    """What the tools did, and when each call began."""

    def __init__(self) -> None:
        self.began: dict[str, datetime] = {}
        self.runs: list[str] = []

    def tools(self) -> list[sk.Tool]:
        @sk.tool
        async def book(label: str, seconds: float = 0.0) -> str:
            """Book something (a side effect: not idempotent)."""
            self.began.setdefault(label, datetime.now(UTC))
            await asyncio.sleep(seconds)
            self.runs.append(label)
            return f"booked {label}"

        @sk.tool(idempotent=True)
        async def look(label: str, seconds: float = 0.0) -> str:
            """Look something up (idempotent)."""
            self.began.setdefault(label, datetime.now(UTC))
            await asyncio.sleep(seconds)
            self.runs.append(label)
            return f"found {label}"

        @sk.tool(concurrency_safe=False)
        async def alone(label: str) -> str:
            """Run with nothing else running."""
            self.runs.append(label)
            return f"alone {label}"

        return [book, look, alone]


def _kernel(
    store: object,
    script: list[object],
    log: Log,
    *,
    dispatch: sk.DispatchPolicy = EAGER,
    hooks: sk.Hooks | None = None,
    plan: FaultPlan | None = None,
) -> tuple[sk.Kernel, ScriptedProvider]:
    scripted = ScriptedProvider(script)
    provider = FaultyProvider(scripted, plan) if plan is not None else scripted
    kernel = sk.Kernel(
        store,  # type: ignore[arg-type]
        tools=log.tools(),
        providers={"scripted": provider},
        dispatch=dispatch,
        hooks=hooks,
    )
    return kernel, scripted


async def _drive(kernel: sk.Kernel, run_id: str) -> list[sk.Event]:
    return [event async for event in kernel.run(run_id)]


def _results(run: sk.Run) -> list[str]:
    """The tool results fed back to the model, in transcript order."""
    return [
        part.content
        for message in run.messages
        for part in message.content
        if isinstance(part, sk.ToolResult)
    ]


async def _start(kernel: sk.Kernel) -> str:
    run = await kernel.start(model="scripted/test", messages=["go"])
    return run.run_id


async def test_a_call_starts_while_the_answer_still_streams(every_store_url: str) -> None:
    log = Log()
    answer = Reply(
        text="booking both",
        tool_calls=[call("book", {"label": "a"}), call("book", {"label": "b"})],
        between_calls=0.3,
    )
    kernel, model = _kernel(every_store_url, [answer, "done"], log)
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
        events = await kernel.events(run_id)
    assert run.state == "completed"
    assert sorted(log.runs) == ["a", "b"]
    kinds = [(e.type, e.data.get("early")) for e in events]
    answered = next(e for e in events if e.type == "model_completed")
    early = [e for e in events if e.type == "tool_call_started" and e.data.get("early")]
    assert [e.data["call_id"] for e in early] == ["call_0_0", "call_0_1"], kinds
    assert all(e.seq < answered.seq for e in early)
    assert log.began["a"] < answered.at  # it ran while the model was still streaming
    assert "cut_off" not in answered.data
    message = run.turns[0].result.message if run.turns[0].result else None
    assert message is not None
    assert message.text == "booking both"
    assert [c.id for c in message.tool_calls] == ["call_0_0", "call_0_1"]
    assert _results(run) == ["booked a", "booked b"]
    assert len(model.requests) == 2


async def test_the_intent_lands_with_the_answer_so_far_before_the_call_starts() -> None:
    store, log = MemoryStore(), Log()
    answer = Reply(
        text="one, then another",
        tool_calls=[call("book", {"label": "a"}), call("look", {"label": "b"})],
        between_calls=0.2,
    )
    kernel, _ = _kernel(store, [answer, "done"], log)
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        events = await kernel.events(run_id)
        first = next(e for e in events if e.type == "tool_call_started")
        at_intent = await store.load(run_id, revision=first.revision)
    turn = at_intent.current_turn
    assert at_intent.state == "calling_model"
    assert turn is not None
    assert turn.result is None
    assert turn.partial is not None
    assert turn.partial.text == "one, then another"
    assert [c.name for c in turn.partial.tool_calls] == ["book"]
    assert [(r.id, r.attempt, r.input) for r in turn.in_flight] == [("call_0_0", 1, {"label": "a"})]


@pytest.mark.parametrize(
    ("dispatch", "peak"),
    [(sk.DispatchPolicy(eager=True, max_concurrent=1), 1), (EAGER, 3)],
)
async def test_eager_calls_keep_the_concurrency_limit(
    dispatch: sk.DispatchPolicy, peak: int
) -> None:
    log, now, top = Log(), [0], [0]

    async def count(invocation: Any, nxt: Any) -> Any:
        if not isinstance(invocation, ToolInvocation):
            return await nxt(invocation)
        now[0] += 1
        top[0] = max(top[0], now[0])
        try:
            return await nxt(invocation)
        finally:
            now[0] -= 1

    calls = [call("look", {"label": str(i), "seconds": 0.2}) for i in range(3)]
    kernel = sk.Kernel(
        MemoryStore(),
        tools=log.tools(),
        providers={"scripted": ScriptedProvider([Reply(tool_calls=calls), "done"])},
        dispatch=dispatch,
        middleware=[count],
    )
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        events = await kernel.events(run_id)
    early = [e for e in events if e.type == "tool_call_started" and e.data.get("early")]
    assert top[0] == peak
    assert len(early) == (1 if peak == 1 else 3)
    assert sorted(log.runs) == ["0", "1", "2"]


async def test_a_stream_cut_off_after_a_call_started_closes_the_answer() -> None:
    log = Log()
    answer = Reply(
        text="first a, then alone",
        tool_calls=[call("look", {"label": "a", "seconds": 0.3}), call("alone", {"label": "b"})],
        cut_off=ProviderError("connection reset", provider="scripted"),
    )
    kernel, model = _kernel(MemoryStore(), [answer, "done"], log)
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
        events = await kernel.events(run_id)
    assert run.state == "completed"
    answered = next(e for e in events if e.type == "model_completed")
    assert answered.data["cut_off"] == "ProviderError: connection reset"
    # ``alone`` could not start while ``look`` ran: the answer ends with the call that started
    message = run.turns[0].result.message if run.turns[0].result else None
    assert message is not None
    assert message.text == "first a, then alone"
    assert [c.name for c in message.tool_calls] == ["look"]
    assert log.runs == ["a"]
    assert not any(e.type == "run_failed" for e in events)
    assert len(model.requests) == 2  # the cut-off answer was not asked for again


async def test_a_crash_mid_stream_never_asks_again_and_never_runs_a_call_twice(
    every_store_url: str,
) -> None:
    log = Log()
    store: object = MemoryStore() if every_store_url.startswith("memory") else every_store_url
    answer = Reply(tool_calls=[call("book", {"label": "a", "seconds": 0.5})])
    plan = FaultPlan([CrashAt("mid_stream", 1)])  # after the intent of ``a`` landed
    kernel, model = _kernel(store, [answer, "done"], log, plan=plan)
    run_id = await _start(kernel)
    with pytest.raises(Crash):
        await _drive(kernel, run_id)
    await kernel.aclose()
    assert log.runs == []  # it was stopped by the crash before its effect

    kernel, model = _kernel(store, [answer, "done"], log)
    async with kernel:
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
        assert run.state == "paused"
        assert run.pause is not None
        assert run.pause.reason == "uncertain_tool_calls"
        assert [c["id"] for c in run.pause.metadata["calls"]] == ["call_0_0"]
        events = await kernel.events(run_id)
        answered = next(e for e in events if e.type == "model_completed")
        assert answered.data["cut_off"] == "the drive reading the answer stopped"
        assert model.requests == []  # the answer was closed as committed
        await kernel.resolve_tool_call(run_id, "call_0_0", rerun=True)
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
    assert run.state == "completed"
    assert log.runs == ["a"]


async def test_an_idempotent_call_cut_off_by_a_stopped_drive_runs_again() -> None:
    store, log = MemoryStore(), Log()
    answer = Reply(tool_calls=[call("look", {"label": "a", "seconds": 5})])
    kernel, model = _kernel(store, [answer, "done"], log)
    async with kernel:
        run_id = await _start(kernel)
        started = asyncio.Event()

        async def drive() -> None:
            async for event in kernel.run(run_id):
                if event.type == "tool_call_started":
                    started.set()

        task = asyncio.create_task(drive())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert log.runs == []
        answer_fast = Reply(tool_calls=[call("look", {"label": "a"})])
        model.script[0] = answer_fast  # never read again: the answer is closed as committed
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
    assert run.state == "completed"
    record = run.turns[0].completed[0]
    assert (record.id, record.attempt, record.output) == ("call_0_0", 2, "found a")
    assert len(model.requests) == 2


async def test_a_hook_decision_taken_while_streaming_is_asked_once() -> None:
    log, asked = Log(), []

    class Approve(sk.Hooks):
        async def on_tool_call_started(
            self, run: sk.Run, record: sk.ToolCallRecord
        ) -> sk.Decision | None:
            asked.append(record.id)
            if record.name == "book" and run.resume_value is None:
                return sk.Pause("approval", {"call": record.id})
            return None

    answer = Reply(  # ``a`` still runs when the answer ends: b's pause waits for it
        tool_calls=[call("look", {"label": "a", "seconds": 0.3}), call("book", {"label": "b"})],
        between_calls=0.1,
    )
    kernel, _ = _kernel(MemoryStore(), [answer, "done"], log, hooks=Approve())
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
        assert run.state == "paused"
        assert run.pause is not None
        assert run.pause.reason == "approval"
        assert asked == ["call_0_0", "call_0_1"]  # b's decision came while streaming, once
        assert log.runs == ["a"]
        await kernel.resume(run_id, value=True)
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
    assert run.state == "completed"
    assert log.runs == ["a", "b"]


async def test_started_calls_stay_in_the_answer_a_hook_rewrote() -> None:
    log = Log()

    class Rewrite(sk.Hooks):
        async def on_model_completed(self, run: sk.Run, result: sk.ModelResult) -> sk.ModelResult:
            if result.tool_calls:
                return sk.ModelResult(sk.Message.assistant("no calls"), result.usage)
            return result

    answer = Reply(tool_calls=[call("look", {"label": "a"})])
    kernel, _ = _kernel(MemoryStore(), [answer, "done"], log, hooks=Rewrite())
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
    message = run.turns[0].result.message if run.turns[0].result else None
    assert message is not None
    assert message.text == "no calls"
    assert [c.id for c in message.tool_calls] == ["call_0_0"]
    assert run.state == "completed"
    assert log.runs == ["a"]
    assert _results(run) == ["found a"]


async def test_without_eager_calls_wait_for_the_answer() -> None:
    log = Log()
    answer = Reply(tool_calls=[call("look", {"label": "a"}), call("look", {"label": "b"})])
    kernel, _ = _kernel(MemoryStore(), [answer, "done"], log, dispatch=sk.DispatchPolicy())
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        events = await kernel.events(run_id)
    kinds = [e.type for e in events]
    assert kinds.index("model_completed") < kinds.index("tool_call_started")
    assert not any(e.data.get("early") for e in events)


def test_the_final_answer_keeps_started_calls_first_and_drops_none() -> None:
    """A final answer read from a second stream (a middleware retried the model) may give
    a started call another id: it is matched by tool and arguments, never run twice, and
    a call the model asked for only now is kept after the started ones."""
    from statekernel._lifecycle.chart import Lifecycle

    request = sk.ModelRequest("scripted/x", (sk.Message.user("go"),))
    turn = sk.Turn(0, request, model_attempts=1)
    run = sk.Run("r", "scripted/x", state="calling_model", current_turn=turn)
    lc = Lifecycle(run)
    started = call("look", {"label": "a"}, id="s1")
    lc.apply(
        "early_call_started",
        partial=sk.Message.assistant(tool_calls=[started]),
        call_input={"label": "a"},
    )
    again = call("look", {"label": "a"}, id="other-id")
    new = call("book", {"label": "b"}, id="n1")
    final = sk.ModelResult(
        sk.Message.assistant("ok", tool_calls=[new, again]), finish_reason="tool_calls"
    )
    after, events = lc.apply(
        "model_completed", result=final, finish=None, then_pause=None, reask=None
    )
    turn_after = after.current_turn
    assert turn_after is not None
    assert turn_after.result is not None
    assert [c.id for c in turn_after.result.tool_calls] == ["s1", "n1"]
    assert [r.id for r in turn_after.in_flight] == ["s1"]
    assert [r.id for r in turn_after.pending] == ["n1"]
    assert after.state == "dispatching_tools"
    assert [c["id"] for c in events[0].data["tool_calls"]] == ["s1", "n1"]


def test_calls_are_complete_once_a_later_call_begins_or_their_json_closes() -> None:
    from statekernel.providers import ResultBuilder, StreamEnd, ToolCallDelta

    builder = ResultBuilder()
    builder.add(ToolCallDelta(0, None, "look", '{"label": '))
    assert builder.complete_calls() == []
    builder.add(ToolCallDelta(0, None, None, '"a"'))
    assert builder.complete_calls() == []
    builder.add(ToolCallDelta(0, None, None, "}"))
    [first] = builder.complete_calls()  # its JSON closed: complete before anything follows
    assert (first.name, first.arguments) == ("look", '{"label": "a"}')
    assert first.id.startswith("call_")  # given now, and kept in the result
    builder.add(ToolCallDelta(1, "c2", "book", ""))
    assert [c.id for c in builder.complete_calls()] == [first.id]
    builder.add(ToolCallDelta(1, None, None, '{"label": "b"'))
    builder.add(ToolCallDelta(2, "c3", "look", "{}"))
    assert [c.id for c in builder.complete_calls()] == [first.id, "c2", "c3"]
    builder.add(StreamEnd("tool_calls"))
    assert [c.id for c in builder.result().tool_calls] == [first.id, "c2", "c3"]
    assert builder.so_far(builder.complete_calls()[:1]).tool_calls == (first,)


class Ledger:
    """A payment tool (not idempotent) writing each payment to a ledger file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def tool(self) -> sk.Tool:
        @sk.tool
        async def pay(to: str, amount: float) -> str:
            """Pay ``amount`` to ``to`` (a side effect: not idempotent)."""
            with self.path.open("a") as ledger:
                ledger.write(f"{to} {amount:g}\n")
            return f"paid {to} {amount:g}"

        return pay

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines()


async def _retry_cut_streams(c: Any, nxt: Any) -> Any:
    """Model middleware: read the answer again when the provider's stream was cut."""
    if isinstance(c, ToolInvocation):
        return await nxt(c)
    try:
        return await nxt(c)
    except ProviderError:
        return await nxt(c)


def _cut_then(first: sk.ToolCall, retried: Reply) -> Callable[[sk.ModelRequest], Reply]:
    """The first turn's answers: a stream cut after ``first``, then ``retried``."""
    answers = iter(
        [Reply(tool_calls=[first], cut_off=ProviderError("connection reset", provider="x"))]
    )
    return lambda _: next(answers, retried)


async def _paid_run(
    ledger: Ledger, first: sk.ToolCall, retried: Reply
) -> tuple[sk.Run, list[sk.Event]]:
    model = ScriptedProvider([_cut_then(first, retried), "done"])
    kernel = sk.Kernel(
        MemoryStore(),
        tools=[ledger.tool()],
        providers={"scripted": model},
        dispatch=EAGER,
        middleware=[_retry_cut_streams],
    )
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        run, events = await kernel.get(run_id), await kernel.events(run_id)
    assert run.state == "completed"
    assert len(model.requests) == 3  # the cut answer, the retried one, the last turn
    return run, events


@pytest.mark.parametrize(
    "again",
    [
        '{ "amount": 5,\n  "to": "bob" }',  # other whitespace, other key order
        '{"to":"bob","amount":5.0}',  # the same number written otherwise
        '{"to":"bob","amount":5}',  # the same text
    ],
)
async def test_a_retried_answer_asking_for_a_started_payment_again_pays_once(
    tmp_path: Path, again: str
) -> None:
    ledger = Ledger(tmp_path / "ledger.txt")
    first = call("pay", '{"to":"bob","amount":5}', id="pay-1")
    retried = Reply(tool_calls=[call("pay", again, id="pay-2")])
    run, events = await _paid_run(ledger, first, retried)
    assert ledger.lines() == ["bob 5"]
    started = [e.data["call_id"] for e in events if e.type == "tool_call_started"]
    assert started == ["pay-1"]
    answer = run.turns[0].result
    assert answer is not None
    assert [(c.id, c.name) for c in answer.tool_calls] == [("pay-1", "pay")]
    assert _results(run) == ["paid bob 5"]


async def test_a_started_call_the_retried_answer_drops_keeps_its_place_and_result(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.txt")
    first = call("pay", '{"to":"bob","amount":5}', id="c1")
    # the retry reuses the id c1 for another payment, and asks for bob's again
    retried = Reply(
        tool_calls=[
            call("pay", '{"to":"ann","amount":7}', id="c1"),
            call("pay", '{"amount":5, "to":"bob"}', id="c2"),
        ]
    )
    run, _ = await _paid_run(ledger, first, retried)
    assert sorted(ledger.lines()) == ["ann 7", "bob 5"]
    answer = run.turns[0].result
    assert answer is not None
    calls = [(c.name, json.loads(c.arguments)) for c in answer.tool_calls]
    assert calls == [("pay", {"to": "bob", "amount": 5}), ("pay", {"to": "ann", "amount": 7})]
    assert len({c.id for c in answer.tool_calls}) == 2
    assert _results(run) == ["paid bob 5", "paid ann 7"]


async def test_a_started_call_the_retried_answer_does_not_ask_for_keeps_its_result(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.txt")
    first = call("pay", '{"to":"bob","amount":5}', id="c1")
    retried = Reply(tool_calls=[call("pay", '{"to":"bob","amount":6}', id="c1")])
    run, _ = await _paid_run(ledger, first, retried)
    assert ledger.lines() == ["bob 5", "bob 6"]  # another amount is another payment
    assert _results(run) == ["paid bob 5", "paid bob 6"]


class Blocks(sk.Hooks):
    """Refuses payments to ``blocked``; every decision it takes is noted."""

    def __init__(self, blocked: str) -> None:
        self.blocked = blocked
        self.asked: list[str] = []

    def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> sk.Decision | None:
        self.asked.append(call.arguments)
        if isinstance(call.input, dict) and call.input.get("to") == self.blocked:
            return sk.Skip(error=f"payments to {self.blocked} are blocked")
        return None


async def test_a_decision_about_a_call_of_a_cut_answer_is_not_reused_for_another_call(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.txt")
    hooks = Blocks("bob")
    first = call("pay", '{"to":"bob","amount":5}', id="c1")  # refused while streaming
    retried = Reply(tool_calls=[call("pay", '{"to":"ann","amount":7}', id="c1")])
    model = ScriptedProvider([_cut_then(first, retried), "done"])
    kernel = sk.Kernel(
        MemoryStore(),
        tools=[ledger.tool()],
        providers={"scripted": model},
        dispatch=EAGER,
        middleware=[_retry_cut_streams],
        hooks=hooks,
    )
    async with kernel:
        run_id = await _start(kernel)
        await _drive(kernel, run_id)
        run = await kernel.get(run_id)
    assert run.state == "completed"
    assert ledger.lines() == ["ann 7"]  # ann's payment was asked about, not bob's refusal
    assert hooks.asked == ['{"to":"bob","amount":5}', '{"to":"ann","amount":7}']
    assert _results(run) == ["paid ann 7"]
