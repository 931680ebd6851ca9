"""The transitions that keep a run's usage limits and fallback chain: a tool call counts
once however often it re-runs, a fallback that answered must be a model of the run's
chain, and a resume replaces the limits only when given."""

from __future__ import annotations

import pytest

import statekernel as sk
from statekernel._lifecycle.chart import Lifecycle
from statekernel._records.run import Run, ToolCallRecord, Turn
from statekernel.errors import InvalidTransition
from statekernel.pauses import LimitReached


def _at(state: str, **fields: object) -> Lifecycle:
    request = sk.ModelRequest(model="openai/a", messages=())
    run = Run(run_id="r", model="openai/a", state=state, current_turn=Turn(0, request), **fields)  # type: ignore[arg-type]
    return Lifecycle(run)


def _with_calls(lc: Lifecycle, *records: ToolCallRecord) -> Lifecycle:
    turn = lc.run.current_turn
    assert turn is not None
    answer = sk.ModelResult(sk.Message.assistant("calls"), finish_reason="tool_calls")
    turn = Turn(0, turn.request, result=answer, pending=records)
    return Lifecycle(
        Run(run_id="r", model="openai/a", state="dispatching_tools", current_turn=turn)
    )


def test_a_call_counts_once_however_often_it_starts() -> None:
    lc = _with_calls(_at("dispatching_tools"), ToolCallRecord("a", "t", "{}", {}))
    lc.apply("tool_call_started", call_ids=["a"], call_input={})
    assert lc.run.tool_calls_started == 1
    lc.apply("tool_call_started", call_ids=["a"], call_input={})  # an idempotent re-run
    assert lc.run.tool_calls_started == 1


def test_identical_calls_that_run_once_count_once() -> None:
    records = [ToolCallRecord(i, "t", "{}", {}) for i in ("a", "b")]
    lc = _with_calls(_at("dispatching_tools"), *records)
    lc.apply("tool_call_started", call_ids=["a", "b"], call_input={})
    assert lc.run.tool_calls_started == 1


def test_the_model_that_answered_must_be_one_of_the_chain() -> None:
    answer = sk.ModelResult(sk.Message.assistant("hi"))
    chain = sk.Fallback("openai/a", "anthropic/b")
    lc = _at("calling_model", fallback=chain)
    with pytest.raises(InvalidTransition, match="fallback chain"):
        lc.apply("model_completed", result=answer, finish="stop", then_pause=None, reask=None,
                 answered_by="ollama/c")  # fmt: skip
    _, events = lc.apply(
        "model_completed",
        result=answer,
        finish="stop",
        then_pause=None,
        reask=None,
        answered_by="anthropic/b",
    )
    assert lc.run.turns[0].model == "anthropic/b"
    assert lc.run.turns[0].answered_by == "anthropic/b"
    assert events[0].data["model"] == "anthropic/b"


def test_without_a_chain_no_other_model_can_have_answered() -> None:
    answer = sk.ModelResult(sk.Message.assistant("hi"))
    lc = _at("calling_model")
    with pytest.raises(InvalidTransition, match="fallback chain"):
        lc.apply("model_completed", result=answer, finish="stop", then_pause=None, reask=None,
                 answered_by="anthropic/b")  # fmt: skip
    lc.apply("model_completed", result=answer, finish="stop", then_pause=None, reask=None)
    assert lc.run.turns[0].model is None
    assert lc.run.turns[0].answered_by == "openai/a"


def test_a_resume_replaces_the_limits_only_when_given() -> None:
    limits = sk.Limits(total_tokens=10)
    lc = _at("preparing_turn", limits=limits)
    reached = LimitReached("total_tokens", 12, 10)
    lc.apply("pause", reason="limit_reached", details=reached)
    assert lc.run.pause is not None
    assert lc.run.pause.metadata == {"limit": "total_tokens", "used": 12, "allowed": 10}
    lc.apply("resume", value=None, max_turns=None)
    assert lc.run.limits == limits
    lc.apply("pause", reason="limit_reached", details=reached)
    _, events = lc.apply("resume", value=None, max_turns=None, limits=sk.Limits(total_tokens=99))
    assert lc.run.limits == sk.Limits(total_tokens=99)
    assert events[0].data["limits"] == {"total_tokens": 99}
