"""Drives one run: each ``advance`` performs effects and applies transitions up to the
next effect boundary, then lands them in one commit. Transitions gathered for a commit
that never lands are dropped: the driver's copy goes back to the last commit.

Design: effect -> transition -> commit
--------------------------------------
A run moves by lifecycle transitions; the store sees them in commits::

    effect      do what the state needs: call a hook, the model or a tool
    transition  feed the effect's result to the lifecycle chart as an event payload;
                a pure action builds the next run (no I/O inside)
    commit      compare-and-set r -> r+1 in the store, with the events of every
                transition since the last commit (each with its own ``seq``)

A commit lands before an effect that must not repeat and after an effect whose
result is costly to redo; transitions between which no such effect happens share
one commit. So a commit lands: before the model is called (``model_started``, the
intent); before tools start (their ``tool_call_started`` intents, with the model's
answer that asked for them); before waiting for tools still running (the results in
hand); before a hook observes a committed result; and when the run comes to rest
(paused, failed, completed). A turn with tool calls takes two commits, a text turn
one, and ``revision`` counts commits.

Where a crash can land, and what resume does:

* before a commit: nothing since the last commit is stored; resume redoes those
  transitions (hooks included) from the last commit.
* after ``model_started``, before the answer's commit: the model is called again
  and ``model_restarted`` is recorded.
* with eager dispatch, after an early ``tool_call_started`` (committed with the answer
  so far), before the answer's commit: the answer is cut off there; the answer so far
  becomes the turn's answer (``answer_cut_off``), the model is not called again, and
  the started calls are in flight as below.
* after ``tool_call_started``, before ``tool_call_completed``: the side effect may
  or may not have happened. Idempotent tools re-run with the same idempotency key;
  any other call pauses the run (``uncertain_tool_calls``) until
  ``resolve_tool_call`` says what happened.
* during a commit: the store lands all of it or none of it. The driver settles an
  ambiguous outcome (a store error, a cancellation while the store works) by reading
  the head before it decides anything; a landed commit is kept, one that did not land
  is tried again with backoff.

A driver holds the run's lease (one owner per run): every commit carries it, and the
store refuses it once the lease moved on. Right before a model or tool call starts, it
checks on its monotonic clock that the lease lasts at least the kernel's
``lease_margin`` more (``statekernel._kernel.tenure``); if the lease moved on, nothing
starts and the drive stops with ``LeaseLost``. A command of the same kernel (``send``,
``update_context``...) commits under the same lease, between two commits of the drive
(``commit_lock``); the drive then goes on from the command's commit, re-applying what it
had staged (``adopt``), so a command never makes the drive's next commit conflict and
never cuts its calls. It remembers the intents *it* committed
(``model_started``, the tool calls it started and still runs, and those whose intent
landed but whose effect it never began). Because only the lease holder commits, an
intent found in the store that this driver does not know is a remnant of a dead or
departed owner: the model is called again (``model_restarted``), idempotent tools
re-run, any other in-flight call pauses the run.

Landing a commit, and settling one whose outcome is ambiguous, is
``statekernel._kernel.commit``; results already in hand are never dropped for a
commit that did not land.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from statekernel._kernel import hooks as hk
from statekernel._kernel import telemetry
from statekernel._kernel.asking import NeedsInput, answered, asked, questions
from statekernel._kernel.commit import Committer, Landed, log_lease_lost
from statekernel._kernel.delegate import ChildPaused
from statekernel._kernel.dispatch import identical_group, next_startable
from statekernel._kernel.middleware import Middleware, ModelCall, ToolInvocation, chain
from statekernel._kernel.pending import Outcome, PendingCommit
from statekernel._kernel.tools import ToolContext, ToolReturn
from statekernel._lifecycle.chart import DATA_CHANGES, Lifecycle
from statekernel._lifecycle.matching import call_key
from statekernel._lifecycle.transitions import parse_call
from statekernel._records.checks import checked_result
from statekernel._records.events import Event
from statekernel._records.messages import JSON, ModelRequest, ModelResult, ToolCall
from statekernel._records.pauses import (
    ChildPause,
    ChildWait,
    HookPause,
    MaxTurns,
    Question,
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
    MAX_TURNS,
    UNCERTAIN,
    PauseInfo,
    Run,
    ToolCallRecord,
    Turn,
)
from statekernel._records.values import as_stored, parse_json
from statekernel._storage.protocol import Lease
from statekernel._storage.provider import (
    ModelProvider,
    ReasoningDelta,
    ResultBuilder,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    UsageUpdate,
)
from statekernel._storage.shielding import wait_ended
from statekernel.errors import (
    ConflictError,
    InvalidTransition,
    LeaseLost,
    StoreError,
    ToolError,
)

if TYPE_CHECKING:
    from statekernel._kernel.dispatch import DispatchPolicy
    from statekernel._kernel.telemetry import TraceContext
    from statekernel._kernel.tenure import Tenure
    from statekernel._kernel.tools import Tool
    from statekernel._records.messages import ToolSpec
    from statekernel._storage.protocol import CheckpointStore

__all__ = ["Agent", "Models", "RunDriver"]


class Models(Protocol):
    """Resolves a ``provider/model`` string to its provider (``ProviderRegistry``)."""

    def get(self, model: str) -> ModelProvider:
        """The provider of ``model``."""
        ...


class Agent(Protocol):
    """What a drive reads from its kernel (``Kernel`` is one): the store it commits to,
    the agent's tools, hooks, middleware and dispatch policy, and its models."""

    @property
    def store(self) -> CheckpointStore:
        """Where the run's commits land."""
        ...

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The agent's tools by name."""
        ...

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """What the model is told about the tools."""
        ...

    @property
    def hooks(self) -> object:
        """The ``Hooks`` (any object with some of its methods)."""
        ...

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """Around every model and tool call, outermost first."""
        ...

    @property
    def dispatch(self) -> DispatchPolicy:
        """How tool calls are started."""
        ...

    @property
    def registry(self) -> Models:
        """The model providers."""
        ...

    @property
    def lease_margin(self) -> float:
        """Seconds the run's lease must surely last when a model or tool call starts."""
        ...


NOT_RUN_FINISHED = "not run: the run finished ({reason})"


class _HookFailed(Exception):
    """A hook raised ``original``."""

    def __init__(self, original: BaseException) -> None:
        self.original = original


@attrs.frozen
class _Flushed:
    """A commit that landed: its events, and the failure of a hook that observed its
    results afterwards (the run fails in the next commit)."""

    events: tuple[Event, ...]
    hook_failed: _HookFailed | None = None


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


class RunDriver:
    """One run's machine, its committed intents and its running tool calls."""

    def __init__(self, kernel: Agent, run: Run, tenure: Tenure | None = None) -> None:
        self.kernel = kernel
        self.tenure = tenure
        """The run's lease and how long it surely lasts (None: unfenced, new runs)."""
        self.committer = Committer(kernel.store, tenure.lease if tenure is not None else None)
        """Lands this driver's commits under the run's lease."""
        self.lc = Lifecycle(run)
        self.lock = asyncio.Lock()
        self.commit_lock = asyncio.Lock()
        """Held while a commit of the run is computed and landed: by this driver's
        ``flush`` and by a command of the same kernel that commits between two of them."""
        self.users = 0
        """Drives that hold this driver."""
        self.model_claim: int | None = None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.names: dict[str, str] = {}
        self.unstarted: dict[str, tuple[list[str], JSON]] = {}
        """Intents that landed while the drive was cancelled: their effect never began."""
        self.outcomes: list[Outcome] = []
        self.decided: dict[str, tuple[Any, Any]] = {}
        """``on_tool_call_started`` decisions taken while the answer streamed (eager
        dispatch) about calls that did not start then, by call id, with what the call
        asked for (``call_key``): dispatch uses one for a call asking the same."""
        self.escaped: BaseException | None = None
        self.model_refused: BaseException | None = None
        """Why the last lease check before a model call refused it (None once one passed)."""
        self.commander: asyncio.Task[Any] | None = None
        """The task of a command of this kernel committing between this driver's commits."""
        self.overtaken = False
        """A command of this kernel committed something the staged transitions no longer
        apply to: the commit being gathered is refused (``ConflictError``)."""
        self.pending = PendingCommit()
        """The commit being gathered."""
        self.observing = hk.overrides(kernel.hooks, "on_tool_call_completed")
        """Whether the hooks observe committed results (``on_tool_call_completed``): the
        commit of a result then lands before anything else is decided."""
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self.trace_parent: TraceContext | None = None
        """The span of the drive in progress (see ``_kernel.telemetry``): parent of the spans of
        this driver's commits, model calls and tool calls."""

    @property
    def lease(self) -> Lease | None:
        """The run's lease this driver commits under (None: unfenced, for new runs)."""
        return self.tenure.lease if self.tenure is not None else None

    @property
    def lost(self) -> bool:
        """True once the lease was found to have moved on: the driver must stop."""
        return self.committer.lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self.committer.lost = value

    @property
    def committed(self) -> Run:
        """The run at its last committed revision, even while transitions are staged."""
        base = self.pending.base
        return base if base is not None else self.lc.run

    def adopt(self, head: Run) -> None:
        """Go on from ``head``, which a command of this kernel committed on top of this
        driver's last commit (under ``commit_lock``): what was staged is applied again on
        top of it, and a model call claimed at the last commit stays claimed."""
        committed = self.committed
        if head.revision == committed.revision:
            return
        claimed = self.model_claim is not None and self.model_claim == committed.revision
        moves = self.pending.moves
        self.lc.reset(head)
        self.pending.base, self.pending.events, self.pending.moves = None, [], []
        try:
            for event, payload in moves:
                self.stage(event, **payload)
        except InvalidTransition:  # the command changed what they applied to
            self._drop_staged()
            self.overtaken = True
        if claimed:
            self.model_claim = head.revision

    async def ensure_lease(self) -> None:
        """Return once the run's lease surely lasts the kernel's ``lease_margin`` more:
        called right before a model or tool call starts. ``LeaseLost`` (the driver is
        lost) if the lease moved on; ``StoreError`` if the store cannot say now."""
        run = self.committed
        if self.lost:
            raise LeaseLost(run.run_id, run.revision)
        if self.tenure is None:
            return
        try:
            await self.tenure.ensure(self.kernel.lease_margin)
        except LeaseLost:
            self.lost = True
            log_lease_lost(run.run_id, run.revision, "it moved on before an effect started")
            raise

    @property
    def run(self) -> Run:
        """The run at its last committed revision."""
        return self.lc.run

    @property
    def busy(self) -> bool:
        """True while the driver holds intents a later ``step`` must finish."""
        return bool(self.tasks or self.outcomes or self.unstarted or self.model_claim is not None)

    async def reset(self, run: Run) -> None:
        """Point at a newer head loaded from the store (a command of this kernel, sharing
        the lease, may have committed meanwhile). Calls still in flight in that head stay
        this driver's: their tasks run on and their results in hand are kept; intents of
        anything else lapse."""
        if run.revision != self.lc.run.revision:
            self.lc.reset(run)
            self.model_claim = None
            active = run.state in ("dispatching_tools", "calling_model")
            turn = run.current_turn if active else None
            live = {r.id for r in turn.in_flight} if turn is not None else set()
            self.outcomes = [o for o in self.outcomes if live.issuperset(o.ids)]
            self.unstarted = {k: v for k, v in self.unstarted.items() if live.issuperset(v[0])}
            await self.stop_tasks(keep=live)

    async def drive_ended(self, *, stop_tasks: bool) -> None:
        """A drive ended: its running calls are stopped (``stop_tasks``; not when the
        store failed: they go on, their results wait for the next drive), and the model
        call it claimed is no longer claimed (the next drive commits a fresh intent)."""
        if stop_tasks:
            await self.stop_tasks()
        self.model_claim = None

    def forget(self) -> None:
        """Drop what only this process knew (its process is going down): results in hand
        and intents never started become what a crash leaves, for resume to decide."""
        self.outcomes.clear()
        self.unstarted.clear()

    async def stop_tasks(self, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Cancel running tool calls (but those of the calls in ``keep``) and wait until
        each has ended (their intents stay committed: resume decides). Results already
        in hand are kept: the driver stays busy, holding the run, and the next drive
        commits them.

        A sync tool's thread cannot be stopped: this waits for it to return, even if
        the caller is cancelled meanwhile, so no call of this driver is still executing
        when the drive reports that it stopped (and the run may be driven elsewhere).
        """
        tasks = [task for key, task in self.tasks.items() if key not in keep]
        for task in tasks:
            task.cancel()
        self.tasks = {key: task for key, task in self.tasks.items() if key in keep}
        held = {i for outcome in self.outcomes for i in outcome.ids} | set(keep)
        self.names = {i: name for i, name in self.names.items() if i in held}
        await wait_ended(tasks)

    # -- commits ---------------------------------------------------------------

    def stage(self, event: str, **payload: Any) -> None:
        """Apply one transition to the driver's copy. It joins the commit being gathered
        (the first one after a commit starts it); ``flush`` lands them together."""
        pending = self.pending
        joining = pending.open
        base = pending.base if pending.base is not None else self.lc.run
        if event in DATA_CHANGES:
            _, events = self.lc.change(event, join=joining, **payload)
        else:
            _, events = self.lc.apply(event, join=joining, **payload)
        pending.base = base
        pending.events.extend(events)
        pending.moves.append((event, payload))
        if event == "pause":  # calls that wait (a question, a paused child) stay in flight
            # and run again after the resume: their results leave the driver with the
            # pause, which would otherwise hold them, and the run, for good
            pending.outcomes.extend(self._ready_outcomes(asking=True))

    def _stage_outcome(self, outcome: Outcome) -> None:
        self.stage(
            "tool_call_completed",
            call_ids=list(outcome.ids),
            output=outcome.output,
            error=outcome.error,
            resolved=outcome.resolved,
            context=outcome.context,
            skipped=outcome.skipped,
        )
        self.pending.outcomes.append(outcome)

    def _stage_intent(self, ids: list[str], call_input: JSON) -> None:
        record = _turn(self.run).call(ids[0])
        assert record is not None
        self.stage("tool_call_started", call_ids=ids, call_input=call_input)
        for call_id in ids:
            self.names[call_id] = record.name
        self.pending.intents.append((list(ids), call_input))

    @contextlib.contextmanager
    def _dropped_unless_landed(self) -> Iterator[None]:
        """Whatever stops the block (an error, a cancellation) drops what it staged and
        did not land, so the driver's copy is the last commit again."""
        try:
            yield
        except BaseException:
            self._drop_staged()
            raise

    def _drop_staged(self) -> None:
        """Forget the transitions gathered since the last commit (they did not land)."""
        pending, self.pending = self.pending, PendingCommit()
        if pending.base is not None:
            self.lc.reset(pending.base)
        for ids, _ in pending.intents:
            for call_id in ids:
                self.names.pop(call_id, None)

    async def commit(self, event: str, **payload: Any) -> tuple[Event, ...]:
        """Apply one transition and commit it; unless it landed, the run stays as it was."""
        self.stage(event, **payload)
        return await self.flush()

    async def flush(self) -> tuple[Event, ...]:
        """Commit the transitions gathered since the last commit (nothing if none).

        On return they landed: the intents among them are started, the results among
        them leave the driver, and the hooks observing results are called (one that
        raises: ``_HookFailed``). On any way out without a landed commit, the driver's
        copy is back at the last commit; an intent that landed under a cancellation is
        kept as unstarted (the next step starts it).
        """
        flushed = await self._flush()
        if flushed.hook_failed is not None:
            raise flushed.hook_failed
        return flushed.events

    async def _flush(self) -> _Flushed:
        """``flush``, with the failure of a hook observing the landed results as a value."""
        if not self.pending.open:
            return _Flushed(())
        async with self.commit_lock:  # a command of this kernel may commit first: adopted
            pending = self.pending
            base = pending.base
            if base is None:
                return _Flushed(())
            if self.overtaken:  # what was gathered was built on what the command changed
                self.overtaken = False
                self._drop_staged()
                raise ConflictError(base.run_id, base.revision - 1, base.revision)
            events = tuple(pending.events)
            intents, outcomes = pending.intents, pending.outcomes
            model_intent = pending.model_intent
            checkpoint = pending.checkpoint(self.lc.run)
            self.pending = PendingCommit()
            landing = await self.committer.land(checkpoint, self.trace_parent)
            if not isinstance(landing, Landed):
                # Nothing landed: the driver's copy goes back to the last commit, and the
                # calls whose intents were staged are forgotten. None of them started (a
                # call starts only after its intent lands) and the store never saw their
                # intents, so nothing may treat them as this driver's calls in flight.
                self.lc.reset(base)
                for ids, _ in intents:
                    for call_id in ids:
                        self.names.pop(call_id, None)
                landing.unwrap()
            self._landed(outcomes)
            if landing.cancelled is not None:  # landed, then the drive stops
                for ids, call_input in intents:
                    self.unstarted[ids[0]] = (ids, call_input)
                landing.unwrap()
        if model_intent:
            self.model_claim = self.run.revision
        for ids, call_input in intents:
            self._spawn(ids, call_input)
        try:
            await self._observe(outcomes)
        except _HookFailed as failed:
            return _Flushed(events, failed)
        return _Flushed(events)

    def _landed(self, outcomes: list[Outcome]) -> None:
        self.outcomes = [o for o in self.outcomes if all(o is not s for s in outcomes)]
        for outcome in outcomes:
            for call_id in outcome.ids:
                self.names.pop(call_id, None)

    async def _observe(self, outcomes: list[Outcome]) -> None:
        """``on_tool_call_completed`` after the commit, once for each call it completed: at
        most once per result (a crash before a hook skips it; a hook that raises fails the
        run, and retry goes on from the committed result without calling it again)."""
        if not outcomes or not self.observing:
            return
        run = self.run
        for outcome in (o for o in outcomes if not o.waiting):
            for call_id in outcome.ids:
                await self._hook("on_tool_call_completed", run, _turn(run).call(call_id))

    async def commit_data(
        self, kind: str, data: dict[str, Any], **fields: Any
    ) -> tuple[Event, ...]:
        """Commit a change of the run's data that is not a lifecycle transition
        (``DATA_CHANGES``: ``fields`` replaced, same state); unless it landed, the run
        stays as it was."""
        return await self.commit(kind, data=data, **fields)

    # -- up to the next commit ---------------------------------------------------

    async def advance(self) -> AsyncIterator[Event]:
        """Perform effects and transitions up to the next commit, and land it (nothing if
        the run is at rest). Yields live events while effects run, then the committed ones.

        Transitions between which no effect happens share the commit: it lands before a
        model call (``model_started``), before tools start (their intents, with the model
        answer that asked for them), before waiting for tools still running (the results in
        hand), before a hook observes a result, and when the run comes to rest.
        """
        with self._dropped_unless_landed():
            try:
                async for live in self._gather():
                    yield live
                flushed = await self._flush()
            except _HookFailed as failed:  # before anything landed
                flushed = _Flushed((), failed)
            landed = flushed.events
            if flushed.hook_failed is not None:
                landed += await self._fail_after(flushed.hook_failed)
        for event in landed:
            yield event

    async def _gather(self) -> AsyncIterator[Event]:
        """Stage transitions, effect by effect, until what is staged must land before the
        next effect (``_must_land``), tools still run while something is staged (it lands
        before waiting for them), or the run rests."""
        while True:
            state = self.run.state
            if state == "init":
                self.stage("start")
            elif state == "preparing_turn":
                await self._prepare()
            elif state == "calling_model":
                async for live in self._call_model():
                    yield live
            elif state == "dispatching_tools":
                if await self._dispatch():  # only waiting for running tools is left
                    if self.pending.open:
                        return  # what is decided lands before waiting for the tools
                    async for live in self._wait():
                        yield live
            else:
                return
            if self._must_land():
                return

    def _must_land(self) -> bool:
        """Whether the commit being gathered must land before the next effect: it holds
        the intent to call the model or to start tools, or results the hooks observe."""
        return self.pending.must_land(self.observing)

    def _must_flush(self) -> bool:
        return self.observing and bool(self.pending.outcomes)

    async def answer(self, question: Question, value: JSON, max_turns: int | None) -> None:
        """Resume a run paused with ``input_required``: ``value`` (checked against the
        question's schema first) is the asking call's result, committed with the resume,
        and the next waiting question pauses the run again in the same commit. A hook
        observing that result that raises fails the run, as in a drive."""
        ids, error, waiting = answered(question, value)
        with self._dropped_unless_landed():
            self.stage("resume", value=value, max_turns=max_turns)
            self._stage_outcome(Outcome(tuple(ids), None if error else value, error))
            if waiting is not None:
                self.stage("pause", reason=INPUT_REQUIRED, details=waiting)
            flushed = await self._flush()
            if flushed.hook_failed is not None:
                await self._fail_after(flushed.hook_failed)

    async def commit_held(self) -> None:
        """Commit the results in hand, and nothing else, before the run is let go (else
        the next owner would find those calls uncertain); nothing when none can land
        now. A hook observing them that raises fails the run, as in a drive."""
        if not self.outcomes or self.lost or self.run.state != "dispatching_tools":
            return
        with self._dropped_unless_landed():
            for outcome in self._ready_outcomes():
                self._stage_outcome(outcome)
            flushed = await self._flush()
            if flushed.hook_failed is not None:
                await self._fail_after(flushed.hook_failed)

    async def _fail_after(self, failed: _HookFailed) -> tuple[Event, ...]:
        """A hook that observed landed results raised: the run fails in the next commit."""
        original = failed.original
        self.stage("fail", error=type(original).__name__, message=str(original))
        return await self.flush()

    async def _hook(self, name: str, *args: Any) -> Any:
        try:
            return await hk.call_hook(self.kernel.hooks, name, *args)
        except Exception as exc:
            raise _HookFailed(exc) from exc

    async def _prepare(self) -> None:
        run = self.run
        if run.pending_pause is not None:
            info = run.pending_pause
            self.stage("pause", reason=info.reason, details=info.details)
            return
        if run.max_turns is not None and len(run.turns) >= run.max_turns:
            budget = MaxTurns(run.max_turns, len(run.turns))
            self.stage("pause", reason=MAX_TURNS, details=budget)
            return
        request = ModelRequest(model=run.model, messages=run.messages, tools=self.kernel.tool_specs)
        hooked = await self._hook("on_turn_prepared", run, request)
        if hooked is not None:
            if not isinstance(hooked, ModelRequest):
                raise _HookFailed(TypeError("on_turn_prepared must return a ModelRequest or None"))
            request = hooked
        self.stage("turn_prepared", request=request)

    # -- the model ---------------------------------------------------------------

    async def _call_model(self) -> AsyncIterator[Event]:
        if _turn(self.run).partial is not None:  # calls started, the stream did not end here
            self.model_claim = None
            self.stage("answer_cut_off", reason="the drive reading the answer stopped")
            return
        # The model may be called only right after this driver's own ``model_started``
        # landed: ``model_claim`` is the revision that commit made. Anything staged
        # since (``pending``), or a head that moved on (a command, a reload, a commit of
        # early calls), means the last landed intent is not the one this call would
        # answer: commit a fresh intent first, then call on the next step.
        if self.pending.open or self.model_claim != self.run.revision:
            self.stage("model_started")  # the intent lands before the call
            self.pending.model_intent = True
            return
        run = self.run
        turn = _turn(run)
        holder: list[ModelResult] = []
        self.decided = {}
        try:
            async for live in self._pump(self._model_result(run, turn, holder)):
                yield live
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except (_HookFailed, StoreError, ConflictError, LeaseLost):
            raise
        except Exception as exc:
            if self.model_refused is not None:  # whatever a middleware made of it
                raise self.model_refused from exc
            self.model_claim = None
            why = f"{type(exc).__name__}: {exc}"
            if _turn(self.run).partial is not None:
                self.stage("answer_cut_off", reason=why)
            else:
                self.stage("fail", error=type(exc).__name__, message=str(exc))
            return
        result = holder[0]
        finish, then_pause = None, None
        if not result.tool_calls and not _turn(self.run).in_flight:
            finish, then_pause = await self._turn_decision(
                attrs.evolve(turn, result=result), default=result.finish_reason
            )
        self.model_claim = None
        self.stage("model_completed", result=result, finish=finish, then_pause=then_pause)

    async def _model_result(self, run: Run, turn: Turn, holder: list[ModelResult]) -> None:
        emit = self.queue.put_nowait
        registry = self.kernel.registry
        self.model_refused = None
        streams = 0

        async def terminal(call: ModelCall) -> ModelResult:
            nonlocal streams
            try:
                await self.ensure_lease()  # the call starts only under a live lease
            except (LeaseLost, StoreError) as exc:
                self.model_refused = exc
                raise
            self.model_refused = None
            with telemetry.model_span(self.trace_parent, run.run_id, call.request) as span:
                provider = registry.get(call.request.model)
                builder = ResultBuilder()
                early = _Early() if self.kernel.dispatch.eager and not streams else None
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
                span.answered(result)
                return result

        result = await chain(self.kernel.middleware, terminal)(ModelCall(run, turn.request))
        result = checked_result(result, "model result", total=run.usage)
        hooked = await self._hook("on_model_completed", run, result)
        if hooked is not None:
            if not isinstance(hooked, ModelResult):
                raise _HookFailed(TypeError("on_model_completed must return a ModelResult or None"))
            result = hooked
        holder.append(result)

    async def _start_early(self, builder: ResultBuilder, early: _Early) -> None:
        """Eager dispatch: start the calls whose arguments have finished streaming, in call
        order, while the dispatch rules allow. Each intent lands with the answer so far
        before its call starts; the first call that may not start now (the rules, a hook's
        decision, invalid arguments) and the calls after it wait for the answer's end."""
        self._raise_escaped()  # a call that took the process down stops everything
        tools, policy = self.kernel.tools, self.kernel.dispatch
        while not early.stopped and early.started < builder.complete_count():
            if self.observing and self._ready_outcomes():
                break  # a result the hooks observe lands before anything else is decided
            call = builder.complete_call(early.started)
            record = early.record(call)
            if next_startable([record], self._running(), tools, policy) is None:
                break  # tried again with the next part
            decision = await self._hook("on_tool_call_started", self.run, record)
            call_input = decision.input if isinstance(decision, hk.Rewrite) else record.input
            if not (decision is None or isinstance(decision, hk.Continue | hk.Rewrite)):
                self.decided[call.id] = (call_key(call.name, call.arguments), decision)
                early.stopped = True
            elif self._precheck(record, call_input) is not None:
                # asked once: dispatch gives the error
                self.decided[call.id] = (call_key(call.name, call.arguments), decision)
                early.stopped = True
            else:
                partial = builder.so_far(
                    [builder.complete_call(n) for n in range(early.started + 1)]
                )
                self.stage("early_call_started", partial=partial, call_input=call_input)
                started = _turn(self.run).in_flight[-1]
                self.names[started.id] = started.name
                self.pending.intents.append(([started.id], call_input))
                early.started += 1
        if self.pending.intents:
            # Calls started while the answer streams: their intents land now (no effect
            # before its commit) while the model call goes on. That commit moves the
            # head past the ``model_started`` this call answers, so it counts as this
            # driver's model intent again: without it the next step would take the
            # moved head for someone else's and commit a second ``model_started``.
            self.pending.model_intent = True
            for event in await self.flush():  # shown as they land; the answer streams on
                self.queue.put_nowait(event)

    async def _turn_decision(self, turn: Turn, default: str) -> tuple[str | None, PauseInfo | None]:
        decision = await self._hook("on_turn_completed", self.run, turn)
        if decision is None:
            return default, None
        if isinstance(decision, hk.Continue):
            return None, None
        if isinstance(decision, hk.Finish):
            return decision.reason, None
        if isinstance(decision, hk.Pause):
            return None, PauseInfo(decision.reason, "preparing_turn", HookPause(decision.metadata))
        raise _HookFailed(TypeError(f"on_turn_completed cannot return {decision!r}"))

    async def _pump(self, work: Awaitable[None]) -> AsyncIterator[Event]:
        """Run ``work`` while yielding the live events it puts on the queue."""
        task = asyncio.ensure_future(work)
        task.add_done_callback(lambda _: self.queue.put_nowait(None))
        ended = False
        try:
            while True:
                item = await self.queue.get()
                if item is None:
                    if task.done():
                        ended = True
                        break
                    continue
                yield item
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait([task])
            if not ended and not task.cancelled():
                task.result()  # a failure of the work is raised, never dropped
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item is not None:
                yield item
        task.result()

    # -- tools -------------------------------------------------------------------

    def _ready_outcomes(self, *, asking: bool = False) -> list[Outcome]:
        """Results in hand not yet staged (``asking``: the calls that wait instead, for
        an answer or for a child run)."""
        return [
            o
            for o in self.outcomes
            if o.waiting == asking and all(o is not s for s in self.pending.outcomes)
        ]

    async def _dispatch(self) -> bool:
        """Stage what can be decided about the tools now; True when all that is left is
        to wait for calls still running."""
        self._raise_escaped()
        ready = self._ready_outcomes()
        if ready:  # results in hand go first, all of them in one commit
            for outcome in ready:
                self._stage_outcome(outcome)
            return False
        for ids, call_input in list(self.unstarted.values()):
            del self.unstarted[ids[0]]
            self._spawn(ids, call_input)
        turn = _turn(self.run)
        unowned = [r for r in turn.in_flight if r.id not in self.names]
        if unowned and not self.tasks:
            await self._recover(unowned)
            return False
        await self._start_ready()
        if self._must_land() or self.run.state != "dispatching_tools":
            return False
        if self.tasks:
            return True
        waiting = self._ready_outcomes(asking=True)
        if waiting:  # nothing else runs now: pause for the first in call order
            self._stage_waiting(waiting)
            return False
        await self._end_tools(_turn(self.run))
        return False

    async def _end_tools(self, turn: Turn) -> None:
        if turn.pending or turn.in_flight:
            raise InvalidTransition("tools_completed", self.run.state, "calls remain")
        default = next((r.skipped for r in turn.completed if r.skipped is not None), None)
        finish, then_pause = await self._turn_decision(turn, default="stop")
        if default is not None and then_pause is None:
            finish = default
        elif finish == "stop" and then_pause is None:
            finish = None
        self.stage("tools_completed", finish=finish, then_pause=then_pause)

    def _running(self) -> list[str]:
        """The tools running now or about to start (their intents land with the commit
        being gathered), one name per call: what dispatch limits count."""
        running = [self.names[i] for i in self.tasks]
        return running + [self.names[ids[0]] for ids, _ in self.pending.intents]

    async def _start_ready(self) -> None:
        """Decide about every call that may start now and stage what was decided (a
        result, a pause, or the intent to run it); intents land before their calls start
        (the commit lands before the next effect, see ``_must_land``)."""
        while self.run.state == "dispatching_tools":
            turn = _turn(self.run)
            running = self._running()
            record = next_startable(turn.pending, running, self.kernel.tools, self.kernel.dispatch)
            if record is None or not await self._decide(record, turn):
                break

    async def _decide(self, record: ToolCallRecord, turn: Turn) -> bool:
        """Stage the decision about ``record``; False defers a pause until the calls
        already in flight have finished (so a pause never strands them)."""
        early = self.decided.get(record.id)  # taken while the answer streamed
        if early is not None and early[0] == call_key(record.name, record.arguments):
            decision = early[1]
        else:
            decision = await self._hook("on_tool_call_started", self.run, record)
        ids = identical_group(record, turn.pending, self.kernel.tools, self.kernel.dispatch)
        call_input = record.input
        if isinstance(decision, hk.Pause) and (self.tasks or self.pending.intents):
            return False
        self.decided.pop(record.id, None)
        if isinstance(decision, hk.Skip):
            self._stage_outcome(Outcome(tuple(ids), decision.result, decision.error))
            return True
        if isinstance(decision, hk.Pause):
            self.stage("pause", reason=decision.reason, details=HookPause(decision.metadata))
            return True
        if isinstance(decision, hk.Finish):
            why = NOT_RUN_FINISHED.format(reason=decision.reason)
            skipped = tuple(r.id for r in turn.pending)
            self._stage_outcome(Outcome(skipped, None, why, skipped=decision.reason))
            return True
        if isinstance(decision, hk.Rewrite):
            call_input = decision.input
        elif decision is not None and not isinstance(decision, hk.Continue):
            raise _HookFailed(TypeError(f"on_tool_call_started cannot return {decision!r}"))
        problem = self._precheck(record, call_input)
        if problem is not None:
            self._stage_outcome(Outcome(tuple(ids), None, problem))
        else:
            self._stage_intent(ids, call_input)
        return True

    def _precheck(self, record: ToolCallRecord, call_input: JSON) -> str | None:
        tool = self.kernel.tools.get(record.name)
        if tool is None:
            known = ", ".join(sorted(self.kernel.tools)) or "none"
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
        resolutions = _given_resolutions(self.run.resume_value)
        uncertain = []
        for record in unowned:
            resolution = resolutions.get(record.id)
            if resolution is not None and resolution.attempt != record.attempt:
                resolution = None
            tool = self.kernel.tools.get(record.name)
            if resolution is not None and not isinstance(resolution, Rerun):
                if isinstance(resolution, ResolvedError):
                    outcome = Outcome((record.id,), None, resolution.error, resolved=True)
                else:
                    outcome = Outcome((record.id,), resolution.output, None, resolved=True)
                self._stage_outcome(outcome)
            elif resolution is not None or (tool is not None and tool.idempotent):
                self._stage_intent([record.id], record.input)
            else:
                uncertain.append(record)
        if self.pending.intents:
            return  # they land before the calls start again
        if uncertain and not self._must_flush():
            calls = tuple(UncertainCall(r.id, r.name, r.input, r.attempt) for r in uncertain)
            self.stage("pause", reason=UNCERTAIN, details=Uncertain(calls))

    def _spawn(self, ids: list[str], call_input: JSON) -> None:
        run = self.run
        record = _turn(run).call(ids[0])
        assert record is not None
        for call_id in ids:
            self.names[call_id] = record.name
        task = asyncio.ensure_future(self._execute(run, record, tuple(ids), call_input))
        self.tasks[ids[0]] = task

    async def _execute(
        self, run: Run, record: ToolCallRecord, ids: tuple[str, ...], call_input: JSON
    ) -> None:
        tool = self.kernel.tools[record.name]
        queue = self.queue
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
                await self.ensure_lease()  # the call starts only under a live lease
            except (LeaseLost, StoreError) as exc:
                refused[:] = [exc]
                raise
            refused.clear()
            return await tool.invoke(invocation.input, ctx)

        def never_began() -> None:
            """The lease check refused the effect, whatever a middleware made of that:
            the drive stops, and an intent refused for a store error is started by the
            next drive (a lost lease leaves it to the new owner)."""
            self.tasks.pop(ids[0], None)
            if isinstance(refused[0], StoreError):
                self.unstarted[ids[0]] = (list(ids), call_input)
            self.escaped = refused[0]
            queue.put_nowait(None)

        invocation = ToolInvocation(run, record, call_input, tool.idempotent)
        with telemetry.tool_span(self.trace_parent, run.run_id, record, tool, ids) as span:
            try:
                token = self.lease.generation if self.lease is not None else None
                ctx = ToolContext(
                    run.run_id, record.id, record.attempt, context, report, self.kernel, token
                )
                output = await chain(self.kernel.middleware, terminal)(invocation)
                if refused:
                    never_began()
                    return
                outcome = _stored_outcome(ids, output)
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
        self.outcomes.append(outcome)
        queue.put_nowait(None)

    def _stage_waiting(self, waiting: list[Outcome]) -> None:
        """Pause for calls that wait: questions first (asked one after another, in call
        order), else the first paused child. Calls that wait for a child stay in
        flight: after the resume they run again (a delegate call is idempotent)."""
        calls = _turn(self.run).result
        order = [c.id for c in calls.tool_calls] if calls is not None else []
        waiting.sort(key=lambda o: order.index(o.ids[0]) if o.ids[0] in order else len(order))
        asks = [(o.ids, self.names[o.ids[0]], o.asked) for o in waiting if o.asked is not None]
        if asks:
            self.stage("pause", reason=INPUT_REQUIRED, details=questions(asks))
        else:
            first = waiting[0]
            assert first.child is not None
            name = self.names[first.ids[0]]
            about = ChildWait(first.ids, name, first.child, first.child_pause)
            self.stage("pause", reason=CHILD_PAUSED, details=about)

    async def _wait(self) -> AsyncIterator[Event]:
        while not self._ready_outcomes() and self.tasks and self.escaped is None:
            item = await self.queue.get()
            if item is not None:
                yield item
        self._raise_escaped()

    def _raise_escaped(self) -> None:
        """Re-raise what escaped a tool task (a process-ending exception) in the driver."""
        if self.escaped is not None:
            escaped, self.escaped = self.escaped, None
            raise escaped


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
    found = {call_id: resolution_of(doc) for call_id, doc in given.items()}
    return {call_id: r for call_id, r in found.items() if r is not None}


def _stored_outcome(ids: tuple[str, ...], output: JSON) -> Outcome:
    """A tool's return value as stored (with the context patch of a ``ToolReturn``), or
    an error result saying why it cannot be."""
    patch = None
    if isinstance(output, ToolReturn):
        output, patch = output.output, output.context
        patched, problem = as_stored(patch, "context")
        if problem is not None or (patch is not None and type(patch) is not dict):
            why = problem or "not a JSON object"
            return Outcome(ids, None, f"the tool returned a context patch that is {why}")
        patch = patched
    stored, problem = as_stored(output, "output")
    if problem is not None:
        return Outcome(ids, None, f"the tool returned a value that is not JSON: {problem}")
    return Outcome(ids, stored, None, context=patch)


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _turn(run: Run) -> Turn:
    if run.current_turn is None:
        raise InvalidTransition("advance", run.state, "no turn in progress")
    return run.current_turn


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
