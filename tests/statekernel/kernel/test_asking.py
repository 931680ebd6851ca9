"""Interactive tools: a call that asks pauses the run with ``input_required``; the
answer given to ``resume`` (checked against the question's schema) is the call's
result, committed with the resume; every store keeps the question; a crash before the
pause re-asks (idempotent) or leaves the call uncertain."""

from __future__ import annotations

import asyncio

import pytest

import statekernel as sk
from statekernel._kernel.asking import answered
from statekernel.errors import ConfigError, InvalidArgument
from statekernel.pauses import Ask, Question
from statekernel.stores import MemoryStore
from statekernel.testing import (
    Crash,
    CrashAt,
    FaultPlan,
    FaultyStore,
    Reply,
    ScriptedProvider,
    call,
)

APPROVAL = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
    "required": ["approved"],
}


@sk.tool
def confirm(amount: int) -> str:
    """Ask the user to confirm a payment of ``amount``."""
    raise sk.NeedsInput({"text": "pay?", "amount": amount}, schema=APPROVAL)


@sk.tool
async def slow(seconds: float) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@sk.tool
def bad_question() -> str:
    """Ask something that cannot be stored."""
    raise sk.NeedsInput({"when": {1, 2}})


@sk.tool
def bad_schema() -> str:
    """Ask with a schema that is not one."""
    raise sk.NeedsInput("ok?", schema={"type": 12})


def _kernel(store: object, script: list[object], *tools: sk.Tool) -> sk.Kernel:
    provider = ScriptedProvider(script)
    return sk.Kernel(store, tools=list(tools), providers={"scripted": provider})  # type: ignore[arg-type]


async def _drive(kernel: sk.Kernel, run_id: str) -> sk.Run:
    async for _ in kernel.run(run_id):
        pass
    return await kernel.get(run_id)


async def test_ask_user_pauses_and_the_answer_is_the_calls_result(every_store_url: str) -> None:
    ask = sk.ask_user(answer_schema={"type": "string", "minLength": 1})
    script = [call("ask_user", {"question": "Which city?"}), "Paris it is"]
    kernel = _kernel(every_store_url, script, ask)
    run = await kernel.start(model="scripted/x", messages=["plan a trip"])
    paused = await _drive(kernel, run.run_id)
    assert paused.state == "paused"
    assert paused.pause is not None
    assert paused.pause.reason == "input_required"
    call_id = paused.current_turn.in_flight[0].id if paused.current_turn else ""
    assert paused.pause.metadata == {
        "call": call_id,
        "calls": [call_id],
        "name": "ask_user",
        "question": "Which city?",
        "schema": {"type": "string", "minLength": 1},
    }
    resumed = await kernel.resume(run.run_id, value="Paris")
    assert resumed.revision == paused.revision + 1  # resume and result: one commit
    assert resumed.state == "dispatching_tools"
    final = await _drive(kernel, run.run_id)
    assert final.state == "completed"
    record = final.turns[0].completed[0]
    assert (record.id, record.output, record.error) == (call_id, "Paris", None)
    assert [m.role for m in final.messages] == ["user", "assistant", "tool", "assistant"]
    assert ask.idempotent
    assert ask.parameters["properties"]["question"]["type"] == "string"
    await kernel.aclose()


async def test_an_answer_outside_the_schema_is_refused_and_nothing_commits() -> None:
    store = MemoryStore()
    kernel = _kernel(store, [call("confirm", {"amount": 30}), "paid"], confirm)
    run = await kernel.start(model="scripted/x", messages=["pay"])
    paused = await _drive(kernel, run.run_id)
    assert paused.pause is not None
    assert paused.pause.metadata["question"] == {
        "text": "pay?",
        "amount": 30,
    }
    with pytest.raises(InvalidArgument, match=r"answer\['approved'\].*'yes' is not of type"):
        await kernel.resume(run.run_id, value={"approved": "yes"})
    with pytest.raises(InvalidArgument, match="'approved' is a required property"):
        await kernel.resume(run.run_id, value={})
    with pytest.raises(
        InvalidArgument, match=r"waits for an answer to .*'pay\?'.*give it as value="
    ):
        await kernel.resume(run.run_id)  # no answer given: never taken for null
    assert await kernel.get(run.run_id) == paused
    await kernel.resume(run.run_id, value={"approved": True, "note": "fine"})
    final = await _drive(kernel, run.run_id)
    assert final.turns[0].completed[0].output == {"approved": True, "note": "fine"}


async def test_calls_that_ask_together_are_asked_one_after_another_in_call_order() -> None:
    store = MemoryStore()
    turn = Reply(
        tool_calls=[
            call("confirm", {"amount": 1}, id="a"),
            call("slow", {"seconds": 0.05}, id="b"),
            call("confirm", {"amount": 2}, id="c"),
        ]
    )
    kernel = _kernel(store, [turn, "done"], confirm, slow)
    run = await kernel.start(model="scripted/x", messages=["go"])
    first = await _drive(kernel, run.run_id)
    assert first.pause is not None
    assert first.pause.metadata["call"] == "a"
    assert [w["call"] for w in first.pause.metadata["waiting"]] == ["c"]
    assert first.current_turn is not None
    assert [r.id for r in first.current_turn.completed] == ["b"]  # the pause waited for it
    second = await kernel.resume(run.run_id, value={"approved": True})
    assert second.state == "paused"  # the next question, in the same commit
    assert second.revision == first.revision + 1
    assert second.pause is not None
    assert second.pause.metadata["call"] == "c"
    assert "waiting" not in second.pause.metadata
    await kernel.resume(run.run_id, value={"approved": False})
    final = await _drive(kernel, run.run_id)
    assert final.state == "completed"
    outputs = {r.id: r.output for r in final.turns[0].completed}
    assert outputs == {"a": {"approved": True}, "b": "slept 0.05", "c": {"approved": False}}


async def test_a_question_or_schema_that_cannot_be_stored_is_an_error_result() -> None:
    turn = Reply(tool_calls=[call("bad_question", {}, id="q"), call("bad_schema", {}, id="s")])
    kernel = _kernel(MemoryStore(), [turn, "ok"], bad_question, bad_schema)
    run = await kernel.start(model="scripted/x", messages=["go"])
    final = await _drive(kernel, run.run_id)
    assert final.state == "completed"
    errors = {r.id: r.error or "" for r in final.turns[0].completed}
    assert "question that is not JSON" in errors["q"]
    assert "set is not JSON" in errors["q"]
    assert "schema that is not a valid JSON Schema" in errors["s"]


@sk.tool
def unresolved_schema(topic: str) -> str:
    """Ask with a schema whose ``$ref`` resolves nowhere."""
    raise sk.NeedsInput(f"about {topic}?", schema={"$ref": "#/definitions/missing"})


async def test_a_question_whose_schema_does_not_resolve_is_an_error_result() -> None:
    script = [call("unresolved_schema", {"topic": "tea"}, id="u"), "asked nothing"]
    kernel = _kernel(MemoryStore(), script, unresolved_schema)
    run = await kernel.start(model="scripted/x", messages=["go"])
    final = await _drive(kernel, run.run_id)
    assert final.state == "completed"  # no pause that could never be answered
    record = final.turns[0].completed[0]
    assert record.output is None
    assert record.error == (
        "the tool asked with a schema that is its $ref '#/definitions/missing' resolves"
        " nowhere (PointerToNowhere)"
    )
    (result,) = [p for m in final.messages for p in m.content if isinstance(p, sk.ToolResult)]
    assert (result.content, result.is_error) == (record.error, True)  # the model reads why
    assert final.messages[-1].text == "asked nothing"


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (5, "not a JSON object: 5"),
        ({"type": "strng"}, "not a valid JSON Schema: schema['type']"),
        ({"$ref": "#/definitions/missing"}, "$ref '#/definitions/missing' resolves nowhere"),
        ({"enum": [{1, 2}]}, 'not JSON: schema["enum"][0]: set is not JSON'),
    ],
)
def test_ask_user_refuses_an_answer_schema_that_cannot_check_answers(
    schema: object, problem: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        sk.ask_user("confirm", answer_schema=schema)  # type: ignore[arg-type]
    assert str(refused.value).startswith("tool 'confirm': its answer_schema is ")
    assert problem in str(refused.value)


def test_a_stored_question_whose_schema_cannot_check_answers_still_takes_the_answer() -> None:
    # a pause committed before schemas were checked when asked
    question = Question((Ask(("c",), "ask", None, {"$ref": "#/nowhere"}),))
    calls, error, waiting = answered(question, "yes")
    assert (calls, waiting) == (["c"], None)
    assert error is not None
    assert error.startswith("the question's schema is its $ref '#/nowhere' resolves nowhere")
    asked = Question((Ask(("c",), "ask", None, {"type": "string"}),))
    assert answered(asked, "yes") == (
        ["c"],
        None,
        None,
    )


@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_crash_before_the_pause_lands_asks_again_or_leaves_the_call_uncertain(
    idempotent: bool,
) -> None:
    inner = MemoryStore()
    asking = sk.ask_user() if idempotent else confirm
    arguments = {"question": "why?"} if idempotent else {"amount": 5}
    script = [call(asking.name, arguments), "done"]
    plan = FaultPlan([CrashAt("before_commit", 4)])  # start, model_started, intent, pause
    crashing = _kernel(FaultyStore(inner, plan), script, asking)
    run = await crashing.start(model="scripted/x", messages=["go"])
    with pytest.raises(Crash):
        await _drive(crashing, run.run_id)
    kernel = _kernel(inner, script[1:], asking)
    after = await _drive(kernel, run.run_id)
    assert after.pause is not None
    if idempotent:
        assert after.pause.reason == "input_required"
        assert after.pause.metadata["question"] == "why?"
        await kernel.resume(run.run_id, value="because")
        final = await _drive(kernel, run.run_id)
        assert final.turns[0].completed[0].output == "because"
    else:
        assert after.pause.reason == "uncertain_tool_calls"


async def test_new_input_to_a_run_waiting_for_an_answer_closes_the_question() -> None:
    kernel = _kernel(MemoryStore(), [call("confirm", {"amount": 3}), "noted"], confirm)
    run = await kernel.start(model="scripted/x", messages=["pay"])
    await _drive(kernel, run.run_id)
    final = [e async for e in kernel.run(run.run_id, "never mind")]
    assert final[-1].type == "run_completed"
    stored = await kernel.get(run.run_id)
    assert stored.turns[0].completed[0].error is not None
    assert stored.messages[-2].text == "never mind"


@sk.tool
def pay(amount: int) -> str:
    """Pay ``amount`` (not idempotent)."""
    return f"paid {amount}"


async def test_a_question_asked_again_beside_an_uncertain_call_leaves_the_run_to_others() -> None:
    """A crash leaves a question and a payment in flight; the next drive asks again and
    pauses for the payment. The question's answer-to-be leaves with that pause: the
    drive gives the run back, so another kernel resolves the payment at once, and the
    question is asked again after the resume."""
    inner = MemoryStore()
    ask = sk.ask_user()
    both = Reply(tool_calls=(call(ask.name, {"question": "why?"}), call(pay.name, {"amount": 5})))
    plan = FaultPlan([CrashAt("before_commit", 4)])  # start, model_started, intents, results
    crashing = _kernel(FaultyStore(inner, plan), [both, "done"], ask, pay)
    run = await crashing.start(model="scripted/x", messages=["go"])
    with pytest.raises(Crash):
        await _drive(crashing, run.run_id)
    async with _kernel(inner, [both, "done"], ask, pay) as kernel:
        after = await _drive(kernel, run.run_id)
        assert after.pause is not None
        assert after.pause.reason == "uncertain_tool_calls"
        assert [c["name"] for c in after.pause.metadata["calls"]] == ["pay"]
        assert not kernel.holds(run.run_id)
        async with sk.Kernel(inner, tools=[ask, pay], busy_timeout=0) as operator:
            payment = after.pause.metadata["calls"][0]["id"]
            await operator.resolve_tool_call(run.run_id, payment, output="paid 5")
        asked = await _drive(kernel, run.run_id)
        assert asked.pause is not None
        assert asked.pause.reason == "input_required"
        assert asked.pause.metadata["question"] == "why?"
        await kernel.resume(run.run_id, value="because")
        final = await _drive(kernel, run.run_id)
    assert final.state == "completed", final.failure
    assert {r.name: r.output for r in final.turns[0].completed} == {
        "ask_user": "because",
        "pay": "paid 5",
    }


async def test_a_hook_pause_beside_a_waiting_question_leaves_the_run_to_others() -> None:
    """A hook pauses the run before a payment while a question asked in the same turn
    waits: the question's result leaves with the pause (it is asked again after the
    resume), so the drive gives the run back."""
    approved: list[bool] = []

    class Gate(sk.Hooks):
        async def on_tool_call_started(
            self, run: sk.Run, call: sk.ToolCallRecord
        ) -> sk.Decision | None:
            if call.name == "pay" and not approved:
                return sk.Pause("approval", {"call": call.id})
            return None

    ask = sk.ask_user()
    both = Reply(tool_calls=(call(ask.name, {"question": "why?"}), call(pay.name, {"amount": 5})))
    provider = ScriptedProvider([both, "done"])
    store = MemoryStore()
    async with sk.Kernel(
        store, tools=[ask, pay], providers={"scripted": provider}, hooks=Gate()
    ) as kernel:
        run = await kernel.start(model="scripted/x", messages=["go"])
        first = await _drive(kernel, run.run_id)
        assert first.pause is not None
        assert first.pause.reason == "approval"
        assert not kernel.holds(run.run_id)
        approved.append(True)
        await kernel.resume(run.run_id)
        asked = await _drive(kernel, run.run_id)
        assert asked.pause is not None
        assert asked.pause.reason == "input_required"
        await kernel.resume(run.run_id, value="because")
        final = await _drive(kernel, run.run_id)
    assert final.state == "completed"
    assert {r.name: r.output for r in final.turns[0].completed} == {
        "ask_user": "because",
        "pay": "paid 5",
    }
