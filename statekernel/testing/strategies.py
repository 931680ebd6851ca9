"""Hypothesis strategies for statekernel's records (needs ``hypothesis`` installed).

``runs()`` builds runs that look like real ones (requests that are prefixes of the
transcript, results that are in it, tool call records matching the model's calls)
but also odd ones, so both the common and the rare shapes round-trip.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
from hypothesis import strategies as st

from statekernel._lifecycle.chart import EVENTS, RunLifecycle
from statekernel._records.events import PERSISTED_EVENTS, Event
from statekernel._records.fallback import FALLBACK_KINDS, Fallback
from statekernel._records.limits import LIMIT_NAMES, Limits
from statekernel._records.messages import (
    ContentPart,
    ImagePart,
    Message,
    ModelRequest,
    ModelResult,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
)
from statekernel._records.pauses import (
    Ask,
    ChildPause,
    ChildWait,
    HookPause,
    LimitReached,
    MaxTurns,
    PauseDetails,
    Question,
    Rerun,
    ResolvedError,
    ResolvedOutput,
    Uncertain,
    UncertainCall,
)
from statekernel._records.run import (
    STATE_IDS,
    FailureInfo,
    PauseInfo,
    Run,
    StateId,
    ToolCallRecord,
    Turn,
)
from statekernel._records.values import json_problem

__all__ = [
    "HOOK_ANSWERS",
    "MODEL_ANSWER_TOOLS",
    "Answer",
    "api_calls",
    "checkpoints_for",
    "content_parts",
    "datetimes",
    "events",
    "fallbacks",
    "forged",
    "hook_answers",
    "json_values",
    "lifecycle_payloads",
    "lifecycle_runs",
    "lifecycle_steps",
    "limits",
    "messages",
    "model_answers",
    "model_requests",
    "model_results",
    "model_tool_calls",
    "pause_details",
    "runs",
    "sequence_ops",
    "stream_answers",
    "texts",
    "tool_call_records",
    "turns",
    "usages",
    "wrong_values",
]

LifecycleStep = tuple[Run, str, dict[str, Any], bool]
"""A run, an event, its payload (``at`` included) and ``join``."""

_IDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
_STATES = st.sampled_from(STATE_IDS)


@functools.cache
def texts(max_size: int = 40) -> st.SearchStrategy[str]:
    """Text of any Unicode (no lone surrogates), sometimes long enough to be stored apart."""
    short = st.text(st.characters(codec="utf-8"), max_size=max_size)
    long = st.builds(lambda s, n: (s or "x") * n, short, st.integers(10, 60))
    return st.one_of(short, short, long)


@functools.cache
def datetimes() -> st.SearchStrategy[datetime]:
    """Aware datetimes, mostly UTC, sometimes with another offset."""
    plain = st.datetimes(
        min_value=datetime(1950, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    )
    offset = st.builds(
        lambda d, m: d.replace(tzinfo=timezone(timedelta(minutes=m))),
        st.datetimes(min_value=datetime(1950, 1, 1), max_value=datetime(2200, 1, 1)),
        st.integers(-900, 900),
    )
    return st.one_of(plain, plain, offset)


_KEYS = st.one_of(st.text(max_size=8), st.sampled_from(["$b", "$v", "$e", "$r", "$", "a"]))
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False),
    texts(),
)


@functools.cache
def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """JSON values (dicts with str keys, lists), including keys that look like markers."""
    return st.recursive(
        _SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


@functools.cache
def _arguments() -> st.SearchStrategy[str]:
    as_json = st.dictionaries(st.text(max_size=6), json_values(4), max_size=3).map(json.dumps)
    return st.one_of(as_json, as_json, texts(), st.just(""), st.just("[1, 2"))


@functools.cache
def content_parts() -> st.SearchStrategy[ContentPart]:
    """Every kind of content part."""
    opt = st.none() | texts()
    return st.one_of(
        st.builds(TextPart, texts()),
        st.builds(ImagePart, opt, opt, st.none() | st.sampled_from(["image/png", "image/jpeg"])),
        st.builds(ReasoningPart, texts(), opt, st.booleans()),
        st.builds(ToolCall, _IDS, _IDS, _arguments()),
        st.builds(ToolResult, _IDS, _IDS, texts(), st.booleans()),
    )


@functools.cache
def messages() -> st.SearchStrategy[Message]:
    """Messages of every role with 0-3 parts."""
    roles = st.sampled_from(["system", "user", "assistant", "tool"])
    return st.builds(
        Message, roles, st.lists(content_parts(), max_size=3).map(tuple), st.none() | _IDS
    )


@functools.cache
def usages() -> st.SearchStrategy[Usage]:
    """Token counts, some with a cost."""
    n = st.integers(0, 10**9)
    cost = st.none() | _AMOUNTS
    return st.one_of(st.just(Usage()), st.builds(Usage, n, n, n, n, n, cost))


def model_requests(transcript: Sequence[Message] = ()) -> st.SearchStrategy[ModelRequest]:
    """Requests whose messages are mostly a prefix of ``transcript``."""
    prefix = st.integers(0, len(transcript)).map(lambda n: transcript[:n])
    extra = st.lists(messages(), max_size=2).map(tuple)
    msgs = st.one_of(prefix, prefix, st.builds(lambda a, b: a + b, prefix, extra), extra)
    tools = st.lists(st.builds(ToolSpec, _IDS, texts(), json_values(6)), max_size=3).map(tuple)
    return st.builds(
        ModelRequest,
        st.sampled_from(["scripted/test", "openai/gpt-4o-mini"]),
        msgs,
        tools,
        st.none() | st.sampled_from(["auto", "none"]),
        st.none() | st.integers(1, 4096),
        st.none() | st.floats(0, 2),
        st.lists(texts(8), max_size=2).map(tuple),
        st.one_of(st.just({}), json_values(4)),
    )


def model_results(transcript: Sequence[Message] = ()) -> st.SearchStrategy[ModelResult]:
    """Results whose message is sometimes taken from ``transcript``."""
    msg = st.sampled_from(transcript) | messages() if transcript else messages()
    reasons = st.sampled_from(["stop", "tool_calls", "length", "content_filter", "error", "other"])
    return st.builds(ModelResult, msg, usages(), reasons, st.none() | st.just("m/x"))


def tool_call_records(call: ToolCall | None = None) -> st.SearchStrategy[ToolCallRecord]:
    """Records, for ``call`` when given (input parsed from its arguments when it parses)."""
    base = st.just(call) if call is not None else st.builds(ToolCall, _IDS, _IDS, _arguments())

    def parsed(c: ToolCall) -> Any:
        try:
            return c.parsed_arguments()
        except ValueError:
            return None

    def build(c: ToolCall, use_parsed: bool, other: Any, **kw: Any) -> ToolCallRecord:
        return ToolCallRecord(c.id, c.name, c.arguments, parsed(c) if use_parsed else other, **kw)

    opt_time = st.none() | datetimes()
    return st.builds(
        build,
        base,
        st.booleans(),
        json_values(4),
        output=json_values(6),
        error=st.none() | texts(),
        attempt=st.integers(0, 5),
        started_at=opt_time,
        finished_at=opt_time,
        skipped=st.none() | texts(8),
    )


_FIGURES = st.integers(0, 10**6)
_AMOUNTS = st.floats(0, 1000, allow_nan=False, allow_infinity=False)


def limits() -> st.SearchStrategy[Limits]:
    """Usage limits, each figure None or an int of at least 0 (the cost a float)."""
    figure = st.none() | _FIGURES
    return st.builds(Limits, figure, figure, figure, figure, st.none() | _AMOUNTS)


def fallbacks() -> st.SearchStrategy[Fallback]:
    """Fallback chains of two or three models, with some of the kinds they fall back on."""
    models = st.lists(st.sampled_from(_MODELS), min_size=2, max_size=3, unique=True)
    on = st.lists(st.sampled_from(FALLBACK_KINDS), min_size=1, max_size=3, unique=True)
    return st.builds(lambda ms, kinds: Fallback(*ms, on=kinds), models, on)


_MODELS = ["scripted/test", "openai/gpt-4o-mini", "anthropic/claude-sonnet-4", "ollama/qwen"]


def pause_details(max_leaves: int = 4) -> st.SearchStrategy[PauseDetails]:
    """Pause details of every kind, their JSON values from ``json_values(max_leaves)``."""
    ids = st.lists(_IDS, min_size=1, max_size=2).map(tuple)
    values = json_values(max_leaves)
    calls = st.builds(UncertainCall, _IDS, _IDS, values, st.integers(0, 5))
    resolution = st.one_of(
        st.builds(ResolvedOutput, st.integers(0, 5), values),
        st.builds(ResolvedError, st.integers(0, 5), texts(8)),
        st.builds(Rerun, st.integers(0, 5)),
    )
    ask = st.builds(Ask, ids, _IDS, values, st.none() | st.just({"type": "string"}))
    child = st.builds(ChildPause, texts(8), values)
    return st.one_of(
        st.builds(HookPause, st.just({}) | values),
        st.builds(MaxTurns, st.integers(0, 50), st.integers(0, 50)),
        st.builds(LimitReached, st.sampled_from(LIMIT_NAMES), st.integers(0, 99), _FIGURES),
        st.builds(LimitReached, st.just("cost"), _AMOUNTS, _AMOUNTS),
        st.builds(
            Uncertain,
            st.lists(calls, max_size=2).map(tuple),
            st.dictionaries(_IDS, resolution, max_size=2),
        ),
        st.builds(Question, st.lists(ask, min_size=1, max_size=2).map(tuple)),
        st.builds(ChildWait, ids, _IDS, _IDS, st.none() | child),
    )


@st.composite
def turns(draw: st.DrawFn, transcript: Sequence[Message] = (), index: int = 0) -> Turn:
    """A turn (completed or in progress) against ``transcript``."""
    request = draw(model_requests(transcript))
    result = draw(st.none() | model_results(transcript))
    calls = list(result.tool_calls) if result is not None else []
    records = [draw(tool_call_records(c)) for c in calls]
    records += draw(st.lists(tool_call_records(), max_size=1))
    split = sorted(draw(st.lists(st.integers(0, len(records)), min_size=2, max_size=2)))
    return Turn(
        index=index,
        request=request,
        result=result,
        model_attempts=draw(st.integers(0, 3)),
        model=draw(st.none() | st.sampled_from(_MODELS)) if result is not None else None,
        pending=tuple(records[: split[0]]),
        in_flight=tuple(records[split[0] : split[1]]),
        completed=tuple(records[split[1] :]),
    )


_TAGS = st.dictionaries(
    st.from_regex(r"[A-Za-z0-9_.:-]{1,64}", fullmatch=True),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=256),
    max_size=4,
)
"""A run's tags, as ``statekernel._records.tags`` allows them."""


@st.composite
def runs(draw: st.DrawFn, run_id: str | None = None) -> Run:
    """A run at some revision with a transcript, completed turns and maybe a turn in flight."""
    transcript = tuple(draw(st.lists(messages(), max_size=6)))
    n_turns = draw(st.integers(0, 3))
    done = tuple(draw(turns(transcript, i)) for i in range(n_turns))
    current = draw(st.none() | turns(transcript, n_turns))
    state = draw(_STATES)
    pause = st.builds(PauseInfo, texts(), _STATES, pause_details(4))
    return Run(
        run_id=run_id if run_id is not None else draw(_IDS),
        model=draw(st.sampled_from(["scripted/test", "openai/gpt-4o-mini"])),
        revision=draw(st.integers(0, 3)),
        state=state,
        context=draw(st.one_of(st.just({}), st.dictionaries(_KEYS, json_values(6), max_size=4))),
        messages=transcript,
        turns=done,
        current_turn=current,
        pause=draw(st.none() | pause),
        failure=draw(st.none() | st.builds(FailureInfo, _IDS, texts(), _STATES)),
        usage=draw(usages()),
        max_turns=draw(st.none() | st.integers(1, 100)),
        limits=draw(st.none() | limits()),
        fallback=draw(st.none() | fallbacks()),
        tool_calls_started=draw(st.integers(0, 9)),
        resume_value=draw(json_values(4)),
        pending_pause=draw(st.none() | pause),
        event_count=draw(st.integers(0, 5)),
        created_at=draw(datetimes()),
        updated_at=draw(datetimes()),
        tags=draw(_TAGS),
    )


def events(run_id: str, revision: int, first_seq: int) -> st.SearchStrategy[list[Event]]:
    """Persisted events of one commit, numbered from ``first_seq``."""
    kinds = st.sampled_from(sorted(PERSISTED_EVENTS)) | st.just("custom_event")
    data = st.one_of(st.just({}), st.dictionaries(_KEYS, json_values(4), max_size=3))
    one = st.tuples(kinds, data, datetimes())
    return st.lists(one, max_size=3).map(
        lambda items: [
            Event(k, run_id, revision, first_seq + i, d, at) for i, (k, d, at) in enumerate(items)
        ]
    )


def checkpoints_for(run: Run) -> list[Run]:
    """Revisions 0..n of a run growing to ``run``: one message or turn more per revision."""
    steps: list[Run] = []
    n_msg, n_turn = len(run.messages), len(run.turns)
    total = max(n_msg, n_turn)
    for rev in range(total + 1):
        steps.append(
            attrs.evolve(
                run,
                revision=rev,
                messages=run.messages[: min(rev, n_msg)],
                turns=run.turns[: min(rev, n_turn)],
                current_turn=run.current_turn if rev == total else None,
            )
        )
    return steps


# -- crash/resume fuzzing: scripted agents and crash schedules ------------------------


def agent_scripts(max_turns: int = 4) -> st.SearchStrategy[list[Any]]:
    """Scripts for ``statekernel.testing.fuzz_agent``: text, single and parallel tool
    calls (some failing, some invalid, some asking the user, some delegating to a child
    run), model errors; always ending with a text answer."""
    from statekernel.errors import ProviderUnavailable
    from statekernel.providers._scripted import Fail, Reply, call

    def tool_call(kind: str, n: int) -> ToolCall:
        if kind == "bad":
            return call("side_effect", '{"key": ')
        if kind == "ask":
            return call("ask", {"question": f"k{n}?"})
        if kind == "helper":
            return call("helper", {"task": f"k{n}"})
        return call(kind, {"key": f"k{n}"})

    kinds = st.sampled_from(["side_effect", "lookup", "explode", "bad", "ask", "helper"])
    calls = st.lists(st.tuples(kinds, st.integers(0, 3)), min_size=1, max_size=3).map(
        lambda items: [tool_call(kind, n) for kind, n in items]
    )
    text = texts(20).map(lambda t: Reply(text=t or "ok", chunk=3))
    error = st.builds(
        lambda then: Fail(ProviderUnavailable("overloaded", provider="scripted"), 1, then),
        st.one_of(text, calls.map(lambda cs: Reply(tool_calls=tuple(cs)))),
    )
    turn = st.one_of(calls, calls, text, error)
    return st.builds(lambda body, last: [*body, last], st.lists(turn, max_size=max_turns), text)


def crash_schedules(
    max_crashes: int = 3, max_commit: int = 24, max_other: int = 6
) -> st.SearchStrategy[list[Any]]:
    """Where simulated process deaths land: (point, nth arrival) pairs, at least one.

    Commits happen about six times per turn, model calls and tool effects a few
    times per run, so their arrival numbers are drawn from different ranges.
    """
    from statekernel.testing._faults import CrashAt

    commit = st.builds(
        CrashAt, st.sampled_from(["before_commit", "after_commit"]), st.integers(1, max_commit)
    )
    other = st.builds(
        CrashAt,
        st.sampled_from(["model_call", "mid_stream", "tool_after_effect"]),
        st.integers(1, max_other),
    )
    return st.lists(commit | other, min_size=1, max_size=max_crashes, unique=True)


def process_crash_schedules(max_crashes: int = 2, max_nth: int = 6) -> st.SearchStrategy[list[Any]]:
    """Deaths of a process that a store cannot see coming: in a model call, mid-stream or
    right after a tool's effect (for drives whose store is not wrapped, such as a
    worker's)."""
    from statekernel.testing._faults import CrashAt

    point = st.sampled_from(["model_call", "mid_stream", "tool_after_effect"])
    crash = st.builds(CrashAt, point, st.integers(1, max_nth))
    return st.lists(crash, min_size=1, max_size=max_crashes, unique=True)


# -- model answers that may not be dispatchable as they are ---------------------------

MODEL_ANSWER_TOOLS = ("echo", "flaky")
"""Tools that ``model_answers`` names (besides unknown and empty names)."""


@functools.cache
def _odd_arguments() -> st.SearchStrategy[str]:
    odd = st.sampled_from(
        ['{"a": NaN}', '{"a": 1e999}', '{"a": 18446744073709551616}', "[]", "null", '"x"']
    )
    deep = st.integers(90, 3000).map(lambda n: '{"a": ' + "[" * n + "]" * n + "}")
    return st.one_of(_arguments(), odd, deep)


@functools.cache
def model_tool_calls() -> st.SearchStrategy[ToolCall]:
    """Tool calls as a model may write them: repeated, empty or odd ids, unknown or
    empty tool names, arguments that are not JSON objects or cannot be stored."""
    ids = st.one_of(st.sampled_from(["", "a", "b", "call_0_1", "call_1_0"]), _IDS)
    names = st.one_of(st.sampled_from([*MODEL_ANSWER_TOOLS, "", "nope"]), _IDS)
    return st.builds(ToolCall, ids, names, _odd_arguments())


def model_answers(max_calls: int = 4) -> st.SearchStrategy[ModelResult | None]:
    """One model answer: text or none, and 0-``max_calls`` tool calls; None stands for
    a model call that fails (``ProviderUnavailable``)."""
    answer = _answers(0, max_calls)
    return st.one_of(answer, answer, answer, st.none())


@functools.cache
def _answers(min_calls: int, max_calls: int) -> st.SearchStrategy[ModelResult]:
    """Model answers with text or none and ``min_calls``-``max_calls`` tool calls."""
    return st.builds(
        lambda text, calls: ModelResult(
            Message.assistant(text, tool_calls=calls),
            finish_reason="tool_calls" if calls else "stop",
        ),
        st.one_of(st.just(""), texts(12)),
        st.lists(model_tool_calls(), min_size=min_calls, max_size=max_calls),
    )


def api_calls() -> st.SearchStrategy[str]:
    """A public API call to make on a run: ``run`` drives it; the others are commands
    (``resolve_*`` answers every uncertain call of the pause that way)."""
    return st.sampled_from(
        ["run", "run", "resume", "retry", "send", "resolve_output", "resolve_error", "rerun"]
    )


# -- lifecycle steps: a run, an event and its payload ---------------------------------


_ACTIVE: tuple[StateId, ...] = ("preparing_turn", "calling_model", "dispatching_tools")
_RETURNS_TO = st.sampled_from([*_ACTIVE, *_ACTIVE, *STATE_IDS])
"""Where a pause or failure returns: mostly a state it can return to, sometimes not."""

_TURN_SHAPES: dict[str, str] = {"calling_model": "asking", "dispatching_tools": "dispatching"}
"""The turn in progress a run in that state has (no turn in the other states)."""


_PLACES = ("pending", "in_flight", "completed")


@st.composite
def _dispatching_turn(draw: st.DrawFn, transcript: Sequence[Message], index: int) -> Turn:
    """A turn whose answer has tool calls, each pending, in flight or completed (half
    the time all completed: the turn can close)."""
    result = draw(_answers(1, 3))
    inputs = st.none() | json_values(3)
    records = [ToolCallRecord(c.id, c.name, c.arguments, draw(inputs)) for c in result.tool_calls]
    closing = draw(st.booleans())
    places = st.just("completed") if closing else st.sampled_from(list(_PLACES))
    lists: dict[str, list[ToolCallRecord]] = {"pending": [], "in_flight": [], "completed": []}
    for record in records:
        lists[draw(places)].append(record)
    return Turn(
        index=index,
        request=draw(model_requests(transcript)),
        result=result,
        model_attempts=draw(st.integers(1, 2)),
        pending=tuple(lists["pending"]),
        in_flight=tuple(lists["in_flight"]),
        completed=tuple(lists["completed"]),
    )


@st.composite
def _streaming_turn(draw: st.DrawFn, transcript: Sequence[Message], index: int) -> Turn:
    """A turn asking the model whose answer so far has calls that started (eager)."""
    answer = draw(_answers(1, 2)).message
    started = tuple(
        ToolCallRecord(c.id, c.name, c.arguments, draw(json_values(2)), attempt=1)
        for c in answer.tool_calls
    )
    request = draw(model_requests(transcript))
    return Turn(index, request, model_attempts=1, in_flight=started, partial=answer)


def _turn_shaped(shape: str, transcript: Sequence[Message], index: int) -> Any:
    if shape == "asking":
        request = model_requests(transcript)
        asking = st.builds(Turn, st.just(index), request, model_attempts=st.integers(0, 2))
        return asking | _streaming_turn(transcript, index)
    if shape == "dispatching":
        return _dispatching_turn(transcript, index)
    return st.none()


@st.composite
def lifecycle_runs(draw: st.DrawFn, state: StateId | None = None) -> Run:
    """A small run resting in ``state`` (any when None), mostly shaped as the state
    expects (a turn asking the model, a turn dispatching calls, pause or failure info)
    and sometimes not; a pause or failure returns to any state, mostly an active one."""
    at: StateId = draw(_STATES) if state is None else state
    transcript = tuple(draw(st.lists(messages(), max_size=3)))
    done = tuple(draw(st.lists(turns(transcript), max_size=1)))
    expected = _TURN_SHAPES.get(at, "none")
    shapes = [expected, expected, expected, "none", "asking", "dispatching"]
    shape = draw(st.sampled_from(shapes))
    pause = st.builds(PauseInfo, texts(8), _RETURNS_TO, pause_details(3))
    failure = st.builds(FailureInfo, _IDS, texts(8), _RETURNS_TO)
    return Run(
        run_id=draw(_IDS),
        model="scripted/test",
        revision=draw(st.integers(0, 3)),
        state=at,
        messages=transcript,
        turns=done,
        current_turn=draw(_turn_shaped(shape, transcript, len(done))),
        pause=draw(_mostly(pause, at == "paused")),
        failure=draw(_mostly(failure, at == "failed")),
        max_turns=draw(st.none() | st.integers(1, 100)),
        pending_pause=draw(st.none() | pause),
        event_count=draw(st.integers(0, 5)),
    )


def _mostly(values: st.SearchStrategy[Any], expected: bool) -> st.SearchStrategy[Any]:
    """``values`` or None: mostly a value when ``expected``, mostly None otherwise."""
    if expected:
        return st.one_of(values, values, values, st.none())
    return st.one_of(st.none(), st.none(), values)


def _call_ids(run: Run) -> st.SearchStrategy[list[str]]:
    """Ids of the current turn's calls (unknown ones sometimes), none to three of them."""
    turn = run.current_turn
    known = [r.id for r in (*turn.pending, *turn.in_flight, *turn.completed)] if turn else []
    if not known:
        return st.lists(_IDS, max_size=2)
    ids = st.sampled_from(known)
    return st.lists(st.one_of(ids, ids, ids, _IDS), min_size=1, max_size=3) | st.just([])


def _finishing() -> dict[str, st.SearchStrategy[Any]]:
    """``finish`` and ``then_pause``: every combination of set and unset (``reask`` is
    for runs with an ``output_spec``, which these runs have not)."""
    pause = st.builds(PauseInfo, texts(8), _STATES, st.just(HookPause()))
    return {
        "finish": st.none() | st.sampled_from(["stop", "max_turns"]),
        "then_pause": st.none() | pause,
        "reask": st.none(),
    }


def _answered_by(run: Run) -> st.SearchStrategy[str | None]:
    """Who answered: the request's model (None) mostly, a model of the run's chain (or
    one that is not in it) sometimes."""
    chain = run.fallback.models if run.fallback is not None else ()
    return st.one_of(st.none(), st.none(), st.sampled_from([*chain, "other/model"]))


def _results(run: Run) -> st.SearchStrategy[ModelResult]:
    """Model results with and without tool calls."""
    return st.one_of(_answers(0, 0), _answers(1, 3), model_results(run.messages))


def _partials(run: Run) -> st.SearchStrategy[Message]:
    """Answers so far: the calls already started (or not), then one more call."""
    turn = run.current_turn
    started = turn.partial.tool_calls if turn is not None and turn.partial is not None else ()
    more = _answers(1, 1).map(lambda r: r.message.tool_calls)
    return st.builds(
        lambda keep, new: Message.assistant(tool_calls=[*(started if keep else ()), *new]),
        st.booleans(),
        more,
    )


def lifecycle_payloads(event: str, run: Run) -> st.SearchStrategy[dict[str, Any]]:
    """A payload for ``event`` sent to ``run`` (without ``at``), mostly one the transition
    accepts; call ids and results refer to the run's current turn or not."""
    fields: dict[str, dict[str, st.SearchStrategy[Any]]] = {
        "start": {},
        "turn_prepared": {"request": model_requests(run.messages)},
        "model_started": {},
        "model_completed": {
            "result": _results(run),
            **_finishing(),
            "answered_by": _answered_by(run),
        },
        "tool_call_started": {"call_ids": _call_ids(run), "call_input": json_values(4)},
        "early_call_started": {"partial": _partials(run), "call_input": json_values(4)},
        "answer_cut_off": {"reason": texts(12)},
        "tool_call_completed": {
            "call_ids": _call_ids(run),
            "output": json_values(4),
            "error": st.none() | texts(12),
            "resolved": st.booleans(),
            "context": st.none() | st.dictionaries(texts(6), json_values(2), max_size=3),
            "skipped": st.none() | texts(8),
        },
        "tools_completed": _finishing(),
        "pause": {"reason": texts(12), "details": pause_details(3)},
        "resume": {
            "value": json_values(3),
            "max_turns": st.none() | st.integers(1, 50),
            "limits": st.none() | limits(),
        },
        "fail": {"error": _IDS, "message": texts(12)},
        "retry": {},
        "input": {"messages": st.lists(messages(), max_size=2)},
    }
    return st.fixed_dictionaries(fields.get(event, {}))


def _declared_events(state: str) -> list[str]:
    chart_state = next(s for s in RunLifecycle.states if s.value == state)
    return sorted({str(e) for t in chart_state.transitions for e in t.events})


def _spoiled(payload: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``payload`` with a name missing or one too many (or as it is)."""
    missing = [{k: v for k, v in payload.items() if k != name} for name in payload]
    extra = {**payload, "state": "completed"}
    return st.sampled_from([payload, extra, *missing])


@st.composite
def lifecycle_steps(
    draw: st.DrawFn, state: StateId | None = None, event: str | None = None
) -> LifecycleStep:
    """A run (in ``state`` when given), an event (``event`` when given), its payload with
    ``at``, and ``join``.

    The event is mostly one the chart declares from the run's state; sometimes any
    event or an unknown one. One payload in eight has a name missing or one too many.
    """
    run = draw(lifecycle_runs(state))
    if event is None:
        declared = st.sampled_from(_declared_events(run.state))
        anything = st.sampled_from([*sorted(EVENTS), "explode"])
        event = draw(st.one_of(declared, declared, declared, anything))
    payload = draw(lifecycle_payloads(event, run))
    if draw(st.integers(0, 7)) == 0:
        payload = draw(_spoiled(payload))
    return run, event, {**payload, "at": draw(datetimes())}, draw(st.booleans())


SequenceOp = tuple[str, int, int, int]
"""``(op, source, a, b)``: ``"grow"`` or ``"add"`` ``b`` new items to sequence
``source`` (``a`` chooses a tuple or a ``LazyTuple`` operand), ``"radd"`` a tuple of
``b`` items before it, ``"slice"`` it as ``[a:b]``, ``"step"`` it as ``[a::2]``.
``source`` is taken modulo the number of sequences made so far."""


def sequence_ops(max_size: int = 60) -> st.SearchStrategy[list[SequenceOp]]:
    """Programs of grows, appends, prepends and slices over a growing pool of sequences,
    with grows (the operation a transcript grows by) the most likely."""
    op = st.sampled_from(["grow", "grow", "grow", "grow", "add", "add", "radd", "slice", "step"])
    small = st.integers(-4, 40)
    return st.lists(
        st.tuples(op, st.integers(0, 1000), small, st.integers(0, 40)), max_size=max_size
    )


# -- values handed to the kernel by hooks and providers, right and wrong --------------


@attrs.frozen
class Answer:
    """A hook's answer or a provider's stream for the property on values at the door:
    ``make`` turns the hook's argument (the request, the result, the tool call record,
    the turn) into the answer; ``wrong``: whether the kernel must refuse it."""

    label: str
    wrong: bool
    make: Callable[[Any], Any] = attrs.field(repr=False, eq=False)


def forged(record: Any, **fields: Any) -> Any:
    """A copy of the frozen record ``record`` with ``fields`` set as they are, past its
    converters and validators (a value that reaches the kernel however it was built)."""
    copied = copy.copy(record)
    for name, value in fields.items():
        object.__setattr__(copied, name, value)
    return copied


@functools.cache
def wrong_values() -> st.SearchStrategy[Any]:
    """Values no record field takes: bytes, sets, floats that are no JSON, integers beyond
    64 bits, dicts with keys that are not strings, objects."""
    return st.one_of(
        st.binary(max_size=3),
        st.frozensets(st.integers(0, 3), max_size=2),
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.integers(2**63, 2**70),
        st.dictionaries(st.integers(0, 3), st.integers(), min_size=1, max_size=1),
        st.builds(object),
    )


def _not(kinds: tuple[type, ...], *extra: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Wrong values for a field of ``kinds`` (ints, floats, strings, None... not of them)."""
    others = st.one_of(
        st.none(), st.booleans(), st.integers(-5, 5), st.floats(-2, 2), texts(6), wrong_values()
    )
    return st.one_of(others.filter(lambda v: type(v) not in kinds), *extra)


def _change(label: str, wrong: bool, field: str, values: st.SearchStrategy[Any]) -> Any:
    return values.map(
        lambda v: Answer(f"{label}.{field}={v!r:.40}", wrong, lambda r: forged(r, **{field: v}))
    )


def _raw(label: str) -> st.SearchStrategy[Answer]:
    """An answer that is no record at all."""
    return _not((type(None),)).map(lambda v: Answer(f"{label}: {v!r:.40}", True, lambda _: v))


def _storable(max_leaves: int) -> st.SearchStrategy[Any]:
    """JSON values a run stores exactly (no infinities, integers within 64 bits)."""
    return json_values(max_leaves).filter(lambda v: json_problem(v, "value") is None)


_KEEP = Answer("None", False, lambda _: None)
_COUNT = st.integers(0, 10**9)
_NOT_COUNT = st.one_of(
    _not((int,)), st.integers(max_value=-1), st.integers(2**63, 2**70), st.booleans()
)
_TEXT_OR_NONE = (str, type(None))
_NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


def _usages_wrong() -> st.SearchStrategy[Usage]:
    fields = st.sampled_from([f.name for f in attrs.fields(Usage) if f.name != "cost"])
    counts = st.builds(lambda f, v: forged(Usage(), **{f: v}), fields, _NOT_COUNT)
    costs = st.one_of(_not((float, type(None))), _NOT_FINITE, st.floats(max_value=-1e-9))
    return counts | costs.map(lambda v: forged(Usage(), cost=v))


def _request_answers() -> st.SearchStrategy[Answer]:
    label = "request"
    bad_messages = st.sampled_from(
        [("hi",), (forged(Message.user("hi"), role="robot"),), (Message("user", (TextPart(5),)),)]  # type: ignore[arg-type]
    )
    right = st.one_of(
        _change(label, False, "max_tokens", st.none() | st.integers(0, 2**63 - 1)),
        _change(label, False, "temperature", st.none() | st.floats(0, 2) | st.integers(0, 2)),
        _change(label, False, "options", _storable(4)),
        _change(label, False, "stop", st.lists(texts(6), max_size=2).map(tuple)),
        _change(label, False, "tool_choice", st.none() | texts(6)),
    )
    wrong = st.one_of(
        _change(label, True, "model", _not((str,))),
        _change(label, True, "max_tokens", _NOT_COUNT.filter(lambda v: v is not None)),
        _change(label, True, "temperature", _not((int, float, type(None)), _NOT_FINITE)),
        _change(label, True, "options", wrong_values()),
        _change(label, True, "stop", _not((str,)).map(lambda v: (v,))),
        _change(label, True, "tool_choice", _not(_TEXT_OR_NONE)),
        _change(label, True, "messages", bad_messages),
        _raw("request"),
    )
    return st.one_of(st.just(_KEEP), right, wrong)


def _result_answers() -> st.SearchStrategy[Answer]:
    label = "result"
    reasons = ("stop", "tool_calls", "length", "content_filter", "error", "other")
    bad_messages = st.sampled_from(
        [
            Message.user("not the model"),
            forged(Message.assistant("hi"), role="robot"),
            Message("assistant", (TextPart(b"hi"),)),  # type: ignore[arg-type]
            Message.assistant(tool_calls=[ToolCall("c", None, "{}")]),  # type: ignore[arg-type]
            "hi",
        ]
    )
    right = st.one_of(
        _change(label, False, "usage", usages()),
        _change(label, False, "finish_reason", st.sampled_from(reasons)),
        _change(label, False, "model", st.none() | texts(6)),
        _change(label, False, "message", texts(10).map(Message.assistant)),
    )
    wrong = st.one_of(
        _change(label, True, "usage", _usages_wrong()),
        _change(
            label, True, "finish_reason", _not((), texts(6)).filter(lambda v: v not in reasons)
        ),
        _change(label, True, "model", _not(_TEXT_OR_NONE)),
        _change(label, True, "message", bad_messages),
        _raw("result"),
    )
    return st.one_of(st.just(_KEEP), right, wrong)


def _decision_answers(allowed: Sequence[str]) -> st.SearchStrategy[Answer]:
    from statekernel._kernel.hooks import Continue, Finish, Pause, Rewrite, Skip

    made: dict[str, tuple[Any, Any]] = {
        # name: (right decisions, wrong ones: a field of the wrong type)
        "Continue": (st.just(Continue()), st.nothing()),
        "Finish": (
            texts(8).map(Finish),
            _not((str,)).map(lambda v: forged(Finish(), reason=v)),
        ),
        "Pause": (
            st.builds(Pause, texts(8), _storable(4)),
            st.one_of(
                _not((str,)).map(lambda v: forged(Pause("p"), reason=v)),
                wrong_values().map(lambda v: forged(Pause("p"), metadata={"m": v})),
            ),
        ),
        "Skip": (
            st.builds(Skip, _storable(4)) | texts(8).map(lambda error: Skip(error=error)),
            _not(_TEXT_OR_NONE).map(lambda v: forged(Skip(), error=v))
            | _storable(4)
            .filter(lambda v: v is not None)
            .map(lambda v: forged(Skip(), result=v, error="and an error")),
        ),
        "Rewrite": (
            st.builds(Rewrite, st.dictionaries(texts(4), _storable(2), max_size=2)),
            wrong_values().map(lambda v: forged(Rewrite({}), input={"item": v})),
        ),
    }
    options = []
    for name, (right, wrong) in made.items():
        if name in allowed:
            options.append(right.map(lambda d: Answer(repr(d)[:60], False, lambda _: d)))
            options.append(wrong.map(lambda d: Answer(repr(d)[:60], True, lambda _: d)))
        else:  # a decision this hook may not return
            options.append(right.map(lambda d: Answer(repr(d)[:60], True, lambda _: d)))
    return st.one_of(st.just(_KEEP), st.just(_KEEP), *options, _raw("decision"))


HOOK_ANSWERS = (
    "on_turn_prepared",
    "on_model_completed",
    "on_tool_call_started",
    "on_turn_completed",
)
"""The hooks whose answers ``hook_answers`` draws."""


def hook_answers(hook: str) -> st.SearchStrategy[Answer]:
    """Answers of ``hook``, right (None included) or wrong: a request or result with one
    field of the wrong type or range, a decision with one, a decision this hook may not
    return, or something that is no answer at all."""
    if hook == "on_turn_prepared":
        return _request_answers()
    if hook == "on_model_completed":
        return _result_answers()
    if hook == "on_tool_call_started":
        return _decision_answers(("Continue", "Rewrite", "Skip", "Pause", "Finish"))
    return _decision_answers(("Continue", "Pause", "Finish"))


def stream_answers(tool: str = "record") -> st.SearchStrategy[Answer]:
    """The stream parts of one model answer (``make`` ignores its argument): text or a
    call of ``tool``, usage and the end, sometimes with one part whose field has the
    wrong type or value, or with a part that is no stream part."""
    from statekernel._storage.provider import (
        StreamEnd,
        TextDelta,
        ToolCallDelta,
        ToolCallDone,
        UsageUpdate,
    )

    reasons = ("stop", "tool_calls", "length", "content_filter", "error", "other")
    body = st.one_of(
        texts(12).map(lambda t: [TextDelta(t)]),
        st.just([ToolCallDelta(0, "c1", tool, '{"item": "a"}')]),
        st.just([ToolCallDone(ToolCall("c2", tool, '{"item": "b"}'))]),
    )
    right = st.builds(
        lambda parts, usage, reason: [*parts, UsageUpdate(usage), StreamEnd(reason)],
        body,
        usages(),
        st.sampled_from(reasons),
    )
    bad_part = st.one_of(
        _not((str,)).map(lambda v: forged(TextDelta(""), text=v)),
        _not(_TEXT_OR_NONE).map(lambda v: forged(ToolCallDelta(0), id=v)),
        _not(_TEXT_OR_NONE).map(lambda v: forged(ToolCallDelta(0), name=v)),
        _NOT_COUNT.map(lambda v: forged(ToolCallDelta(0, "c", tool, "{}"), index=v)),
        _not((str,)).map(lambda v: ToolCallDone(forged(ToolCall("c", tool, "{}"), id=v))),
        _usages_wrong().map(UsageUpdate),
        _not((), texts(6)).filter(lambda v: v not in reasons).map(lambda v: StreamEnd(v)),
        _not(_TEXT_OR_NONE).map(lambda v: StreamEnd("stop", v)),
        _not((type(None),)),
    )
    wrong = st.builds(
        lambda parts, bad, at: [*parts[:at], bad, *parts[at:]],
        right,
        bad_part,
        st.integers(0, 3),
    )
    return st.one_of(
        right.map(lambda p: Answer(repr(p)[:80], False, lambda _: p)),
        wrong.map(lambda p: Answer(repr(p)[:80], True, lambda _: p)),
    )
