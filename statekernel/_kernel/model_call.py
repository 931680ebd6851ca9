"""The model call of one drive: the intent it answers, the call, and the calls started
early while the answer streams.

The model is called only right after this driver's own ``model_started`` landed: the
revision that commit made is the driver's *claim* (``ModelCall.claim``). Anything
staged since, or a head that moved on (a command, a reload, a commit of early calls),
means the last landed intent is not the one this call would answer: a fresh intent is
committed first, and the model is called on the next step. An intent found in the
store that this driver does not claim is a dead owner's: the model is called again
(``model_restarted``).

With eager dispatch (``DispatchPolicy(eager=True)``) a call whose arguments have
finished streaming starts before the answer ends: its intent lands with the answer so
far (``early_call_started``), then it runs (``statekernel._kernel.tool_calls``) while
the answer streams on. The first call that may not start then, and the calls after it,
wait for the answer's end.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs

from statekernel._kernel import hooks as hk
from statekernel._kernel import telemetry
from statekernel._kernel.dispatch import next_startable
from statekernel._kernel.driving import Driving, HookFailed, hook, turn_decision, turn_of
from statekernel._kernel.middleware import ModelCall as ModelInvocation
from statekernel._kernel.middleware import chain
from statekernel._kernel.output import output_decision
from statekernel._kernel.tool_calls import ToolCalls
from statekernel._lifecycle.matching import call_key
from statekernel._lifecycle.transitions import parse_call
from statekernel._records.checks import checked_result
from statekernel._records.events import Event
from statekernel._records.fallback import fallback_kind, models_after
from statekernel._records.limits import tool_limit_reached
from statekernel._records.messages import ModelResult, ToolCall, Usage
from statekernel._records.prices import priced
from statekernel._records.run import OUTPUT_INVALID, Run, ToolCallRecord, Turn
from statekernel._secrets import logger
from statekernel._storage.provider import (
    ReasoningDelta,
    ResultBuilder,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    UsageUpdate,
)
from statekernel.errors import CancelRequested, ConflictError, LeaseLost, StoreError

__all__ = ["ModelCall", "pump"]

_log = logger(__name__)


class ModelCall:
    """Calls the model for one driver, under the intent it claims."""

    def __init__(self, driver: Driving, calls: ToolCalls) -> None:
        self.driver = driver
        self.calls = calls
        self.claim: int | None = None
        """The revision at which this driver committed its ``model_started`` (None: it
        claims none, and the next call commits a fresh intent first)."""
        self.refused: BaseException | None = None
        """Why the last lease check before the call refused it (None once one passed)."""

    def claims(self, revision: int) -> bool:
        """Whether the intent this driver committed is the one at ``revision``."""
        return self.claim is not None and self.claim == revision

    def moved(self, committed: int, head: int) -> None:
        """A command committed ``head`` on top of this driver's last commit
        (``committed``): an intent claimed there stays claimed."""
        if self.claims(committed):
            self.claim = head

    async def call(self) -> AsyncIterator[Event]:
        """Stage the model's answer (or the intent to call it first): the effect of the
        state ``calling_model``. Yields live events while the answer streams."""
        driver = self.driver
        if turn_of(driver.run).partial is not None:  # calls started, the stream did not end here
            self.claim = None
            driver.stage("answer_cut_off", reason="the drive reading the answer stopped")
            return
        # Only right after this driver's own intent landed: ``claim`` is that revision.
        # Anything staged since, or a head that moved on, is not that intent.
        if driver.pending.open or self.claim != driver.run.revision:
            driver.stage("model_started")  # the intent lands before the call
            driver.pending.model_intent = True
            return
        run = driver.run
        turn = turn_of(run)
        holder: list[tuple[ModelResult, str | None]] = []
        self.calls.decided = {}
        try:
            work = self._result(run, turn, holder)
            check = functools.partial(driver.committer.check_cancel, run.run_id)
            async for live in pump(driver.queue, work, check):
                yield live
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except (HookFailed, StoreError, ConflictError, LeaseLost, CancelRequested):
            raise
        except Exception as exc:
            if self.refused is not None:  # whatever a middleware made of it
                raise self.refused from exc
            self.claim = None
            why = f"{type(exc).__name__}: {exc}"
            if turn_of(driver.run).partial is not None:
                driver.stage("answer_cut_off", reason=why)
            else:
                driver.stage("fail", error=type(exc).__name__, message=str(exc))
            return
        result, answered_by = holder[0]
        finish, then_pause = None, None
        if not result.tool_calls and not turn_of(driver.run).in_flight:
            finish, then_pause = await turn_decision(
                driver.kernel,
                driver.run,
                attrs.evolve(turn, result=result),
                default=result.finish_reason,
            )
        self.claim = None
        finish, reask, refused = output_decision(driver.run, result.message, finish, then_pause)
        driver.stage(
            "model_completed",
            result=result,
            finish=finish,
            then_pause=then_pause,
            reask=reask,
            answered_by=answered_by,
        )
        if refused is not None:
            driver.stage("fail", error=OUTPUT_INVALID, message=refused)

    async def _result(
        self, run: Run, turn: Turn, holder: list[tuple[ModelResult, str | None]]
    ) -> None:
        """Call the model (through the middleware) for ``turn``, and the next models of
        the run's ``Fallback`` chain while a call fails in a way it lists; the answer and
        the model of the chain that gave it (None: the request's) go to ``holder``."""
        driver = self.driver
        emit = driver.queue.put_nowait
        kernel = driver.kernel
        self.refused = None
        streams = 0

        async def terminal(call: ModelInvocation) -> ModelResult:
            nonlocal streams
            try:
                await driver.ensure_lease()  # the call starts only under a live lease
            except (LeaseLost, StoreError) as exc:
                self.refused = exc
                raise
            self.refused = None
            with telemetry.model_span(driver.trace_parent, run.run_id, call.request) as span:
                provider = kernel.registry.get(call.request.model)
                builder = ResultBuilder()
                early = _Early() if kernel.dispatch.eager and not streams else None
                streams += 1
                stream = provider.stream(call.request)
                try:
                    async for part in stream:
                        builder.add(part)
                        live = _live_event(run, turn, part)
                        if live is not None:
                            emit(live)
                        if early is not None and isinstance(part, ToolCallDelta | ToolCallDone):
                            await self._start_early(builder, early)
                finally:
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:
                        await aclose()
                result = builder.result()
                span.answered(result, kernel.prices)
                return result

        handler = chain(kernel.middleware, terminal)
        request, answered_by, spent = turn.request, None, Usage()
        later = list(models_after(run.fallback, request.model))
        while True:
            asked = request if answered_by is None else attrs.evolve(request, model=answered_by)
            failure, result = None, None
            try:
                result = checked_result(
                    await handler(ModelInvocation(run, asked)), "model result", total=run.usage
                )
            except Exception as exc:  # raised below, unless a fallback answers
                failure = exc
            kind = fallback_kind(failure, None if result is None else result.finish_reason)
            chain_on = run.fallback.on if run.fallback is not None else ()
            # never once anything of the answer landed (a call started while it streamed)
            if kind not in chain_on or not later or turn_of(driver.run).partial is not None:
                break
            _log.warning(
                "run %s turn %d: %s %s, falling back to %s",
                run.run_id, turn.index, asked.model, kind, later[0],
            )  # fmt: skip
            if result is not None:  # a refused answer's tokens, at its model's price
                spent += priced(result.usage, asked.model, kernel.prices)
            answered_by, streams = later.pop(0), 0
        if failure is not None:
            raise failure
        assert result is not None
        usage = priced(result.usage, asked.model, kernel.prices) + spent
        if usage != result.usage:
            result = attrs.evolve(result, usage=usage)
        hooked = await hook(kernel, "on_model_completed", run, result)
        if hooked is not None:
            if not isinstance(hooked, ModelResult):
                raise HookFailed(TypeError("on_model_completed must return a ModelResult or None"))
            result = hooked
        holder.append((result, answered_by))

    async def _start_early(self, builder: ResultBuilder, early: _Early) -> None:
        """Eager dispatch: start the calls whose arguments have finished streaming, in call
        order, while the dispatch rules allow. Each intent lands with the answer so far
        before its call starts; the first call that may not start now (the rules, a hook's
        decision, invalid arguments) and the calls after it wait for the answer's end."""
        driver, calls = self.driver, self.calls
        calls.raise_escaped()  # a call that took the process down stops everything
        tools, policy = driver.kernel.tools, driver.kernel.dispatch
        while not early.stopped and early.started < builder.complete_count():
            if driver.observing and calls.ready():
                break  # a result the hooks observe lands before anything else is decided
            if tool_limit_reached(driver.run.limits, driver.run.tool_calls_started):
                early.stopped = True  # the run pauses at dispatch, once the answer ended
                break
            call = builder.complete_call(early.started)
            record = early.record(call)
            if next_startable([record], calls.running(), tools, policy) is None:
                break  # tried again with the next part
            decision = await hook(driver.kernel, "on_tool_call_started", driver.run, record)
            call_input = decision.input if isinstance(decision, hk.Rewrite) else record.input
            if not (decision is None or isinstance(decision, hk.Continue | hk.Rewrite)):
                calls.decided[call.id] = (call_key(call.name, call.arguments), decision)
                early.stopped = True
            elif calls.precheck(record, call_input) is not None:
                # asked once: dispatch gives the error
                calls.decided[call.id] = (call_key(call.name, call.arguments), decision)
                early.stopped = True
            else:
                partial = builder.so_far(
                    [builder.complete_call(n) for n in range(early.started + 1)]
                )
                driver.stage("early_call_started", partial=partial, call_input=call_input)
                started = turn_of(driver.run).in_flight[-1]
                calls.intended([started.id], started.name, call_input)
                early.started += 1
        if driver.pending.intents:
            # Calls started while the answer streams: their intents land now (no effect
            # before its commit) while the model call goes on. That commit moves the
            # head past the ``model_started`` this call answers, so it counts as this
            # driver's model intent again: without it the next step would take the
            # moved head for someone else's and commit a second ``model_started``.
            driver.pending.model_intent = True
            for event in await driver.commit():  # shown as they land; the answer streams on
                driver.queue.put_nowait(event)


@attrs.define
class _Early:
    """Eager dispatch while one answer streams: how many of its calls started, and
    whether a call that could not start stopped the rest from starting early."""

    started: int = 0
    stopped: bool = False
    waiting: tuple[ToolCall, ToolCallRecord] | None = None
    """The next call and its parsed record, while the rules keep it waiting (parsed
    once, not again at each part that streams meanwhile)."""

    def record(self, call: ToolCall) -> ToolCallRecord:
        """``call`` as a record with its parsed input."""
        if self.waiting is None or self.waiting[0] is not call:
            parsed = ToolCallRecord(call.id, call.name, call.arguments, parse_call(call.arguments))
            self.waiting = (call, parsed)
        return self.waiting[1]


async def pump(
    queue: asyncio.Queue[Event | None],
    work: Awaitable[None],
    check: Callable[[], None] | None = None,
) -> AsyncIterator[Event]:
    """Run ``work`` while yielding the live events it puts on ``queue``; a wake-up
    (None) while it runs calls ``check``, which may raise to stop it (``work`` is then
    cancelled and waited for)."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(lambda _: queue.put_nowait(None))
    ended = False
    try:
        while True:
            item = await queue.get()
            if item is None:
                if task.done():
                    ended = True
                    break
                if check is not None:
                    check()
                continue
            yield item
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
        if not ended and not task.cancelled():
            task.result()  # a failure of the work is raised, never dropped
    while not queue.empty():
        item = queue.get_nowait()
        if item is not None:
            yield item
    task.result()


def _live_event(run: Run, turn: Turn, part: object) -> Event | None:
    kind: str
    data: dict[str, Any]
    if isinstance(part, TextDelta):
        kind, data = "text_delta", {"text": part.text}
    elif isinstance(part, ReasoningDelta):
        kind, data = "reasoning_delta", {"text": part.text}
    elif isinstance(part, ToolCallDelta):
        kind = "tool_call_delta"
        data = {"index": part.index, "id": part.id, "name": part.name, "arguments": part.arguments}
    elif isinstance(part, UsageUpdate):
        kind, data = (
            "usage",
            {"input_tokens": part.usage.input_tokens, "output_tokens": part.usage.output_tokens},
        )
    else:
        return None
    data["turn"] = turn.index
    return Event(kind, run.run_id, run.revision, -1, data)
