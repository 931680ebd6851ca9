"""The lifecycle chart alone: no kernel, no I/O."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime
from typing import Any

import attrs
import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from statemachine import State, StateChart
from statemachine.exceptions import InvalidDefinition

from statekernel import (
    STATE_IDS,
    Message,
    ModelRequest,
    ModelResult,
    PauseInfo,
    Run,
    RunLifecycle,
    ToolCall,
    ToolCallRecord,
    Turn,
)
from statekernel._lifecycle import transitions as _transitions
from statekernel._lifecycle.chart import EVENTS, TABLE, LibraryLifecycle, Lifecycle, derive_table
from statekernel._records.run import Cancellation, FailureInfo, StateId
from statekernel.errors import CorruptCheckpoint, InvalidTransition
from statekernel.pauses import HookPause
from statekernel.testing.strategies import LifecycleStep, lifecycle_payloads, lifecycle_steps

ACTIVE = ("preparing_turn", "calling_model", "dispatching_tools")
RETURNABLE = ACTIVE

# The contract of DESIGN.md, written out by hand: (state, event) -> possible targets.
DECLARED: dict[tuple[str, str], set[str]] = {
    ("init", "start"): {"preparing_turn"},
    ("preparing_turn", "turn_prepared"): {"calling_model"},
    ("calling_model", "model_started"): {"calling_model"},
    ("calling_model", "early_call_started"): {"calling_model"},
    ("calling_model", "answer_cut_off"): {"dispatching_tools"},
    ("calling_model", "model_completed"): {"dispatching_tools", "preparing_turn", "completed"},
    ("dispatching_tools", "tool_call_started"): {"dispatching_tools"},
    ("dispatching_tools", "tool_call_completed"): {"dispatching_tools"},
    ("dispatching_tools", "tools_completed"): {"preparing_turn", "completed"},
    ("paused", "resume"): set(RETURNABLE),
    ("failed", "retry"): {"init", *RETURNABLE, "paused"},
    ("completed", "input"): {"preparing_turn"},
    ("paused", "input"): {"preparing_turn"},
    **{(s, "pause"): {"paused"} for s in ACTIVE},
    **{(s, "fail"): {"failed"} for s in ACTIVE},
    **{(s, "cancel"): {"failed"} for s in ("init", *ACTIVE, "paused")},
}

CALL = ToolCall("c1", "echo", '{"x": 1}')
REQUEST = ModelRequest("scripted/x", (Message.user("hi"),))


def run_in(state: str, *, returns_to: str = "dispatching_tools") -> Run:
    """A consistent run resting in ``state``."""
    run = Run("r1", "scripted/x", state=state, messages=(Message.user("hi"),))  # type: ignore[arg-type]
    turn = Turn(0, REQUEST)
    if state == "calling_model":
        return attrs.evolve(run, current_turn=turn)
    if state in ("dispatching_tools", "paused", "failed"):
        result = ModelResult(Message.assistant(tool_calls=[CALL]), finish_reason="tool_calls")
        record = ToolCallRecord("c1", "echo", CALL.arguments, {"x": 1})
        turn = attrs.evolve(turn, result=result, pending=(record,))
        run = attrs.evolve(run, current_turn=turn, messages=(*run.messages, result.message))
    if state == "paused":
        run = attrs.evolve(run, pause=PauseInfo("approval", returns_to))  # type: ignore[arg-type]
    if state == "failed":
        from statekernel import FailureInfo

        run = attrs.evolve(run, failure=FailureInfo("E", "boom", returns_to))  # type: ignore[arg-type]
    return run


def payload(event: str, run: Run) -> dict[str, Any]:
    """A valid payload for ``event``."""
    payloads: dict[str, dict[str, Any]] = {
        "start": {},
        "turn_prepared": {"request": REQUEST},
        "model_started": {},
        "model_completed": {
            "result": ModelResult(Message.assistant("done")),
            "finish": "stop",
            "then_pause": None,
            "reask": None,
        },
        "tool_call_started": {"call_ids": ["c1"], "call_input": {"x": 1}},
        "early_call_started": {
            "partial": Message.assistant(tool_calls=[CALL]),
            "call_input": {"x": 1},
        },
        "answer_cut_off": {"reason": "the stream failed"},
        "tool_call_completed": {
            "call_ids": ["c1"],
            "output": "ok",
            "error": None,
            "resolved": False,
            "context": None,
            "skipped": None,
        },
        "tools_completed": {"finish": None, "then_pause": None, "reask": None},
        "pause": {"reason": "wait", "details": HookPause()},
        "resume": {"value": None, "max_turns": None},
        "fail": {"error": "E", "message": "m"},
        "cancel": {"cancellation": Cancellation("stop", "ops", datetime(2026, 1, 1, tzinfo=UTC))},
        "retry": {},
        "input": {"messages": [Message.user("more")]},
    }
    return payloads[event]


def ready(state: str, event: str) -> Run:
    run = run_in(state)
    if (state, event) == ("calling_model", "answer_cut_off"):
        run, _ = Lifecycle(run).apply("early_call_started", **payload("early_call_started", run))
    if (state, event) == ("dispatching_tools", "tools_completed"):
        lc = Lifecycle(run)
        run, _ = lc.apply(
            "tool_call_completed",
            call_ids=["c1"],
            output="ok",
            error=None,
            resolved=False,
            context=None,
            skipped=None,
        )
    return run


def test_chart_declares_exactly_the_contract() -> None:
    got: dict[tuple[str, str], set[str]] = {}
    for s in RunLifecycle.states:
        for t in s.transitions:
            for e in t.events:
                got.setdefault((t.source.value, str(e)), set()).add(t.target.value)
    assert got == DECLARED


@pytest.mark.parametrize(("state", "event"), sorted(DECLARED))
def test_every_declared_transition_applies(state: str, event: str) -> None:
    run = ready(state, event)
    lc = Lifecycle(run)
    nxt, events = lc.apply(event, **payload(event, run))
    assert nxt.state in DECLARED[(state, event)]
    assert nxt.revision == run.revision + 1
    assert events, "every transition persists at least one event"
    assert [e.seq for e in events] == list(range(run.event_count, run.event_count + len(events)))
    assert all(e.revision == nxt.revision for e in events)
    assert nxt.event_count == run.event_count + len(events)


UNDECLARED = [
    (s, e) for s, e in itertools.product(STATE_IDS, sorted(EVENTS)) if (s, e) not in DECLARED
]


@pytest.mark.parametrize(("state", "event"), UNDECLARED)
def test_every_undeclared_event_is_rejected_and_changes_nothing(state: str, event: str) -> None:
    run = run_in(state)
    lc = Lifecycle(run)
    with pytest.raises(InvalidTransition) as info:
        lc.apply(event, **payload(event, run))
    assert info.value.state == state
    assert lc.run is run


@pytest.mark.parametrize("target", RETURNABLE)
def test_resume_and_retry_return_to_the_saved_state(target: str) -> None:
    for state, event in (("paused", "resume"), ("failed", "retry")):
        run = run_in(state, returns_to=target)
        nxt, _ = Lifecycle(run).apply(event, **payload(event, run))
        assert nxt.state == target
        assert nxt.pause is None
        assert nxt.failure is None


@pytest.mark.parametrize("state", ["init", *ACTIVE, "paused"])
def test_a_cancelled_run_fails_and_retry_returns_it_where_it_was(state: str) -> None:
    run = run_in(state)
    asked = Cancellation("stop", "ops", datetime(2026, 1, 1, tzinfo=UTC))
    failed, events = Lifecycle(run).apply("cancel", cancellation=asked)
    assert failed.state == "failed"
    assert failed.failure == FailureInfo("Cancelled", "stop", state, asked)  # type: ignore[arg-type]
    assert [e.type for e in events] == ["run_cancelled", "run_failed"]
    assert events[0].data == {"reason": "stop", "by": "ops", "requested_at": asked.at.isoformat()}
    back, _ = Lifecycle(failed).apply("retry")
    assert back.state == state
    assert back.failure is None
    assert back.pause == run.pause


def test_model_completed_picks_its_target_by_guard() -> None:
    run = run_in("calling_model")
    with_tools = ModelResult(Message.assistant(tool_calls=[CALL]), finish_reason="tool_calls")
    text = ModelResult(Message.assistant("hello"))
    cases = [
        (with_tools, "stop", None, "dispatching_tools"),
        (text, "stop", None, "completed"),
        (text, None, None, "preparing_turn"),
        (text, "stop", PauseInfo("later", "preparing_turn"), "preparing_turn"),
    ]
    for result, finish, then_pause, expected in cases:
        nxt, events = Lifecycle(run).apply(
            "model_completed", result=result, finish=finish, then_pause=then_pause, reask=None
        )
        assert nxt.state == expected
        assert nxt.pending_pause == then_pause
        kinds = [e.type for e in events]
        assert ("run_completed" in kinds) == (expected == "completed")


def test_a_failing_action_leaves_the_run_unchanged() -> None:
    run = run_in("dispatching_tools")
    lc = Lifecycle(run)
    with pytest.raises(InvalidTransition, match="unknown or already finished"):
        lc.apply("tool_call_started", call_ids=["nope"], call_input={})
    assert lc.run is run
    with pytest.raises(InvalidTransition, match="still pending"):
        lc.apply("tools_completed", finish=None, then_pause=None, reask=None)
    assert lc.run is run
    # the machine still works afterwards
    nxt, _ = lc.apply("tool_call_started", call_ids=["c1"], call_input={"x": 1})
    assert nxt.current_turn is not None
    assert [r.id for r in nxt.current_turn.in_flight] == ["c1"]


def test_a_bug_inside_a_transition_surfaces_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise TypeError("bug in the transition")

    monkeypatch.setattr(_transitions, "pause", broken)
    run = run_in("preparing_turn")
    lc = Lifecycle(run)
    with pytest.raises(TypeError, match="bug in the transition"):
        lc.apply("pause", reason="r", details=HookPause())
    assert lc.run is run
    monkeypatch.undo()
    nxt, _ = lc.apply("pause", reason="r", details=HookPause())
    assert nxt.state == "paused"


def test_payloads_are_validated_by_name() -> None:
    run = run_in("init")
    lc = Lifecycle(run)
    with pytest.raises(InvalidTransition, match="payload"):
        lc.apply("start", state="completed")
    with pytest.raises(InvalidTransition, match="unknown event"):
        lc.apply("explode")
    assert lc.run is run


@pytest.mark.parametrize("state", STATE_IDS)
def test_restore_into_any_state_runs_no_callbacks(state: str) -> None:
    run = run_in(state)
    lc = Lifecycle(run)
    assert lc.run is run
    assert lc.run.revision == 0
    assert lc.run.event_count == 0


def test_restore_rejects_an_unknown_state() -> None:
    run = attrs.evolve(run_in("init"), state="exploded")  # type: ignore[arg-type]
    with pytest.raises(CorruptCheckpoint, match="exploded"):
        Lifecycle(run)


def test_input_closes_an_interrupted_turn_with_not_run_results() -> None:
    run = run_in("paused")
    nxt, events = Lifecycle(run).apply("input", messages=[Message.user("forget it")])
    assert nxt.state == "preparing_turn"
    assert nxt.current_turn is None
    assert [m.role for m in nxt.messages] == ["user", "assistant", "tool", "user"]
    assert nxt.messages[2].content[0].is_error  # type: ignore[union-attr]
    assert [e.type for e in events] == ["turn_completed", "input_received"]


# -- the table against python-statemachine's engine -----------------------------------

DIFFERENTIAL = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def outcome(lc: Lifecycle, event: str, payload: dict[str, Any], join: bool) -> tuple[Any, ...]:
    """What applying the event gives: the next run and its events, or the error."""
    before = lc.run
    try:
        run, events = lc.apply(event, join=join, **payload)
    except Exception as exc:
        assert lc.run is before, "a rejected transition changed the run"
        return ("raised", type(exc), str(exc))
    assert lc.run is run
    return ("applied", run, events)


def assert_engines_agree(step: LifecycleStep) -> None:
    """The table and the library's engine give the same run, events or error."""
    run, event, payload, join = step
    table, engine = Lifecycle(run), LibraryLifecycle(run)
    assert table.allowed_events() == engine.allowed_events()
    got = outcome(table, event, payload, join)
    assert got == outcome(engine, event, payload, join)
    assert table.run == engine.run
    hypothesis.event(f"{event} -> {got[1].state if got[0] == 'applied' else got[1].__name__}")


@pytest.mark.parametrize(("state", "event"), sorted(DECLARED))
@DIFFERENTIAL
@given(data=st.data())
def test_table_and_engine_agree_on_every_guard_outcome(
    state: StateId, event: str, data: st.DataObject
) -> None:
    assert_engines_agree(data.draw(lifecycle_steps(state, event)))


@pytest.mark.parametrize("state", STATE_IDS)
@DIFFERENTIAL
@given(data=st.data())
def test_table_and_engine_agree_on_any_event(state: StateId, data: st.DataObject) -> None:
    assert_engines_agree(data.draw(lifecycle_steps(state)))


@pytest.mark.parametrize("engine", [Lifecycle, LibraryLifecycle])
@pytest.mark.parametrize(
    ("raised", "surfaces_as"),
    [(TypeError("bug in the guard"), TypeError), (_transitions.Refused("no"), InvalidTransition)],
)
def test_a_failing_guard_leaves_the_run_unchanged(
    engine: type[Lifecycle],
    raised: Exception,
    surfaces_as: type[Exception],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: RunLifecycle, result: ModelResult) -> bool:
        raise raised

    monkeypatch.setattr(RunLifecycle, "has_tool_calls", broken)
    run = run_in("calling_model")
    lc = engine(run)
    with pytest.raises(surfaces_as):
        lc.apply("model_completed", **payload("model_completed", run))
    assert lc.run is run


@DIFFERENTIAL
@given(first=lifecycle_steps(), data=st.data())
def test_table_and_engine_agree_along_a_run(first: LifecycleStep, data: st.DataObject) -> None:
    run, event, payload, join = first
    table, engine = Lifecycle(run), LibraryLifecycle(run)
    for _ in range(6):
        assert outcome(table, event, payload, join) == outcome(engine, event, payload, join)
        assert table.run == engine.run
        assert table.allowed_events() == engine.allowed_events()
        allowed = table.allowed_events() or sorted(EVENTS)
        event = data.draw(st.sampled_from(allowed) | st.sampled_from(sorted(EVENTS)))
        payload = {**data.draw(lifecycle_payloads(event, table.run)), "at": run.created_at}
        join = data.draw(st.booleans())


def test_the_table_holds_every_transition_of_the_chart_in_order() -> None:
    got: dict[tuple[str, str], list[str]] = {}
    for (state, event), routes in TABLE.items():
        got[(state, event)] = [r.target for r in routes]
    assert {k: set(v) for k, v in got.items()} == DECLARED
    assert got[("calling_model", "model_completed")] == [
        "dispatching_tools",
        "completed",
        "preparing_turn",
    ]
    assert [g.name for g in TABLE[("calling_model", "model_completed")][0].guards] == [
        "has_tool_calls"
    ]


def _chart(**transition: Any) -> type[StateChart[Any]]:
    """A two-state chart whose ``start`` transition takes ``transition``'s options."""

    class Small(StateChart[Any]):
        catch_errors_as_events = False
        allow_event_without_transition = False
        init = State(value="init", initial=True)
        preparing_turn = State(value="preparing_turn")
        start = init.to(preparing_turn, **transition)
        fail = preparing_turn.to(init)

        def ok(self) -> bool:
            return True

        def other(self) -> bool:
            return True

        def needs_source(self, source: object) -> bool:
            return True

    return Small


class _EntryAction(RunLifecycle):
    def on_enter_paused(self) -> None:
        pass


class _BeforeAction(RunLifecycle):
    def before_start(self) -> None:
        pass


class _CatchingErrors(RunLifecycle):
    catch_errors_as_events = True


@pytest.mark.parametrize(
    ("chart", "complaint"),
    [
        (_EntryAction, "callback 'on_enter_paused'"),
        (_BeforeAction, "callback 'before_start'"),
        (_CatchingErrors, "catch_errors_as_events"),
        (_chart(validators="ok"), "validators"),
        (_chart(cond="ok and other"), "not a method name"),
        (_chart(cond="needs_source"), "not a payload name"),
        (_chart(on="ok"), "declares the callback 'ok'"),
        (_chart(cond="ok"), "states are not STATE_IDS"),
    ],
)
def test_a_chart_the_table_cannot_step_is_refused(chart: Any, complaint: str) -> None:
    with pytest.raises(InvalidDefinition, match=complaint):
        derive_table(chart)


@pytest.mark.parametrize("state", STATE_IDS)
def test_a_data_change_keeps_the_state_and_numbers_its_event(state: str) -> None:
    run = attrs.evolve(run_in(state), revision=3, event_count=7)
    lc = Lifecycle(run)
    changed, events = lc.change("context_updated", data={}, context={"k": 1})
    assert changed.state == run.state
    assert changed.context == {"k": 1}
    assert (changed.revision, changed.event_count) == (4, 8)
    assert [(e.type, e.revision, e.seq, e.data) for e in events] == [("context_updated", 4, 7, {})]
    assert events[0].at == changed.updated_at
    assert lc.run == changed
    joined, more = lc.change("context_updated", data={"n": 2}, join=True, context={})
    assert (joined.revision, joined.event_count, more[0].seq) == (4, 9, 8)


@pytest.mark.parametrize(
    ("kind", "fields", "why"),
    [
        ("run_started", {"context": {}}, "unknown data change"),
        ("context_updated", {"pause": None}, "fields must be ['context'], got ['pause']"),
        ("tool_call_resolved", {}, "fields must be ['pause'], got []"),
    ],
)
def test_a_data_change_that_is_not_one_is_refused_and_changes_nothing(
    kind: str, fields: dict[str, Any], why: str
) -> None:
    run = run_in("paused")
    lc = Lifecycle(run)
    with pytest.raises(InvalidTransition, match=re.escape(why)):
        lc.change(kind, data={}, **fields)
    assert lc.run is run


def test_a_passed_deadline_fails_the_run_and_retry_drops_the_deadline() -> None:
    due = datetime(2026, 1, 1, tzinfo=UTC)
    run = attrs.evolve(run_in("paused"), deadline=due)
    passed = Cancellation("its deadline passed", "deadline", due, "DeadlineExceeded")
    failed, events = Lifecycle(run).apply("cancel", cancellation=passed)
    assert [e.type for e in events] == ["deadline_exceeded", "run_failed"]
    assert failed.failure == FailureInfo(
        "DeadlineExceeded", "its deadline passed", "paused", passed
    )
    back, retried = Lifecycle(failed).apply("retry")
    assert back.state == "paused"
    assert back.deadline is None
    assert retried[0].data["deadline_cleared"] is True
