"""The tool calls of one drive: what is decided about each call, and running it.

``ToolCalls`` owns what a driver knows of its calls between commits, and keeps it
consistent:

* ``tasks``: calls running now, by the id of the first call of their group (identical
  calls run once); ``names``: the tool of every call this driver runs, holds a result
  of, or has staged the intent of (dispatch limits count them by name);
* ``unstarted``: calls whose intent landed while the drive was cancelled (their effect
  never began: the next drive starts them);
* ``outcomes``: results in hand, not yet committed (and calls that wait, for an
  answer or a child run: they pause the run);
* ``decided``: ``on_tool_call_started`` decisions taken while the answer streamed
  (eager dispatch) about calls that did not start then;
* ``unstored``: calls of tools that are not idempotent whose function ran and returned
  a value the store cannot hold: they have no result, stay in flight, and pause the run
  as uncertain (``_recover``), so ``resolve_tool_call`` says what they returned instead
  of the model being told they failed (an idempotent tool's is an error result).

A call's intent (``tool_call_started``) is staged first and the call starts only once
that commit landed (``start``); a result is staged as ``tool_call_completed`` and leaves
``outcomes`` once that commit landed (``landed``). A commit that did not land takes the
names of the calls whose intents it carried with it (``dropped``): none of them started.
Calls in flight that no task of this driver runs are a crash's remnants (``_recover``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Iterable
from typing import Any

from statekernel._kernel import hooks as hk
from statekernel._kernel import telemetry
from statekernel._kernel.asking import NeedsInput, asked, questions
from statekernel._kernel.delegate import ChildPaused
from statekernel._kernel.dispatch import identical_group, next_startable
from statekernel._kernel.driving import Driving, HookFailed, hook, turn_decision, turn_of
from statekernel._kernel.middleware import ToolInvocation, chain
from statekernel._kernel.output import output_decision
from statekernel._kernel.pending import Outcome
from statekernel._kernel.tools import Tool, ToolContext, ToolReturn, UnstorableResult
from statekernel._lifecycle.matching import call_key
from statekernel._records.events import Event
from statekernel._records.limits import tool_limit_reached
from statekernel._records.messages import JSON
from statekernel._records.pauses import (
    ChildPause,
    ChildWait,
    Rerun,
    Resolution,
    ResolvedError,
    Uncertain,
    UncertainCall,
    resolution_of,
)
from statekernel._records.run import (
    CHILD_PAUSED,
    INPUT_REQUIRED,
    LIMIT_REACHED,
    OUTPUT_INVALID,
    UNCERTAIN,
    Run,
    ToolCallRecord,
    Turn,
)
from statekernel._records.values import as_stored, parse_json
from statekernel._secrets import logger
from statekernel._storage.shielding import wait_ended
from statekernel.errors import (
    CancelRequested,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    StoreError,
    ToolError,
)

__all__ = ["Intent", "NOT_RUN_FINISHED", "ToolCalls"]

NOT_RUN_FINISHED = "not run: the run finished ({reason})"

_log = logger(__name__)

Intent = tuple[list[str], JSON]
"""A call to start: the ids of its group (identical calls run once) and its input."""


class ToolCalls:
    """The calls one driver decides about, runs, and holds the results of."""

    def __init__(self, driver: Driving) -> None:
        self.driver = driver
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.names: dict[str, str] = {}
        self.unstarted: dict[str, Intent] = {}
        """Intents that landed while the drive was cancelled: their effect never began."""
        self.outcomes: list[Outcome] = []
        self.decided: dict[str, tuple[Any, Any]] = {}
        """``on_tool_call_started`` decisions taken while the answer streamed (eager
        dispatch) about calls that did not start then, by call id, with what the call
        asked for (``call_key``): dispatch uses one for a call asking the same."""
        self.escaped: BaseException | None = None
        """What escaped a tool task (a process-ending exception), raised in the drive."""
        self.unstored: dict[str, tuple[int, str]] = {}
        """Calls that ran and returned a value the store cannot hold, by call id: the
        attempt and the type returned (what their uncertain pause says)."""

    # -- what the driver holds ---------------------------------------------------

    @property
    def busy(self) -> bool:
        """True while calls run, results are in hand or landed intents wait to start."""
        return bool(self.tasks or self.outcomes or self.unstarted)

    def running(self) -> list[str]:
        """The tools running now or about to start (their intents land with the commit
        being gathered), one name per call: what dispatch limits count."""
        running = [self.names[i] for i in self.tasks]
        return running + [self.names[ids[0]] for ids, _ in self.driver.pending.intents]

    def ready(self, *, asking: bool = False) -> list[Outcome]:
        """Results in hand not yet staged (``asking``: the calls that wait instead, for
        an answer or for a child run)."""
        staged = self.driver.pending.outcomes
        return [o for o in self.outcomes if o.waiting == asking and all(o is not s for s in staged)]

    async def narrow(self, live: set[str]) -> None:
        """Keep only what concerns the calls in flight in a newer head (``live``): their
        tasks run on and their results stay in hand; anything else lapses."""
        self.outcomes = [o for o in self.outcomes if live.issuperset(o.ids)]
        self.unstarted = {k: v for k, v in self.unstarted.items() if live.issuperset(v[0])}
        await self.stop(keep=live)

    def forget(self) -> None:
        """Drop results in hand and intents never started (the process is going down)."""
        self.outcomes.clear()
        self.unstarted.clear()

    async def stop(self, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Cancel running calls (but those of the calls in ``keep``) and wait until each
        has ended, even through a cancellation of the caller (a sync tool's thread
        cannot be stopped: this waits for it to return). Results in hand are kept."""
        tasks = [task for key, task in self.tasks.items() if key not in keep]
        for task in tasks:
            task.cancel()
        self.tasks = {key: task for key, task in self.tasks.items() if key in keep}
        held = {i for outcome in self.outcomes for i in outcome.ids} | set(keep)
        self.names = {i: name for i, name in self.names.items() if i in held}
        await wait_ended(tasks)

    def dropped(self, intents: Iterable[Intent]) -> None:
        """The commit carrying ``intents`` did not land: none of those calls started and
        the store never saw them, so they are not this driver's calls."""
        for ids, _ in intents:
            for call_id in ids:
                self.names.pop(call_id, None)

    def landed(self, outcomes: list[Outcome]) -> None:
        """The commit carrying ``outcomes`` landed: they leave the driver."""
        self.outcomes = [o for o in self.outcomes if all(o is not s for s in outcomes)]
        for outcome in outcomes:
            for call_id in outcome.ids:
                self.names.pop(call_id, None)

    def hold(self, intents: Iterable[Intent]) -> None:
        """Intents landed under a cancellation: the next drive starts their calls."""
        for ids, call_input in intents:
            self.unstarted[ids[0]] = (ids, call_input)

    def start(self, intents: Iterable[Intent]) -> None:
        """Start the calls whose intents just landed."""
        for ids, call_input in intents:
            self._spawn(ids, call_input)

    def raise_escaped(self) -> None:
        """Re-raise what escaped a tool task (a process-ending exception) in the driver."""
        if self.escaped is not None:
            escaped, self.escaped = self.escaped, None
            raise escaped

    async def wait(self) -> AsyncIterator[Event]:
        """Yield the live events of running calls until a result is in hand."""
        queue = self.driver.queue
        while not self.ready() and self.tasks and self.escaped is None:
            item = await queue.get()
            if item is not None:
                yield item
            else:
                self.driver.committer.check_cancel(self.driver.run.run_id)
        self.raise_escaped()

    # -- staging -----------------------------------------------------------------

    def stage_result(self, outcome: Outcome) -> None:
        """Stage ``tool_call_completed`` for ``outcome``: it leaves once that commit lands."""
        self.driver.stage(
            "tool_call_completed",
            call_ids=list(outcome.ids),
            output=outcome.output,
            error=outcome.error,
            resolved=outcome.resolved,
            context=outcome.context,
            skipped=outcome.skipped,
        )
        self.driver.pending.outcomes.append(outcome)

    def stage_intent(self, ids: list[str], call_input: JSON) -> None:
        """Stage ``tool_call_started`` for the group ``ids``: it starts once that commit lands."""
        record = turn_of(self.driver.run).call(ids[0])
        assert record is not None
        self.driver.stage("tool_call_started", call_ids=ids, call_input=call_input)
        self.intended(ids, record.name, call_input)

    def intended(self, ids: list[str], name: str, call_input: JSON) -> None:
        """The intent to run the group ``ids`` (of the tool ``name``) was staged."""
        for call_id in ids:
            self.names[call_id] = name
        self.driver.pending.intents.append((list(ids), call_input))

    # -- deciding ----------------------------------------------------------------

    async def dispatch(self) -> bool:
        """Stage what can be decided about the tools now; True when all that is left is
        to wait for calls still running."""
        driver = self.driver
        self.raise_escaped()
        ready = self.ready()
        if ready:  # results in hand go first, all of them in one commit
            for outcome in ready:
                self.stage_result(outcome)
            return False
        if self.unstarted:
            await self._check_kept_cancel()
        for ids, call_input in list(self.unstarted.values()):
            del self.unstarted[ids[0]]
            self._spawn(ids, call_input)
        turn = turn_of(driver.run)
        unowned = [r for r in turn.in_flight if r.id not in self.names]
        if unowned and not self.tasks:
            await self._recover(unowned)
            return False
        await self._start_ready()
        if driver.pending.must_commit(driver.observing) or driver.run.state != "dispatching_tools":
            return False
        if self.tasks:
            return True
        waiting = self.ready(asking=True)
        if waiting:  # nothing else runs now: pause for the first in call order
            self._stage_waiting(waiting)
            return False
        await self._end_tools(turn_of(driver.run))
        return False

    async def _check_kept_cancel(self) -> None:
        """Before held intents start (their commit landed in an earlier drive, which could
        not start them): ``CancelRequested`` when the store keeps a cancel request for the
        run, which no commit of this drive has met yet."""
        committer, run_id = self.driver.committer, self.driver.run.run_id
        request = await committer.kept_cancel(run_id)
        if request is not None:
            committer.cancelling = request
            committer.check_cancel(run_id)

    async def _end_tools(self, turn: Turn) -> None:
        if turn.pending or turn.in_flight:
            raise InvalidTransition("tools_completed", self.driver.run.state, "calls remain")
        default = next((r.skipped for r in turn.completed if r.skipped is not None), None)
        kernel, run = self.driver.kernel, self.driver.run
        finish, then_pause = await turn_decision(kernel, run, turn, default="stop")
        if default is not None and then_pause is None:
            finish = default
        elif finish == "stop" and then_pause is None:
            finish = None
        answer = turn.result.message if turn.result is not None else None
        finish, reask, refused = output_decision(run, answer, finish, then_pause)
        self.driver.stage("tools_completed", finish=finish, then_pause=then_pause, reask=reask)
        if refused is not None:
            self.driver.stage("fail", error=OUTPUT_INVALID, message=refused)

    async def _start_ready(self) -> None:
        """Decide about every call that may start now and stage what was decided (a
        result, a pause, or the intent to run it); intents land before their calls start
        (the commit lands before the next effect, ``PendingCommit.must_commit``)."""
        kernel = self.driver.kernel
        while self.driver.run.state == "dispatching_tools":
            turn = turn_of(self.driver.run)
            running = self.running()
            record = next_startable(turn.pending, running, kernel.tools, kernel.dispatch)
            if record is None or not await self._decide(record, turn):
                break

    async def _decide(self, record: ToolCallRecord, turn: Turn) -> bool:
        """Stage the decision about ``record``; False defers a pause until the calls
        already in flight have finished (so a pause never strands them)."""
        driver = self.driver
        kernel = driver.kernel
        reached = tool_limit_reached(driver.run.limits, driver.run.tool_calls_started)
        if reached is not None:  # no call starts past the limit; those running finish first
            if self.tasks or driver.pending.intents:
                return False
            driver.stage("pause", reason=LIMIT_REACHED, details=reached)
            return True
        early = self.decided.get(record.id)  # taken while the answer streamed
        if early is not None and early[0] == call_key(record.name, record.arguments):
            decision = early[1]
        else:
            decision = await hook(kernel, "on_tool_call_started", driver.run, record)
        ids = identical_group(record, turn.pending, kernel.tools, kernel.dispatch)
        call_input = record.input
        if isinstance(decision, hk.Pause) and (self.tasks or driver.pending.intents):
            return False
        self.decided.pop(record.id, None)
        if isinstance(decision, hk.Skip):
            self.stage_result(Outcome(tuple(ids), decision.result, decision.error))
            return True
        if isinstance(decision, hk.Pause):
            driver.stage("pause", reason=decision.reason, details=decision.details)
            return True
        if isinstance(decision, hk.Finish):
            why = NOT_RUN_FINISHED.format(reason=decision.reason)
            skipped = tuple(r.id for r in turn.pending)
            self.stage_result(Outcome(skipped, None, why, skipped=decision.reason))
            return True
        if isinstance(decision, hk.Rewrite):
            call_input = decision.input
        elif decision is not None and not isinstance(decision, hk.Continue):
            raise HookFailed(TypeError(f"on_tool_call_started cannot return {decision!r}"))
        problem = self.precheck(record, call_input)
        if problem is not None:
            self.stage_result(Outcome(tuple(ids), None, problem))
        else:
            self.stage_intent(ids, call_input)
        return True

    def precheck(self, record: ToolCallRecord, call_input: JSON) -> str | None:
        """Why ``record`` with ``call_input`` cannot run (the error result the model
        reads), or None: an unknown tool, arguments that are no JSON object or that the
        tool's own check refuses."""
        tools = self.driver.kernel.tools
        tool = tools.get(record.name)
        if tool is None:
            known = ", ".join(sorted(tools)) or "none"
            return f"unknown tool {record.name!r} (available: {known})"
        if call_input is None:
            _, problem = parse_json(record.arguments, "arguments")
            why = f"not a JSON object ({problem})" if problem else "not a JSON object"
            return f"invalid arguments for {record.name}: {why}: {record.arguments[:200]!r}"
        try:
            tool.validate(call_input)
        except ToolError as exc:
            return str(exc)
        except Exception as exc:  # a tool's own check: still a result the model reads
            return f"invalid arguments for {record.name}: {type(exc).__name__}: {exc}"
        return None

    async def _recover(self, unowned: list[ToolCallRecord]) -> None:
        """Calls in flight that no task of this driver runs (a crash's remnants): a
        resolution given for them is used, idempotent tools run again, and the others
        pause the run once nothing else can go on."""
        driver = self.driver
        resolutions = _given_resolutions(driver.run.resume_value)
        uncertain = []
        for record in unowned:
            resolution = resolutions.get(record.id)
            if resolution is not None and resolution.attempt != record.attempt:
                resolution = None
            tool = driver.kernel.tools.get(record.name)
            if resolution is not None and not isinstance(resolution, Rerun):
                if isinstance(resolution, ResolvedError):
                    outcome = Outcome((record.id,), None, resolution.error, resolved=True)
                else:
                    outcome = Outcome((record.id,), resolution.output, None, resolved=True)
                self.stage_result(outcome)
            elif resolution is not None or (tool is not None and tool.idempotent):
                self.stage_intent([record.id], record.input)
            else:
                uncertain.append(record)
        if driver.pending.intents:
            return  # they land before the calls start again
        # Results the hooks observe land first, in a commit of their own: the pause
        # for the uncertain calls comes in a later step, after the hooks saw them.
        observed_first = driver.observing and bool(driver.pending.outcomes)
        if uncertain and not observed_first:
            calls = tuple(self._uncertain(r) for r in uncertain)
            driver.stage("pause", reason=UNCERTAIN, details=Uncertain(calls))

    def _uncertain(self, record: ToolCallRecord) -> UncertainCall:
        """``record`` as an uncertain call, saying what it returned when it ran and its
        value could not be stored."""
        ran = self.unstored.get(record.id)
        returned = ran[1] if ran is not None and ran[0] == record.attempt else None
        return UncertainCall(record.id, record.name, record.input, record.attempt, returned)

    def _stage_waiting(self, waiting: list[Outcome]) -> None:
        """Pause for calls that wait: questions first (asked one after another, in call
        order), else the first paused child. Calls that wait for a child stay in
        flight: after the resume they run again (a delegate call is idempotent)."""
        calls = turn_of(self.driver.run).result
        order = [c.id for c in calls.tool_calls] if calls is not None else []
        waiting.sort(key=lambda o: order.index(o.ids[0]) if o.ids[0] in order else len(order))
        asks = [(o.ids, self.names[o.ids[0]], o.asked) for o in waiting if o.asked is not None]
        if asks:
            self.driver.stage("pause", reason=INPUT_REQUIRED, details=questions(asks))
        else:
            first = waiting[0]
            assert first.child is not None
            name = self.names[first.ids[0]]
            about = ChildWait(first.ids, name, first.child, first.child_pause)
            self.driver.stage("pause", reason=CHILD_PAUSED, details=about)

    # -- running -----------------------------------------------------------------

    def _spawn(self, ids: list[str], call_input: JSON) -> None:
        run = self.driver.run
        record = turn_of(run).call(ids[0])
        assert record is not None
        for call_id in ids:
            self.names[call_id] = record.name
        task = asyncio.ensure_future(self._execute(run, record, tuple(ids), call_input))
        self.tasks[ids[0]] = task

    async def _execute(
        self, run: Run, record: ToolCallRecord, ids: tuple[str, ...], call_input: JSON
    ) -> None:
        driver = self.driver
        kernel = driver.kernel
        tool = kernel.tools[record.name]
        queue = driver.queue
        loop = asyncio.get_running_loop()

        def report(data: JSON) -> None:
            event = Event(
                "tool_output",
                run.run_id,
                run.revision,
                -1,
                {"call_id": record.id, "data": data},
            )
            if _in_loop(loop):
                queue.put_nowait(event)
            else:  # a sync tool reports from its thread
                loop.call_soon_threadsafe(queue.put_nowait, event)

        context = copy.deepcopy(run.context)
        refused: list[BaseException] = []
        """Set when the last lease check before the effect failed (cleared by one that
        passed, as a middleware may call ``next`` again): the effect never began."""

        async def terminal(invocation: ToolInvocation) -> JSON:
            try:
                await driver.ensure_lease()  # the call starts only under a live lease
            except (LeaseLost, StoreError, CancelRequested) as exc:
                refused[:] = [exc]
                raise
            refused.clear()
            return await tool.invoke(invocation.input, ctx)

        def never_began() -> None:
            """The lease check refused the effect, whatever a middleware made of that:
            the drive stops, and an intent refused for a store error is started by the
            next drive (a lost lease leaves it to the new owner)."""
            self.tasks.pop(ids[0], None)
            if isinstance(refused[0], StoreError | CancelRequested):
                self.unstarted[ids[0]] = (list(ids), call_input)
            self.escaped = refused[0]
            queue.put_nowait(None)

        invocation = ToolInvocation(run, record, call_input, tool.idempotent)
        returned: str | None = None
        """The type of a value the call returned that cannot be stored."""
        with telemetry.tool_span(driver.trace_parent, run.run_id, record, tool, ids) as span:
            try:
                lease = driver.lease
                token = lease.generation if lease is not None else None
                ctx = ToolContext(
                    *(run.run_id, record.id, record.attempt, context, report, kernel, token),
                    tags=dict(run.tags),
                )
                output = await chain(kernel.middleware, terminal)(invocation)
                if refused:
                    never_began()
                    return
                outcome = _stored_outcome(ids, output)
            except UnstorableResult as exc:  # it ran: what it returned cannot be stored
                if refused:
                    never_began()
                    return
                outcome, returned = Outcome(ids, None, str(exc)), exc.returned
            except asyncio.CancelledError:
                self.tasks.pop(ids[0], None)
                queue.put_nowait(None)  # a drive waiting for this call must not wait forever
                raise
            except Exception as exc:
                if refused:
                    never_began()
                    return
                outcome = _tool_failure(ids, exc)
                if outcome.error is not None:
                    span.failed(exc)
            except BaseException as exc:  # SystemExit, KeyboardInterrupt, an injected crash
                self.tasks.pop(ids[0], None)
                self.escaped = exc
                queue.put_nowait(None)
                return
            span.settle(outcome)
        self.tasks.pop(ids[0], None)
        if returned is None:
            self.outcomes.append(outcome)
        else:
            self._ran_unstored(run, record, tool, ids, returned, outcome)
        queue.put_nowait(None)

    def _ran_unstored(
        self,
        run: Run,
        record: ToolCallRecord,
        tool: Tool,
        ids: tuple[str, ...],
        returned: str,
        outcome: Outcome,
    ) -> None:
        """The calls ``ids`` ran and returned a ``returned`` the store cannot hold. An
        idempotent tool's is an error result the model reads (running it again is safe);
        any other call keeps no result and stays in flight: once nothing else runs, the
        run pauses on it as uncertain, never telling the model it did not run."""
        then = (
            "the model is told the call failed"
            if tool.idempotent
            else "the run pauses with uncertain_tool_calls until resolve_tool_call says"
            " what it returned"
        )
        _log.warning(
            "run %s: tool %r (call %s) ran and returned a %s, which cannot be stored: %s",
            run.run_id,
            record.name,
            record.id,
            returned,
            then,
            extra={"run_id": run.run_id, "tool": record.name, "returned": returned},
        )
        if tool.idempotent:
            self.outcomes.append(outcome)
            return
        for call_id in ids:
            self.unstored[call_id] = (record.attempt, returned)
            self.names.pop(call_id, None)


def _tool_failure(ids: tuple[str, ...], exc: Exception) -> Outcome:
    """What a call that raised ``exc`` leaves: a question it asks, a paused child it waits
    for, or an error result the model reads."""
    if isinstance(exc, NeedsInput):
        question, problem = asked(exc)
        return Outcome(ids, None, problem, asked=question)
    if isinstance(exc, ChildPaused):
        pause = exc.pause
        why = ChildPause(pause.reason, pause.metadata) if pause else None
        return Outcome(ids, child=exc.child_run_id, child_pause=why)
    if isinstance(exc, ToolError):
        return Outcome(ids, None, str(exc))
    return Outcome(ids, None, f"{type(exc).__name__}: {exc}")


def _given_resolutions(value: JSON) -> dict[str, Resolution]:
    """The resolutions a ``resume`` value hands in (``{"resolutions": {call id: ...}}``,
    as ``Uncertain.metadata`` gives them)."""
    given = value.get("resolutions") if isinstance(value, dict) else None
    if not isinstance(given, dict):
        return {}
    found: dict[str, Resolution] = {}
    for call_id, doc in given.items():  # resume checked them against the pause
        with contextlib.suppress(InvalidArgument):  # not a resolution: the call stays uncertain
            found[call_id] = resolution_of(doc)
    return found


def _stored_outcome(ids: tuple[str, ...], output: JSON) -> Outcome:
    """A tool's return value as stored (with the context patch of a ``ToolReturn``);
    ``UnstorableResult`` saying why it cannot be (the call ran all the same)."""
    patch = None
    if isinstance(output, ToolReturn):
        output, patch = output.output, output.context
        patched, problem = as_stored(patch, "context")
        if problem is not None or (patch is not None and type(patch) is not dict):
            why = problem or "not a JSON object"
            returned = f"context patch of {type(patch).__name__}"
            raise UnstorableResult(f"the tool returned a context patch that is {why}", returned)
        patch = patched
    stored, problem = as_stored(output, "output")
    if problem is not None:
        returned = type(output).__name__
        raise UnstorableResult(f"the tool returned a value that is not JSON: {problem}", returned)
    return Outcome(ids, stored, None, context=patch)


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
