"""Pure transition actions: (run, payload) -> (next run, events to persist).

No I/O here. The lifecycle chart calls these from its transition callbacks; the
chart itself moves ``Run.state``. Each function returns the run *without* the new
state, revision or event count, which the lifecycle sets once the chart accepted
the transition.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from statekernel._lifecycle.matching import call_key
from statekernel._records.limits import Limits
from statekernel._records.messages import JSON, Message, ModelRequest, ModelResult, ToolCall
from statekernel._records.pauses import PauseDetails, Question
from statekernel._records.run import (
    DEADLINE_EXCEEDED,
    OUTPUT_INVALID,
    PAUSE_TIMED_OUT,
    Cancellation,
    FailureInfo,
    PauseInfo,
    Run,
    ToolCallRecord,
    Turn,
)
from statekernel._records.values import merge_patch, parse_json
from statekernel._secrets import redact

__all__ = ["Effects", "Refused", "parse_call", "tool_result_text"]

Effects = tuple[Run, list[tuple[str, dict[str, Any]]]]
"""A transition's outcome: the next run and the (type, data) of its events."""


class Refused(ValueError):
    """The run does not allow this transition with this payload (the lifecycle reports
    it as ``InvalidTransition``); any other exception from a transition is a bug."""


NOT_RUN = "not run: {why}"
NOT_ANSWERED = "not answered: {why}"
OUTCOME_UNKNOWN = "outcome unknown: {why}; it may or may not have run"


def tool_result_text(record: ToolCallRecord) -> str:
    """The text fed back to the model for a completed call."""
    if record.error is not None:
        return record.error
    if isinstance(record.output, str):
        return record.output
    return json.dumps(record.output, ensure_ascii=False, separators=(",", ":"))


def _turn(run: Run) -> Turn:
    if run.current_turn is None:
        raise Refused("no turn in progress")
    return run.current_turn


def parse_call(arguments: str) -> JSON:
    """The arguments as a JSON object, or None (the call then gets an error result)."""
    if not arguments.strip():
        return {}
    value, problem = parse_json(arguments, "arguments")
    return value if problem is None and isinstance(value, dict) else None


def _unique_calls(result: ModelResult, index: int) -> tuple[ModelResult, dict[str, str]]:
    """``result`` with every tool call id unique and non-empty, and {new id: original}.

    A model may repeat an id or leave it empty; such a call is given ``call_<turn>_<n>``
    (its position in the answer), so the same answer always gets the same ids. The
    assistant message carries the new ids, so each tool result names a call of it.
    """
    calls = result.tool_calls
    taken = {c.id for c in calls}
    seen: set[str] = set()
    renamed: dict[str, str] = {}
    fixed: list[ToolCall] = []
    for n, call in enumerate(calls):
        if call.id and call.id not in seen:
            seen.add(call.id)
            fixed.append(call)
            continue
        new_id, k = f"call_{index}_{n}", 0
        while new_id in taken or new_id in seen:
            k += 1
            new_id = f"call_{index}_{n}_{k}"
        seen.add(new_id)
        renamed[new_id] = call.id
        fixed.append(attrs.evolve(call, id=new_id))
    if not renamed:
        return result, renamed
    replacements = iter(fixed)
    content = tuple(
        next(replacements) if isinstance(p, ToolCall) else p for p in result.message.content
    )
    message = attrs.evolve(result.message, content=content)
    return attrs.evolve(result, message=message), renamed


def start(run: Run, at: datetime) -> Effects:
    """init -> preparing_turn."""
    return run, [("run_started", {"model": run.model})]


def turn_prepared(run: Run, request: ModelRequest, at: datetime) -> Effects:
    """preparing_turn -> calling_model: the exact request of a new turn is fixed."""
    index = len(run.turns)
    turn = Turn(index=index, request=request)
    data = {"index": index, "model": request.model, "messages": len(request.messages)}
    data["tools"] = [t.name for t in request.tools]
    return attrs.evolve(run, current_turn=turn), [
        ("turn_started", {"index": index}),
        ("turn_prepared", data),
    ]


def model_started(run: Run, at: datetime) -> Effects:
    """calling_model self-transition: the intent to call the model is committed."""
    turn = _turn(run)
    kind = "model_restarted" if turn.model_attempts else "model_started"
    turn = attrs.evolve(turn, model_attempts=turn.model_attempts + 1)
    data = {"index": turn.index, "attempt": turn.model_attempts}
    return attrs.evolve(run, current_turn=turn), [(kind, data)]


def model_completed(
    run: Run,
    result: ModelResult,
    finish: str | None,
    then_pause: PauseInfo | None,
    reask: str | None,
    answered_by: str | None,
    at: datetime,
) -> Effects:
    """calling_model -> dispatching_tools | preparing_turn | completed.

    Calls that started while the answer streamed (eager dispatch) keep their place: they
    are the answer's first calls, whatever the final answer says there. With ``reask``
    (a final answer that does not satisfy the run's ``output_spec``), that user message
    follows the answer in the transcript and the next turn asks again. ``answered_by``:
    the model of the run's fallback chain that answered instead of the request's (None:
    the request's own model did)."""
    turn = _turn(run)
    result = _with_started(result, turn)
    if answered_by is None:
        return _answered(run, turn, result, finish, then_pause, {}, reask)
    if run.fallback is None or answered_by not in run.fallback.models:
        raise Refused(f"{answered_by!r} is not a model of the run's fallback chain")
    turn = attrs.evolve(turn, model=answered_by)
    return _answered(run, turn, result, finish, then_pause, {"model": answered_by}, reask)


def answer_cut_off(run: Run, reason: str, at: datetime) -> Effects:
    """calling_model -> dispatching_tools: the answer stopped streaming (its stream failed,
    or the drive that read it stopped) after calls it asked for had started. The answer
    committed with them is the turn's answer; the calls finish as any others do."""
    turn = _turn(run)
    if turn.partial is None:
        raise Refused("no answer was cut off: no call started while the model streamed")
    result = ModelResult(turn.partial, finish_reason="tool_calls")
    return _answered(run, turn, result, None, None, {"cut_off": redact(reason)}, None)


def _answered(
    run: Run,
    turn: Turn,
    result: ModelResult,
    finish: str | None,
    then_pause: PauseInfo | None,
    extra: dict[str, Any],
    reask: str | None,
) -> Effects:
    result, renamed = _unique_calls(result, turn.index)
    started = {r.id for r in turn.in_flight}
    pending = tuple(
        ToolCallRecord(id=c.id, name=c.name, arguments=c.arguments, input=parse_call(c.arguments))
        for c in result.tool_calls
        if c.id not in started
    )
    turn = attrs.evolve(turn, result=result, pending=pending, partial=None)
    messages = run.messages.grow((result.message,))
    run = attrs.evolve(run, messages=messages, usage=run.usage + result.usage)
    calls = [
        {"id": c.id, "name": c.name, "original_id": renamed[c.id]}
        if c.id in renamed
        else {"id": c.id, "name": c.name}
        for c in result.tool_calls
    ]
    data = {"index": turn.index, "finish_reason": result.finish_reason, "tool_calls": calls}
    events: list[tuple[str, dict[str, Any]]] = [("model_completed", {**data, **extra})]
    if pending or turn.in_flight:
        return attrs.evolve(run, current_turn=turn), events
    return _close_turn(run, turn, events, finish, then_pause, reask=reask)


def _with_started(result: ModelResult, turn: Turn) -> ModelResult:
    """``result`` whose first tool calls are the calls already started (in the order
    they started), followed by the calls it asked for that are not among them.

    A call of ``result`` is a started call when it asks for the same thing: the same
    tool with the same arguments as parsed JSON (``call_key``), never by its id or the
    text of its arguments (a retried answer may give the call another id, or another
    call the started one's id). Each started call matches at most one call of
    ``result``; a started call that nothing matches keeps its place all the same."""
    if turn.partial is None:
        return result
    started = list(turn.partial.tool_calls)
    unmatched = [(c, call_key(c.name, c.arguments)) for c in started]
    others: list[Any] = []
    later: list[ToolCall] = []
    for part in result.message.content:
        if not isinstance(part, ToolCall):
            others.append(part)
            continue
        key = call_key(part.name, part.arguments)
        same = next((u for u in unmatched if key is not None and u[1] == key), None)
        if same is not None:
            unmatched.remove(same)
        else:
            later.append(part)
    finish = result.finish_reason if result.finish_reason != "stop" else "tool_calls"
    message = attrs.evolve(result.message, content=(*others, *started, *later))
    return attrs.evolve(result, message=message, finish_reason=finish)


def early_call_started(run: Run, partial: Message, call_input: JSON, at: datetime) -> Effects:
    """calling_model self-transition (eager dispatch): the answer so far, ending with a
    call whose arguments have finished streaming, and the intent to run that call are
    committed together before it starts. The answer's earlier calls started before."""
    turn = _turn(run)
    if partial.role != "assistant" or not partial.tool_calls:
        raise Refused("the answer so far must be an assistant message ending with a call")
    fixed, _ = _unique_calls(ModelResult(partial, finish_reason="tool_calls"), turn.index)
    calls = fixed.tool_calls
    earlier = [c.id for c in calls[:-1]]
    started = [r.id for r in turn.in_flight]
    if earlier != started or turn.result is not None:
        raise Refused(f"the calls started so far are {started}, the answer so far has {earlier}")
    call = calls[-1]
    record = ToolCallRecord(
        id=call.id,
        name=call.name,
        arguments=call.arguments,
        input=call_input,
        attempt=1,
        started_at=at,
    )
    turn = attrs.evolve(turn, partial=fixed.message, in_flight=(*turn.in_flight, record))
    data = {"call_id": call.id, "name": call.name, "attempt": 1, "early": True}
    count = run.tool_calls_started + 1
    return attrs.evolve(run, current_turn=turn, tool_calls_started=count), [
        ("tool_call_started", data)
    ]


def _close_turn(
    run: Run,
    turn: Turn,
    events: list[tuple[str, dict[str, Any]]],
    finish: str | None,
    then_pause: PauseInfo | None = None,
    *,
    interrupted: str | None = None,
    at: datetime | None = None,
    reask: str | None = None,
) -> Effects:
    """Close ``turn``: the one way a turn ends, whether its calls completed, new input
    interrupted it, or it finishes or pauses the run.

    With ``interrupted`` (why the turn ends before its calls did), each call that did not
    finish gets a result first (``_unfinished``). Then, in the order the model made the
    calls, each call's context patch applies to the run's context and its result goes to
    the transcript; the turn joins the run's turns (``turn_completed`` names the calls
    whose patches applied)."""
    if interrupted is not None:
        turn = _unfinished(run, turn, interrupted, at)
    elif turn.pending or turn.in_flight:
        raise Refused("tool calls are still pending or in flight")
    context, patched = run.context, []
    for record in _in_call_order(turn):
        if record.context_patch is not None:
            context = merge_patch(context, record.context_patch)
            patched.append(record.id)
    added = _result_messages(turn)
    spec = run.output_spec
    if reask is not None:
        if spec is None or finish is not None:
            raise Refused("an answer is sent back only for a run with an output_spec")
        added = (*added, Message.user(reask))
        spec = attrs.evolve(spec, failures=spec.failures + 1)
    elif finish is not None and spec is not None and spec.failures:
        spec = attrs.evolve(spec, failures=0)
    run = attrs.evolve(
        run,
        messages=run.messages.grow(added),
        context=context,
        turns=run.turns.grow((turn,)),
        current_turn=None,
        pending_pause=then_pause,
        output_spec=spec,
    )
    data: dict[str, Any] = {"index": turn.index}
    if patched:
        data["context_patched_by"] = patched
    if reask is not None and spec is not None:
        data["output_rejected"] = spec.failures
    events.append(("turn_completed", data))
    if finish is not None and then_pause is None:
        events.append(("run_completed", {"reason": finish}))
    return run, events


def _unfinished(run: Run, turn: Turn, why: str, at: datetime | None) -> Turn:
    """``turn`` with a result for every call that did not finish: a call whose question
    waits for an answer is not answered, any other call that never started did not run,
    and one in flight has an unknown outcome."""
    details = run.pause.details if run.pause is not None else None
    asking: set[str] = set()
    if isinstance(details, Question):
        for ask in details.asks:
            asking.update(ask.calls)
    closed: list[ToolCallRecord] = []
    for record in turn.pending:
        closed.append(attrs.evolve(record, error=NOT_RUN.format(why=why), finished_at=at))
    for record in turn.in_flight:
        if record.id in asking:
            error = NOT_ANSWERED.format(why=why)
        else:
            error = OUTCOME_UNKNOWN.format(why=f"{why} while it was in flight")
        closed.append(attrs.evolve(record, error=error, finished_at=at))
    return attrs.evolve(turn, pending=(), in_flight=(), completed=(*turn.completed, *closed))


def _move(
    turn: Turn, ids: Sequence[str], sources: Sequence[str]
) -> tuple[Turn, list[ToolCallRecord]]:
    """Take the records with ``ids`` out of the ``sources`` lists of ``turn``."""
    wanted = set(ids)
    moved: list[ToolCallRecord] = []
    lists: dict[str, tuple[ToolCallRecord, ...]] = {}
    for name in sources:
        records: tuple[ToolCallRecord, ...] = getattr(turn, name)
        moved.extend(r for r in records if r.id in wanted)
        lists[name] = tuple(r for r in records if r.id not in wanted)
    if not wanted or len(moved) != len(wanted):
        missing = wanted - {r.id for r in moved}
        raise Refused(f"unknown or already finished tool calls: {sorted(missing)}")
    return attrs.evolve(turn, **lists), moved  # type: ignore[arg-type]


def tool_call_started(run: Run, call_ids: Sequence[str], call_input: JSON, at: datetime) -> Effects:
    """dispatching_tools self-transition: the intent to run these calls is committed.

    ``call_ids`` are one call and its identical duplicates; they run once, together.
    Calls come from ``pending``, or from ``in_flight`` when an idempotent call re-runs.
    """
    turn = _turn(run)
    turn, moved = _move(turn, call_ids, ("pending", "in_flight"))
    first = any(r.attempt == 0 for r in moved)  # a re-run is not another call
    moved = [attrs.evolve(r, input=call_input, attempt=r.attempt + 1, started_at=at) for r in moved]
    turn = attrs.evolve(turn, in_flight=(*turn.in_flight, *moved))
    events = [
        ("tool_call_started", {"call_id": r.id, "name": r.name, "attempt": r.attempt})
        for r in moved
    ]
    started = run.tool_calls_started + first
    return attrs.evolve(run, current_turn=turn, tool_calls_started=started), events


def tool_call_completed(
    run: Run,
    call_ids: Sequence[str],
    output: JSON,
    error: str | None,
    resolved: bool,
    context: JSON,
    skipped: str | None,
    at: datetime,
) -> Effects:
    """dispatching_tools self-transition: calls finished (or were skipped) with a result.

    ``resolved``: the result is an operator's answer about an uncertain call, not an
    execution (the record and the event say so). ``context``: the tool's context patch,
    kept on the record until the turn's calls have all completed (``tools_completed``).
    ``skipped``: the reason of a hook's ``Finish`` that kept the calls from running.
    """
    turn = _turn(run)
    turn, moved = _move(turn, call_ids, ("in_flight", "pending"))
    error = None if error is None else redact(error)  # the model reads it: no secret in it
    moved = [
        attrs.evolve(
            r,
            output=output,
            error=error,
            finished_at=at,
            resolved=resolved,
            context_patch=context,
            skipped=skipped,
        )
        for r in moved
    ]
    turn = attrs.evolve(turn, completed=(*turn.completed, *moved))
    events: list[tuple[str, dict[str, Any]]] = []
    for r in moved:
        data: dict[str, Any] = {"call_id": r.id, "name": r.name, "is_error": error is not None}
        if resolved:
            data["resolved"] = True
        if context is not None:
            data["context"] = sorted(context) if type(context) is dict else []
        events.append(("tool_call_completed", data))
    return attrs.evolve(run, current_turn=turn), events


def _in_call_order(turn: Turn) -> list[ToolCallRecord]:
    """The turn's completed calls in the order the model made them."""
    done = {r.id: r for r in turn.completed}
    order = turn.result.tool_calls if turn.result is not None else ()
    return [done[c.id] for c in order if c.id in done]


def _result_messages(turn: Turn) -> tuple[Message, ...]:
    return tuple(
        Message.tool(r.id, r.name, tool_result_text(r), is_error=r.error is not None)
        for r in _in_call_order(turn)
    )


def tools_completed(
    run: Run, finish: str | None, then_pause: PauseInfo | None, reask: str | None, at: datetime
) -> Effects:
    """dispatching_tools -> preparing_turn | completed: the turn closes (``_close_turn``):
    results go back in call order, and the calls' context patches apply to the run's
    context in that order."""
    turn = _turn(run)
    if turn.pending or turn.in_flight:
        raise Refused("tool calls are still pending or in flight")
    data: dict[str, Any] = {"index": turn.index, "calls": len(turn.completed)}
    events = [("tools_completed", data)]
    run, events = _close_turn(run, turn, events, finish, then_pause, reask=reask)
    closed = events[1][1]
    if "context_patched_by" in closed:
        data["context_patched_by"] = closed["context_patched_by"]
    return run, events


def pause(run: Run, reason: str, details: PauseDetails, at: datetime) -> Effects:
    """An active state -> paused, remembering where to return."""
    info = PauseInfo(reason=reason, resume_to=run.state, details=details)
    data = {"reason": reason, "resume_to": run.state, "metadata": info.metadata}
    nxt = attrs.evolve(run, pause=info, resume_value=None, pending_pause=None)
    return nxt, [("run_paused", data)]


def resume(
    run: Run, value: JSON, max_turns: int | None, limits: Limits | None, at: datetime
) -> Effects:
    """paused -> the saved state; ``max_turns`` and ``limits`` (None: as they were)
    replace the run's turn budget and usage limits."""
    if run.pause is None:
        raise Refused("paused run without pause info")
    budget = run.max_turns if max_turns is None else max_turns
    data: dict[str, Any] = {"reason": run.pause.reason, "resume_to": run.pause.resume_to}
    if max_turns is not None:
        data["max_turns"] = max_turns
    if limits is not None:
        data["limits"] = {k: v for k, v in attrs.asdict(limits).items() if v is not None}
    nxt = attrs.evolve(
        run,
        pause=None,
        resume_value=value,
        max_turns=budget,
        limits=run.limits if limits is None else limits,
    )
    return nxt, [("run_resumed", data)]


def fail(run: Run, error: str, message: str, at: datetime) -> Effects:
    """An active state -> failed, remembering where a retry returns."""
    message = redact(message)
    info = FailureInfo(error=error, message=message, failed_in=run.state)
    data = {"error": error, "message": message, "failed_in": run.state}
    return attrs.evolve(run, failure=info), [("run_failed", data)]


def cancel(run: Run, cancellation: Cancellation, at: datetime) -> Effects:
    """Any state but failed and completed -> failed, as asked by ``Kernel.cancel``
    (``run_cancelled``) or by the run's passed deadline (``deadline_exceeded``), then
    ``run_failed`` with the request's failure; a retry returns where it was stopped."""
    reason = redact(cancellation.reason)
    cancellation = attrs.evolve(cancellation, reason=reason)
    error = cancellation.error
    info = FailureInfo(error, reason, run.state, cancellation)
    asked = {"reason": reason, "by": cancellation.by, "requested_at": cancellation.at.isoformat()}
    failed = {"error": error, "message": reason, "failed_in": run.state}
    if error == PAUSE_TIMED_OUT:  # its timer_fired event says what was asked
        return attrs.evolve(run, failure=info), [("run_failed", failed)]
    kind = "deadline_exceeded" if error == DEADLINE_EXCEEDED else "run_cancelled"
    return attrs.evolve(run, failure=info), [(kind, asked), ("run_failed", failed)]


def retry(run: Run, at: datetime) -> Effects:
    """failed -> the state it failed in."""
    if run.failure is None:
        raise Refused("failed run without failure info")
    data: dict[str, Any] = {"error": run.failure.error, "resume_to": run.failure.failed_in}
    if run.failure.error == DEADLINE_EXCEEDED:  # retried on purpose: it goes on without one
        data["deadline_cleared"] = True
        return attrs.evolve(run, failure=None, deadline=None), [("run_retried", data)]
    if run.failure.error == OUTPUT_INVALID and run.output_spec is not None:
        spec = attrs.evolve(run.output_spec, failures=0)  # the answers it allows, again
        return attrs.evolve(run, failure=None, output_spec=spec), [("run_retried", data)]
    return attrs.evolve(run, failure=None), [("run_retried", data)]


def input_received(run: Run, messages: Sequence[Message], at: datetime) -> Effects:
    """completed | paused -> preparing_turn with new input appended.

    A turn interrupted by a pause is closed first, as every turn closes
    (``_close_turn``): calls that never finished get a result saying so, so the
    transcript stays valid for every provider, and the context patches of the calls that
    completed apply in call order.
    """
    events: list[tuple[str, dict[str, Any]]] = []
    turn = run.current_turn
    why = "the run received new input"
    if turn is not None and turn.partial is not None:  # calls started while it streamed
        run, events = answer_cut_off(run, why, at)
        turn = run.current_turn
    if turn is not None and turn.result is not None:
        run, events = _close_turn(run, turn, events, None, interrupted=why, at=at)
    elif turn is not None:
        run = attrs.evolve(run, current_turn=None)
    run = attrs.evolve(
        run, messages=run.messages.grow(messages), pause=None, failure=None, resume_value=None
    )
    roles = [m.role for m in messages]
    return run, [*events, ("input_received", {"messages": len(messages), "roles": roles})]
