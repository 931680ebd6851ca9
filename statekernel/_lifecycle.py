"""The run lifecycle: a flat ``python-statemachine`` chart and the cell it drives.

The chart decides *whether* an event is allowed and *where* it leads (guards read
the run and the event's payload); the pure functions in ``_transitions`` build the
next run. Where a paused or failed run returns to is data in ``Run`` (the library
keeps history on the machine object, which is not durable).
"""

from __future__ import annotations

from typing import Any

import attrs
from statemachine import State, StateChart
from statemachine.exceptions import TransitionNotAllowed

from statekernel import _transitions as tr
from statekernel._events import Event
from statekernel._messages import JSON, Message, ModelRequest, ModelResult
from statekernel._run import STATE_IDS, PauseInfo, Run, StateId, utcnow
from statekernel.errors import CorruptCheckpoint, InvalidTransition

__all__ = ["EVENTS", "Lifecycle", "RunLifecycle"]


class _Cell:
    """The machine's mutable model around an immutable ``Run``.

    ``state`` is the machine's view of ``Run.state``: the chart sets it when it
    enters a state, and ``Lifecycle.apply`` folds it into the next run together
    with the revision (one ``evolve`` per transition). Transition actions stage the
    next run in ``run`` and their events in ``events``.
    """

    __slots__ = ("events", "run", "state")

    def __init__(self, run: Run) -> None:
        self.run = run
        self.state: StateId = run.state
        self.events: list[tuple[str, dict[str, Any]]] = []

    def reset(self, run: Run) -> None:
        self.run = run
        self.state = run.state
        self.events = []


class RunLifecycle(StateChart[_Cell]):
    """Init -> PreparingTurn -> CallingModel -> DispatchingTools -> ... -> Completed.

    Paused and Failed remember the state to return to in the run's data.
    """

    catch_errors_as_events = False
    atomic_configuration_update = True
    allow_event_without_transition = False
    enable_self_transition_entries = False

    init = State("Init", value="init", initial=True)
    preparing_turn = State("PreparingTurn", value="preparing_turn")
    calling_model = State("CallingModel", value="calling_model")
    dispatching_tools = State("DispatchingTools", value="dispatching_tools")
    paused = State("Paused", value="paused")
    failed = State("Failed", value="failed")
    completed = State("Completed", value="completed")

    start = init.to(preparing_turn)
    turn_prepared = preparing_turn.to(calling_model)
    model_started = calling_model.to.itself(internal=True)  # type: ignore[no-untyped-call]
    model_completed = (
        calling_model.to(dispatching_tools, cond="has_tool_calls")
        | calling_model.to(completed, cond="finishing")
        | calling_model.to(preparing_turn)
    )
    tool_call_started = dispatching_tools.to.itself(internal=True)  # type: ignore[no-untyped-call]
    tool_call_completed = dispatching_tools.to.itself(internal=True)  # type: ignore[no-untyped-call]
    tools_completed = dispatching_tools.to(completed, cond="finishing") | dispatching_tools.to(
        preparing_turn
    )
    pause = preparing_turn.to(paused) | calling_model.to(paused) | dispatching_tools.to(paused)
    resume = (
        paused.to(preparing_turn, cond="pause_returns_to_preparing_turn")
        | paused.to(calling_model, cond="pause_returns_to_calling_model")
        | paused.to(dispatching_tools, cond="pause_returns_to_dispatching_tools")
    )
    fail = preparing_turn.to(failed) | calling_model.to(failed) | dispatching_tools.to(failed)
    retry = (
        failed.to(preparing_turn, cond="failure_returns_to_preparing_turn")
        | failed.to(calling_model, cond="failure_returns_to_calling_model")
        | failed.to(dispatching_tools, cond="failure_returns_to_dispatching_tools")
    )
    input = completed.to(preparing_turn) | paused.to(preparing_turn)

    # -- guards (read the run in the cell and the event payload) ----------------

    def has_tool_calls(self, result: ModelResult) -> bool:
        return bool(result.tool_calls)

    def finishing(self, finish: str | None, then_pause: PauseInfo | None) -> bool:
        return finish is not None and then_pause is None

    def _pause_to(self, target: str) -> bool:
        pause = self.model.run.pause
        return pause is not None and pause.resume_to == target

    def _failure_to(self, target: str) -> bool:
        failure = self.model.run.failure
        return failure is not None and failure.failed_in == target

    def pause_returns_to_preparing_turn(self) -> bool:
        return self._pause_to("preparing_turn")

    def pause_returns_to_calling_model(self) -> bool:
        return self._pause_to("calling_model")

    def pause_returns_to_dispatching_tools(self) -> bool:
        return self._pause_to("dispatching_tools")

    def failure_returns_to_preparing_turn(self) -> bool:
        return self._failure_to("preparing_turn")

    def failure_returns_to_calling_model(self) -> bool:
        return self._failure_to("calling_model")

    def failure_returns_to_dispatching_tools(self) -> bool:
        return self._failure_to("dispatching_tools")

    # -- actions: stage the next run built by a pure function -------------------

    def _stage(self, effects: tr.Effects) -> None:
        self.model.run, self.model.events = effects

    def on_start(self, at: Any) -> None:
        self._stage(tr.start(self.model.run, at))

    def on_turn_prepared(self, request: ModelRequest, at: Any) -> None:
        self._stage(tr.turn_prepared(self.model.run, request, at))

    def on_model_started(self, at: Any) -> None:
        self._stage(tr.model_started(self.model.run, at))

    def on_model_completed(
        self, result: ModelResult, finish: str | None, then_pause: PauseInfo | None, at: Any
    ) -> None:
        self._stage(tr.model_completed(self.model.run, result, finish, then_pause, at))

    def on_tool_call_started(self, call_ids: list[str], call_input: JSON, at: Any) -> None:
        self._stage(tr.tool_call_started(self.model.run, call_ids, call_input, at))

    def on_tool_call_completed(
        self, call_ids: list[str], output: JSON, error: str | None, resolved: bool, at: Any
    ) -> None:
        self._stage(tr.tool_call_completed(self.model.run, call_ids, output, error, resolved, at))

    def on_tools_completed(self, finish: str | None, then_pause: PauseInfo | None, at: Any) -> None:
        self._stage(tr.tools_completed(self.model.run, finish, then_pause, at))

    def on_pause(self, reason: str, metadata: JSON, at: Any) -> None:
        self._stage(tr.pause(self.model.run, reason, metadata, at))

    def on_resume(self, value: JSON, max_turns: int | None, at: Any) -> None:
        self._stage(tr.resume(self.model.run, value, max_turns, at))

    def on_fail(self, error: str, message: str, at: Any) -> None:
        self._stage(tr.fail(self.model.run, error, message, at))

    def on_retry(self, at: Any) -> None:
        self._stage(tr.retry(self.model.run, at))

    def on_input(self, messages: list[Message], at: Any) -> None:
        self._stage(tr.input_received(self.model.run, messages, at))


EVENTS: dict[str, frozenset[str]] = {
    "start": frozenset(),
    "turn_prepared": frozenset({"request"}),
    "model_started": frozenset(),
    "model_completed": frozenset({"result", "finish", "then_pause"}),
    "tool_call_started": frozenset({"call_ids", "call_input"}),
    "tool_call_completed": frozenset({"call_ids", "output", "error", "resolved"}),
    "tools_completed": frozenset({"finish", "then_pause"}),
    "pause": frozenset({"reason", "metadata"}),
    "resume": frozenset({"value", "max_turns"}),
    "fail": frozenset({"error", "message"}),
    "retry": frozenset(),
    "input": frozenset({"messages"}),
}
"""Every lifecycle event and the payload names it takes (all required)."""


class Lifecycle:
    """One run's lifecycle machine, built once and reused for every transition.

    ``apply`` sends one event and returns the next run (revision + 1) with the events
    to persist. A rejected or failing transition leaves the run exactly as it was.
    """

    __slots__ = ("_cell", "_machine")

    def __init__(self, run: Run) -> None:
        _check_state(run)
        self._cell = _Cell(run)
        self._machine = RunLifecycle(model=self._cell)

    @property
    def run(self) -> Run:
        """The run at the last applied (or reset) revision."""
        return self._cell.run

    def reset(self, run: Run) -> None:
        """Point the machine at ``run`` (a reload, or undoing a transition whose commit failed)."""
        _check_state(run)
        self._cell.reset(run)

    def allowed_events(self) -> list[str]:
        """Events the chart accepts from the current state (guards not evaluated)."""
        return [e.id for e in self._machine.allowed_events]

    def apply(
        self, event: str, *, join: bool = False, **payload: Any
    ) -> tuple[Run, tuple[Event, ...]]:
        """Send ``event`` with its payload; returns (next run, persisted events).

        The next run is at revision + 1, or, with ``join``, at the same revision: the
        transition joins the commit of the one before it (its events follow theirs).
        """
        before = self._cell.run
        expected = EVENTS.get(event)
        if expected is None:
            raise InvalidTransition(event, before.state, "unknown event")
        at = payload.pop("at", None) or utcnow()
        if set(payload) != expected:
            raise InvalidTransition(
                event, before.state, f"payload must be {sorted(expected)}, got {sorted(payload)}"
            )
        try:
            self._machine.send(event, at=at, **payload)
        except TransitionNotAllowed as exc:
            self._cell.reset(before)
            raise InvalidTransition(event, before.state) from exc
        except tr.Refused as exc:
            self._cell.reset(before)
            raise InvalidTransition(event, before.state, str(exc)) from exc
        except BaseException:  # a bug in a transition: it surfaces as itself
            self._cell.reset(before)
            raise
        staged, self._cell.events = self._cell.events, []
        revision = before.revision if join else before.revision + 1
        seq = before.event_count
        events = tuple(
            Event(kind, before.run_id, revision, seq + i, data, at)
            for i, (kind, data) in enumerate(staged)
        )
        run = attrs.evolve(
            self._cell.run,
            state=self._cell.state,
            revision=revision,
            updated_at=at,
            event_count=seq + len(events),
        )
        self._cell.run = run
        return run, events


def _check_state(run: Run) -> None:
    if run.state not in STATE_IDS:
        raise CorruptCheckpoint(f"run {run.run_id!r} has unknown state {run.state!r}")
