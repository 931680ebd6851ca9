"""The run lifecycle: a flat ``python-statemachine`` chart, and the table that steps it.

``RunLifecycle`` is the one declaration of the lifecycle: the diagrams, the guards and
what a reader reads come from it. The chart decides *whether* an event is allowed and
*where* it leads (guards read the run and the event's payload); the pure functions in
``_lifecycle.transitions`` build the next run. Where a paused or failed run returns to is data in
``Run`` (the library keeps history on the machine object, which is not durable).

Sending an event through the library's engine costs about ten times the transition it
runs (an event queue, callback registries, argument binding per callback), and building
an engine costs more than several transitions. So when this module is imported, the
chart's own structures are read into ``TABLE``: for each state (``RunLifecycle.states``)
and each event of its transitions, the transitions in declaration order with their
target, ``internal`` flag and ``cond``/``unless`` guards. ``Lifecycle.apply`` steps
through the table as the engine does: the first transition whose guards all hold wins,
then the chart's ``on_<event>`` action runs and the run takes the target state. Guards
and actions are the chart's own methods, called with the payload names they declare.
The import fails if the chart uses what the table cannot express (validators, guard
expressions, enter/exit or before/after callbacks, nested, parallel or final states,
engine options that change the semantics). ``LibraryLifecycle`` still sends events
through the engine; the tests check that both give the same results.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NoReturn

import attrs
from statemachine import State, StateChart
from statemachine.exceptions import InvalidDefinition, TransitionNotAllowed

from statekernel._lifecycle import transitions as tr
from statekernel._records.events import Event
from statekernel._records.limits import Limits
from statekernel._records.messages import JSON, Message, ModelRequest, ModelResult
from statekernel._records.pauses import PauseDetails
from statekernel._records.run import STATE_IDS, Cancellation, PauseInfo, Run, StateId, utcnow
from statekernel.errors import CorruptCheckpoint, InvalidTransition

__all__ = [
    "ACTIONS",
    "DATA_CHANGES",
    "EVENTS",
    "PAYLOAD_DEFAULTS",
    "TABLE",
    "Action",
    "Guard",
    "LibraryLifecycle",
    "Lifecycle",
    "Route",
    "derive_table",
    "RunLifecycle",
]


class _Cell:
    """The machine's mutable model around an immutable ``Run``.

    ``state`` is the machine's view of ``Run.state``: the chart sets it when it
    enters a state, and ``Lifecycle.apply`` folds it into the next run together
    with the revision (one ``evolve`` per transition). Transition actions build the
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
    early_call_started = calling_model.to.itself(internal=True)  # type: ignore[no-untyped-call]
    model_completed = (
        calling_model.to(dispatching_tools, cond="has_tool_calls")
        | calling_model.to(completed, cond="finishing")
        | calling_model.to(preparing_turn)
    )
    answer_cut_off = calling_model.to(dispatching_tools)
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
    cancel = (
        init.to(failed)
        | preparing_turn.to(failed)
        | calling_model.to(failed)
        | dispatching_tools.to(failed)
        | paused.to(failed)
    )
    retry = (
        failed.to(init, cond="failure_returns_to_init")
        | failed.to(preparing_turn, cond="failure_returns_to_preparing_turn")
        | failed.to(calling_model, cond="failure_returns_to_calling_model")
        | failed.to(dispatching_tools, cond="failure_returns_to_dispatching_tools")
        | failed.to(paused, cond="failure_returns_to_paused")
    )
    input = completed.to(preparing_turn) | paused.to(preparing_turn)

    # -- guards (read the run in the cell and the event payload) ----------------

    def has_tool_calls(self, result: ModelResult) -> bool:
        turn = self.model.run.current_turn
        return bool(result.tool_calls) or (turn is not None and bool(turn.in_flight))

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

    def failure_returns_to_init(self) -> bool:
        return self._failure_to("init")

    def failure_returns_to_paused(self) -> bool:
        return self._failure_to("paused")

    def failure_returns_to_preparing_turn(self) -> bool:
        return self._failure_to("preparing_turn")

    def failure_returns_to_calling_model(self) -> bool:
        return self._failure_to("calling_model")

    def failure_returns_to_dispatching_tools(self) -> bool:
        return self._failure_to("dispatching_tools")

    # -- actions: the next run, built by a pure function --------------------------

    def _build(self, effects: tr.Effects) -> None:
        self.model.run, self.model.events = effects

    def on_start(self, at: Any) -> None:
        self._build(tr.start(self.model.run, at))

    def on_turn_prepared(self, request: ModelRequest, at: Any) -> None:
        self._build(tr.turn_prepared(self.model.run, request, at))

    def on_model_started(self, at: Any) -> None:
        self._build(tr.model_started(self.model.run, at))

    def on_model_completed(
        self,
        result: ModelResult,
        finish: str | None,
        then_pause: PauseInfo | None,
        reask: str | None,
        answered_by: str | None,
        at: Any,
    ) -> None:
        run = self.model.run
        self._build(tr.model_completed(run, result, finish, then_pause, reask, answered_by, at))

    def on_early_call_started(self, partial: Message, call_input: JSON, at: Any) -> None:
        self._build(tr.early_call_started(self.model.run, partial, call_input, at))

    def on_answer_cut_off(self, reason: str, at: Any) -> None:
        self._build(tr.answer_cut_off(self.model.run, reason, at))

    def on_tool_call_started(self, call_ids: list[str], call_input: JSON, at: Any) -> None:
        self._build(tr.tool_call_started(self.model.run, call_ids, call_input, at))

    def on_tool_call_completed(
        self,
        call_ids: list[str],
        output: JSON,
        error: str | None,
        resolved: bool,
        context: JSON,
        skipped: str | None,
        at: Any,
    ) -> None:
        run = self.model.run
        done = tr.tool_call_completed(run, call_ids, output, error, resolved, context, skipped, at)
        self._build(done)

    def on_tools_completed(
        self, finish: str | None, then_pause: PauseInfo | None, reask: str | None, at: Any
    ) -> None:
        self._build(tr.tools_completed(self.model.run, finish, then_pause, reask, at))

    def on_pause(self, reason: str, details: PauseDetails, at: Any) -> None:
        self._build(tr.pause(self.model.run, reason, details, at))

    def on_resume(self, value: JSON, max_turns: int | None, limits: Limits | None, at: Any) -> None:
        self._build(tr.resume(self.model.run, value, max_turns, limits, at))

    def on_fail(self, error: str, message: str, at: Any) -> None:
        self._build(tr.fail(self.model.run, error, message, at))

    def on_cancel(self, cancellation: Cancellation, at: Any) -> None:
        self._build(tr.cancel(self.model.run, cancellation, at))

    def on_retry(self, at: Any) -> None:
        self._build(tr.retry(self.model.run, at))

    def on_input(self, messages: list[Message], at: Any) -> None:
        self._build(tr.input_received(self.model.run, messages, at))


EVENTS: dict[str, frozenset[str]] = {
    "start": frozenset(),
    "turn_prepared": frozenset({"request"}),
    "model_started": frozenset(),
    "model_completed": frozenset({"result", "finish", "then_pause", "reask", "answered_by"}),
    "early_call_started": frozenset({"partial", "call_input"}),
    "answer_cut_off": frozenset({"reason"}),
    "tool_call_started": frozenset({"call_ids", "call_input"}),
    "tool_call_completed": frozenset(
        {"call_ids", "output", "error", "resolved", "context", "skipped"}
    ),
    "tools_completed": frozenset({"finish", "then_pause", "reask"}),
    "pause": frozenset({"reason", "details"}),
    "resume": frozenset({"value", "max_turns", "limits"}),
    "fail": frozenset({"error", "message"}),
    "cancel": frozenset({"cancellation"}),
    "retry": frozenset(),
    "input": frozenset({"messages"}),
}
"""Every lifecycle event and the payload names it takes (all required, but those with a
default in ``PAYLOAD_DEFAULTS``)."""

PAYLOAD_DEFAULTS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "model_completed": MappingProxyType({"answered_by": None}),
        "resume": MappingProxyType({"limits": None}),
    }
)
"""Payload names an event may be sent without, and the value they then take."""

DATA_CHANGES: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "context_updated": frozenset({"context"}),
        "tags_updated": frozenset({"tags"}),
        "tool_call_resolved": frozenset({"pause"}),
        "timer_fired": frozenset({"pause"}),
    }
)
"""Changes of a run's data that are not lifecycle transitions (``Lifecycle.change``): the
event each commits and the ``Run`` fields it replaces (all required); the state stays."""


# -- the table, read from the chart once -----------------------------------------------


@attrs.frozen
class Guard:
    """A ``cond`` guard (holds when the method returns a true value) or an ``unless``
    guard (holds when it returns a false one)."""

    name: str
    params: tuple[str, ...]
    """The payload names the method declares (``at`` included): the ones it is given."""
    expected: bool

    def holds(self, chart: RunLifecycle, kwargs: Mapping[str, Any]) -> bool:
        """Call the chart's guard method with the arguments it declares."""
        value = getattr(chart, self.name)(**{name: kwargs[name] for name in self.params})
        return bool(value) == self.expected


@attrs.frozen
class Route:
    """One transition of the chart: where it leads and the guards that must all hold.

    ``internal`` is kept as the chart declares it; with no enter/exit callbacks (the
    table refuses them) an internal transition and an external one do the same.
    """

    target: StateId
    guards: tuple[Guard, ...]
    internal: bool


@attrs.frozen
class Action:
    """The chart's ``on_<event>`` method and the payload names it declares."""

    name: str
    params: tuple[str, ...]

    def run(self, chart: RunLifecycle, kwargs: Mapping[str, Any]) -> None:
        """Call the chart's action method with the arguments it declares."""
        getattr(chart, self.name)(**{name: kwargs[name] for name in self.params})


Chart = type[StateChart[Any]]
"""A chart class the table is read from (``RunLifecycle``, or a variant in the tests)."""

_ENGINE_OPTIONS = {"catch_errors_as_events": False, "allow_event_without_transition": False}
"""Engine options the table assumes: errors propagate, an event no transition takes is
refused (``TransitionNotAllowed``)."""

_PARAMETER_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _unsupported(chart: Chart, what: str) -> NoReturn:
    raise InvalidDefinition(f"{chart.__name__}: {what}; the lifecycle table cannot step it")


def _method(chart: Chart, name: str) -> Callable[..., object] | None:
    """The plain function ``name`` of the chart, None when neither chart nor cell has it."""
    if hasattr(_Cell, name):
        _unsupported(chart, f"{name!r} is defined on the cell, where the engine would also call it")
    found = inspect.getattr_static(chart, name, None)
    if found is None:
        return None
    if not inspect.isfunction(found) or inspect.iscoroutinefunction(found):
        _unsupported(chart, f"{name!r} is not a plain method")
    return found


def _params(
    chart: Chart, name: str, method: Callable[..., object], given: frozenset[str]
) -> tuple[str, ...]:
    """The parameters of ``method`` after ``self``; each must be one of ``given``."""
    params = list(inspect.signature(method).parameters.values())[1:]
    for p in params:
        if p.kind not in _PARAMETER_KINDS or p.name not in given:
            _unsupported(chart, f"{name!r} takes {p}, which is not a payload name of its events")
    return tuple(p.name for p in params)


def _given(events: Iterable[str]) -> frozenset[str]:
    """The names every one of ``events`` passes to its callbacks."""
    sets = [EVENTS[e] | {"at"} for e in events]
    return frozenset.intersection(*sets)


def _guards(chart: Chart, transition: Any, events: list[str]) -> tuple[Guard, ...]:
    guards = []
    for spec in transition.cond:
        name = spec.func
        if spec.is_convention or not isinstance(name, str) or not name.isidentifier():
            _unsupported(chart, f"guard {spec!s} of {transition} is not a method name")
        method = _method(chart, name)
        if method is None:
            _unsupported(chart, f"guard {name!r} of {transition} is not a method of the chart")
        guards.append(
            Guard(name, _params(chart, name, method, _given(events)), spec.expected_value)
        )
    return tuple(guards)


def _check_callbacks(
    chart: Chart, specs: Iterable[Any], allowed: frozenset[str], owner: object
) -> None:
    """Only naming-convention callbacks the chart does not define, or ``allowed`` ones."""
    for spec in specs:
        if not spec.is_convention:
            _unsupported(chart, f"{owner} declares the callback {spec.func!r}")
        if spec.func not in allowed and _method(chart, spec.func) is not None:
            _unsupported(chart, f"{owner} has the callback {spec.func!r}")


def _check_state(chart: Chart, state: State) -> None:
    if state.states or state.parallel or state.final or state.is_history:
        _unsupported(chart, f"state {state.id!r} is nested, parallel, final or a history state")
    if state.value not in STATE_IDS:
        _unsupported(chart, f"state {state.id!r} has the value {state.value!r}, not a StateId")
    _check_callbacks(chart, [*state.enter, *state.exit, *state.invoke], frozenset(), state)


def _events_of(chart: Chart, transition: Any) -> list[str]:
    events = [str(e) for e in transition.events]
    if not events or any(e.delay for e in transition.events):
        _unsupported(chart, f"{transition} has no event or a delayed one")
    if unknown := set(events) - set(EVENTS):
        _unsupported(chart, f"{transition} takes events missing from EVENTS: {sorted(unknown)}")
    return events


def _route(chart: Chart, transition: Any) -> tuple[list[str], Route]:
    """The events that take ``transition`` and the route it becomes."""
    events = _events_of(chart, transition)
    if len(transition.targets) != 1 or list(transition.validators):
        _unsupported(chart, f"{transition} has validators or not exactly one target")
    _check_callbacks(chart, transition.before, frozenset(), transition)
    _check_callbacks(chart, transition.after, frozenset(), transition)
    _check_callbacks(chart, transition.on, frozenset(f"on_{e}" for e in events), transition)
    guards = _guards(chart, transition, events)
    route = Route(transition.target.value, guards, bool(transition.internal))
    return events, route


def _action(chart: Chart, event: str) -> Action | None:
    name = f"on_{event}"
    method = _method(chart, name)
    if method is None:
        return None
    return Action(name, _params(chart, name, method, _given([event])))


def _check_chart(chart: Chart) -> None:
    for option, value in _ENGINE_OPTIONS.items():
        if getattr(chart, option) != value:
            _unsupported(chart, f"{option} is not {value}")
    if chart._class_listeners:
        _unsupported(chart, "it has class listeners")
    _check_callbacks(chart, chart.prepare, frozenset(), "the chart")


def derive_table(chart: Chart) -> dict[tuple[StateId, str], tuple[Route, ...]]:
    """(state, event) -> the routes that event may take from that state, in order.

    Raises ``InvalidDefinition`` if ``chart`` uses what the table cannot express.
    """
    _check_chart(chart)
    table: dict[tuple[StateId, str], list[Route]] = {}
    for state in chart.states:
        _check_state(chart, state)
        for transition in state.transitions:
            if transition.initial:
                continue
            events, route = _route(chart, transition)
            for event in events:
                table.setdefault((state.value, event), []).append(route)
    if {s.value for s in chart.states} != set(STATE_IDS):
        _unsupported(chart, "its states are not STATE_IDS")
    if {event for _, event in table} != set(EVENTS):
        _unsupported(chart, "its events are not the ones in EVENTS")
    return {key: tuple(routes) for key, routes in table.items()}


TABLE: Mapping[tuple[StateId, str], tuple[Route, ...]] = MappingProxyType(
    derive_table(RunLifecycle)
)
"""(state, event) -> the chart's transitions for that event from that state, in order."""

ACTIONS: Mapping[str, Action | None] = MappingProxyType(
    {e: _action(RunLifecycle, e) for e in EVENTS}
)
"""event -> the chart's ``on_<event>`` action (None if the chart has none)."""

_ALLOWED: Mapping[StateId, tuple[str, ...]] = MappingProxyType(
    {s: tuple(dict.fromkeys(e for (source, e) in TABLE if source == s)) for s in STATE_IDS}
)


class _NoRoute(Exception):
    """No transition takes the event from the current state."""


def _select(routes: tuple[Route, ...], chart: RunLifecycle, kwargs: Mapping[str, Any]) -> Route:
    """The first route whose guards all hold (guards run in order, stopping at a miss)."""
    for route in routes:
        if all(guard.holds(chart, kwargs) for guard in route.guards):
            return route
    raise _NoRoute


def _unbuilt_chart(cell: _Cell) -> RunLifecycle:
    """A chart instance around ``cell`` whose ``__init__`` never ran: no engine, no
    configuration. The table calls the chart's guards and actions on it; they read and
    write only ``self.model``."""
    chart = RunLifecycle.__new__(RunLifecycle)
    chart.model = cell
    return chart


# -- the cell driver ---------------------------------------------------------------------


class Lifecycle:
    """One run's lifecycle, built once and reused for every transition.

    ``apply`` sends one event and returns the next run (revision + 1) with the events
    to persist. A rejected or failing transition leaves the run exactly as it was.
    Events are stepped through ``TABLE`` (see the module docstring).
    """

    __slots__ = ("_cell", "_chart")

    def __init__(self, run: Run) -> None:
        _check_run_state(run)
        self._cell = _Cell(run)
        self._chart = _unbuilt_chart(self._cell)

    @property
    def run(self) -> Run:
        """The run at the last applied (or reset) revision."""
        return self._cell.run

    def reset(self, run: Run) -> None:
        """Point the machine at ``run`` (a reload, or undoing a transition whose commit failed)."""
        _check_run_state(run)
        self._cell.reset(run)

    def allowed_events(self) -> list[str]:
        """Events the chart accepts from the current state (guards not evaluated)."""
        return list(_ALLOWED[self._cell.state])

    def apply(
        self, event: str, *, join: bool = False, **payload: Any
    ) -> tuple[Run, tuple[Event, ...]]:
        """Send ``event`` with its payload; returns (next run, persisted events).

        The next run is at revision + 1, or, with ``join``, at the same revision: the
        transition joins the commit of the one before it (its events follow theirs).
        """
        before = self._cell.run
        at = _checked_at(event, before.state, payload)
        try:
            self._step(event, at, payload)
        except _NoRoute:
            self._cell.reset(before)
            raise InvalidTransition(event, before.state) from None
        except TransitionNotAllowed as exc:
            self._cell.reset(before)
            raise InvalidTransition(event, before.state) from exc
        except tr.Refused as exc:
            self._cell.reset(before)
            raise InvalidTransition(event, before.state, str(exc)) from exc
        except BaseException:  # a bug in a transition: it surfaces as itself
            self._cell.reset(before)
            raise
        return self._fold(before, at, join)

    def change(
        self, kind: str, *, data: dict[str, Any], join: bool = False, **fields: Any
    ) -> tuple[Run, tuple[Event, ...]]:
        """A change of the run's data that is not a transition (``DATA_CHANGES``):
        ``fields`` replaced, the state kept, one event ``kind`` carrying ``data``;
        returns (next run, persisted events), at revisions as ``apply`` gives them."""
        before = self._cell.run
        expected = DATA_CHANGES.get(kind)
        if expected is None:
            raise InvalidTransition(kind, before.state, "unknown data change")
        at = fields.pop("at", None) or utcnow()
        if set(fields) != expected:
            raise InvalidTransition(
                kind, before.state, f"fields must be {sorted(expected)}, got {sorted(fields)}"
            )
        self._cell.run = attrs.evolve(before, **fields)
        self._cell.events = [(kind, data)]
        return self._fold(before, at, join)

    def _step(self, event: str, at: Any, payload: dict[str, Any]) -> None:
        """Run the transition in the cell: next run, its events, the target state."""
        payload["at"] = at
        route = _select(TABLE.get((self._cell.state, event), ()), self._chart, payload)
        action = ACTIONS[event]
        if action is not None:
            action.run(self._chart, payload)
        self._cell.state = route.target

    def _fold(self, before: Run, at: Any, join: bool) -> tuple[Run, tuple[Event, ...]]:
        """Fold the transition just run into the next run and number its events."""
        built, self._cell.events = self._cell.events, []
        revision = before.revision if join else before.revision + 1
        seq = before.event_count
        events = tuple(
            Event(kind, before.run_id, revision, seq + i, data, at)
            for i, (kind, data) in enumerate(built)
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


class LibraryLifecycle(Lifecycle):
    """``Lifecycle`` sending each event through python-statemachine's engine.

    Slower to build and to step; kept as the reference ``TABLE`` is tested against.
    """

    __slots__ = ("_machine",)

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self._machine = RunLifecycle(model=self._cell)

    def allowed_events(self) -> list[str]:
        """Events the engine accepts from the current state (guards not evaluated)."""
        return [e.id for e in self._machine.allowed_events]

    def _step(self, event: str, at: Any, payload: dict[str, Any]) -> None:
        self._machine.send(event, at=at, **payload)


def _checked_at(event: str, state: StateId, payload: dict[str, Any]) -> Any:
    """Check ``event`` and its payload names; pops and returns ``at`` (now if missing)."""
    expected = EVENTS.get(event)
    if expected is None:
        raise InvalidTransition(event, state, "unknown event")
    at = payload.pop("at", None) or utcnow()
    for name, value in PAYLOAD_DEFAULTS.get(event, {}).items():
        payload.setdefault(name, value)
    if set(payload) != expected:
        raise InvalidTransition(
            event, state, f"payload must be {sorted(expected)}, got {sorted(payload)}"
        )
    return at


def _check_run_state(run: Run) -> None:
    if run.state not in STATE_IDS:
        raise CorruptCheckpoint(f"run {run.run_id!r} has unknown state {run.state!r}")
