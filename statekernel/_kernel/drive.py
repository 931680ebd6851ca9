"""Drives one run: each ``advance`` performs effects and stages their transitions up to
the next effect boundary, then commits them together. Transitions staged for a commit
that never lands are dropped: the driver's copy goes back to the last commit.

Design: effect -> transition -> commit
--------------------------------------
A run moves by lifecycle transitions; the store sees them in commits. One verb per
level::

    effect      do what the state needs: call a hook, the model or a tool
    transition  the lifecycle chart folds the effect's result, an event with its
                payload, into the next run (a pure action: no I/O inside)
    stage       the driver applies each transition to its copy of the run and gathers
                it into the commit pending (``RunDriver.stage``, ``PendingCommit``)
    commit      the committer takes the store from r to r+1 (compare-and-set, through
                the store's ``commit``) with the events of every transition staged
                since the last commit, each with its own ``seq``; a commit *lands*, or
                does not (``Landed``, ``NotLanded``, ``Overtaken``)

A commit lands before an effect that must not repeat and after an effect whose
result is costly to redo; transitions between which no such effect happens share
one commit. So a commit lands: before the model is called (``model_started``, the
intent); before tools start (their ``tool_call_started`` intents, with the model's
answer that asked for them); before waiting for tools still running (the results in
hand); before a hook observes a committed result; and when the run comes to rest
(paused, failed, completed). A turn with tool calls takes two commits, a text turn
one, and ``revision`` counts commits.

The module reads in that order: ``advance``, the loop from effect to effect; ``stage``,
each transition joining the commit being gathered; ``commit``; then what the kernel
asks of a driver (holding it, a command between its commits, its lease). The effects live beside it:
the model call in ``statekernel._kernel.model_call`` (with the calls started early
while an answer streams), the tool calls in ``statekernel._kernel.tool_calls``
(``ToolCalls``: what is decided about each call, its task, its result in hand); what
they read from the driver is ``statekernel._kernel.driving.Driving``.

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
* during a commit: the store lands all of it or none of it. The committer settles an
  ambiguous outcome (a store error, a cancellation while the store works) by reading
  the head before the driver decides anything; a landed commit is kept, one that did
  not land is tried again with backoff.

A driver holds the run's lease (one owner per run): every commit carries it, and the
store refuses it once the lease moved on. Right before a model or tool call starts, it
checks on its monotonic clock that the lease lasts at least the kernel's
``lease_margin`` more (``statekernel._kernel.tenure``); if the lease moved on, nothing
starts and the drive stops with ``LeaseLost``. The commit that brings the run to rest
gives the lease back with it (``ReleasesWithCommit``) when the drive ends there, with no
call running or held and no other drive waiting; otherwise the kernel gives it back
once the drive ends. A command of the same kernel (``send``,
``update_context``...) commits under the same lease, between two commits of the drive
(``RunDriver.command``, holding ``commit_lock``); the drive then goes on from the
command's commit, staging again what it had staged (``adopt``), so a command never
makes the drive's next commit conflict and never cuts its calls. It remembers the
intents *it* committed (``model_started``: ``ModelCall.claim``; the tool calls it
started and still runs, and those whose intent landed but whose effect it never began:
``ToolCalls``). Because only the lease holder commits, an intent found in the store
that this driver does not know is a remnant of a dead or departed owner: the model is
called again (``model_restarted``), idempotent tools re-run, any other in-flight call
pauses the run.

Committing, and settling a commit whose outcome is ambiguous, is
``statekernel._kernel.commit``; results already in hand are never dropped for a
commit that did not land.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs

from statekernel._kernel import hooks as hk
from statekernel._kernel.asking import answered
from statekernel._kernel.commit import Committer, Landed, log_lease_lost
from statekernel._kernel.driving import Agent, HookFailed, hook, turn_of
from statekernel._kernel.model_call import ModelCall
from statekernel._kernel.pending import Outcome, PendingCommit
from statekernel._kernel.seats import Seats
from statekernel._kernel.tool_calls import ToolCalls
from statekernel._lifecycle.chart import DATA_CHANGES, Lifecycle
from statekernel._records.events import Event
from statekernel._records.limits import Limits, check_priced, model_limit_reached
from statekernel._records.messages import JSON, ModelRequest
from statekernel._records.pauses import MaxTurns, Question
from statekernel._records.run import (
    DEADLINE_EXCEEDED,
    INPUT_REQUIRED,
    LIMIT_REACHED,
    MAX_TURNS,
    Cancellation,
    Run,
    utcnow,
)
from statekernel._storage.protocol import CancelsRuns, Lease
from statekernel._storage.publishing import settled
from statekernel.errors import CancelRequested, ConflictError, InvalidTransition, LeaseLost

if TYPE_CHECKING:
    from statekernel._kernel.telemetry import TraceContext
    from statekernel._kernel.tenure import Tenure

__all__ = [
    "RunDriver",
    "cancel_soon",
    "carry_out_cancel",
    "deadline_request",
    "deadline_watch",
    "expire",
]


@attrs.frozen
class _Committed:
    """A commit that landed: its events, and the failure of a hook that observed its
    results afterwards (the run fails in the next commit)."""

    events: tuple[Event, ...]
    hook_failed: HookFailed | None = None


class RunDriver:
    """One run's machine, the commit it gathers, its model call and its tool calls."""

    def __init__(self, kernel: Agent, run: Run, tenure: Tenure | None = None) -> None:
        self.kernel = kernel
        self.tenure = tenure
        """The run's lease and how long it surely lasts (None: unfenced, new runs)."""
        self.committer = Committer(kernel.store, tenure.lease if tenure is not None else None)
        """Commits this driver's staged transitions under the run's lease."""
        self.lc = Lifecycle(run)
        self.pending = PendingCommit()
        """The commit being gathered."""
        self.calls = ToolCalls(self)
        """The tool calls it decides about, runs and holds the results of."""
        self.model = ModelCall(self, self.calls)
        """Its model call, and the intent to call the model it claims."""
        self.observing = hk.overrides(kernel.hooks, "on_tool_call_completed")
        """Whether the hooks observe committed results (``on_tool_call_completed``): the
        commit of a result then lands before anything else is decided."""
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()
        """Live events of the model and tool calls, for the drive to yield."""
        self.trace_parent: TraceContext | None = None
        """The span of the drive in progress (see ``_kernel.telemetry``): parent of the spans of
        this driver's commits, model calls and tool calls."""
        self.seats = Seats()
        """The drives (``run``, ``step``) holding or waiting for this driver, and a command
        of this kernel committing between its commits."""
        self.overtaken = False
        """A command of this kernel committed something the staged transitions no longer
        apply to: the commit being gathered is refused (``ConflictError``)."""
        self.lets_go_at_rest = False
        """Set by the kernel for the driver of its drives: the commit that brings the run
        to rest gives the lease up with it when nothing of the drive is left to finish
        (``_lets_go``), where the store can (``ReleasesWithCommit``)."""
        self.released = False
        """The lease was given up with a commit: nothing more is committed under it."""

    # -- effect: up to the next commit ----------------------------------------------

    async def advance(self) -> AsyncIterator[Event]:
        """Perform effects and stage their transitions up to the next commit, and commit
        (nothing if the run is at rest). Yields live events while effects run, then the
        committed ones.

        Transitions between which no effect happens share the commit: it lands before a
        model call (``model_started``), before tools start (their intents, with the model
        answer that asked for them), before waiting for tools still running (the results in
        hand), before a hook observes a result, and when the run comes to rest.
        """
        try:
            with self.dropped_unless_committed():
                try:
                    async for live in self._gather():
                        yield live
                    committed = await self._commit()
                except HookFailed as failed:  # before anything landed
                    committed = _Committed((), failed)
                landed = committed.events
                if committed.hook_failed is not None:
                    landed += await self._fail_after(committed.hook_failed)
        except CancelRequested:  # nothing more starts: the cancellation lands instead
            landed = await carry_out_cancel(self)
        for event in landed:
            yield event

    async def _gather(self) -> AsyncIterator[Event]:
        """Stage transitions, effect by effect, until what is staged must be committed
        before the next effect (``PendingCommit.must_commit``), tools still run while
        something is staged (it lands before waiting for them), or the run rests."""
        while True:
            state = self.run.state
            if state == "init":
                self.stage("start")
            elif state == "preparing_turn":
                await self._prepare()
            elif state == "calling_model":
                async for live in self.model.call():
                    yield live
            elif state == "dispatching_tools":
                if await self.calls.dispatch():  # only waiting for running tools is left
                    if self.pending.open:
                        return  # what is decided lands before waiting for the tools
                    async for live in self.calls.wait():
                        yield live
            else:
                return
            if self.pending.must_commit(self.observing):
                return

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
        check_priced(run.limits, run.model, run.fallback, self.kernel.prices)
        reached = model_limit_reached(run.limits, run.usage)
        if reached is not None:  # before the turn's model call: none is cut
            self.stage("pause", reason=LIMIT_REACHED, details=reached)
            return
        request = ModelRequest(
            model=run.model,
            messages=run.messages,
            tools=self.kernel.tool_specs,
            output=run.output_spec,
        )
        hooked = await hook(self.kernel, "on_turn_prepared", run, request)
        if hooked is not None:
            if not isinstance(hooked, ModelRequest):
                raise HookFailed(TypeError("on_turn_prepared must return a ModelRequest or None"))
            request = hooked
        self.stage("turn_prepared", request=request)

    async def answer(
        self, question: Question, value: JSON, max_turns: int | None, limits: Limits | None
    ) -> tuple[Event, ...]:
        """Resume a run paused with ``input_required``: ``value`` (checked against the
        question's schema first) is the asking call's result, committed with the resume,
        and the next waiting question pauses the run again in the same commit. A hook
        observing that result that raises fails the run, as in a drive."""
        ids, error, waiting = answered(question, value)
        with self.dropped_unless_committed():
            self.stage("resume", value=value, max_turns=max_turns, limits=limits)
            self.calls.stage_result(Outcome(tuple(ids), None if error else value, error))
            if waiting is not None:
                self.stage("pause", reason=INPUT_REQUIRED, details=waiting)
            committed = await self._commit()
            if committed.hook_failed is not None:
                return committed.events + await self._fail_after(committed.hook_failed)
            return committed.events

    async def commit_held(self) -> None:
        """Commit the results in hand, and nothing else, before the run is let go (else
        the next owner would find those calls uncertain); nothing when none can land
        now. A hook observing them that raises fails the run, as in a drive."""
        if not self.calls.outcomes or self.lost or self.run.state != "dispatching_tools":
            return
        with self.dropped_unless_committed():
            for outcome in self.calls.ready():
                self.calls.stage_result(outcome)
            committed = await self._commit()
            if committed.hook_failed is not None:
                await self._fail_after(committed.hook_failed)

    async def _fail_after(self, failed: HookFailed) -> tuple[Event, ...]:
        """A hook that observed landed results raised: the run fails in the next commit."""
        original = failed.original
        self.stage("fail", error=type(original).__name__, message=str(original))
        return await self.commit()

    # -- transition: staged into the commit being gathered ----------------------------

    def stage(self, event: str, **payload: Any) -> None:
        """Apply one transition to the driver's copy. It joins the commit being gathered
        (the first one after a commit starts it); ``commit`` lands them together."""
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
            pending.outcomes.extend(self.calls.ready(asking=True))

    @contextlib.contextmanager
    def dropped_unless_committed(self) -> Iterator[None]:
        """Whatever stops the block (an error, a cancellation) drops what it staged and
        did not commit, so the driver's copy is the last commit again."""
        try:
            yield
        except BaseException:
            self._drop_staged()
            raise

    def _drop_staged(self) -> None:
        """Forget the transitions staged since the last commit (they did not land)."""
        pending, self.pending = self.pending, PendingCommit()
        if pending.base is not None:
            self.lc.reset(pending.base)
        self.calls.dropped(pending.intents)

    # -- commit -----------------------------------------------------------------------

    async def commit(self) -> tuple[Event, ...]:
        """Commit the transitions staged since the last commit (nothing if none).

        On return they landed: the intents among them are started, the results among
        them leave the driver, and the hooks observing results are called (one that
        raises: ``HookFailed``). On any way out without a landed commit, the driver's
        copy is back at the last commit; an intent that landed under a cancellation is
        kept as unstarted (the next step starts it).
        """
        committed = await self._commit()
        if committed.hook_failed is not None:
            raise committed.hook_failed
        return committed.events

    async def _commit(self) -> _Committed:
        """``commit``, with the failure of a hook observing the landed results as a value."""
        if not self.pending.open:
            return _Committed(())
        await settled(self.kernel.store, self.run.run_id)  # live events reach readers first
        async with self.seats.commit_lock:  # a command of this kernel may commit first: adopted
            pending = self.pending
            base = pending.base
            if base is None:
                return _Committed(())
            if self.overtaken:  # what was staged was built on what the command changed
                self.overtaken = False
                self._drop_staged()
                raise ConflictError(base.run_id, base.revision - 1, base.revision)
            checkpoint = pending.checkpoint(self.lc.run)
            self.pending = PendingCommit()
            release = self._lets_go(pending)
            landing = await self.committer.commit(checkpoint, self.trace_parent, release=release)
            if not isinstance(landing, Landed):
                # Nothing landed: the driver's copy goes back to the last commit, and the
                # calls whose intents were staged are forgotten. None of them started (a
                # call starts only after its intent lands) and the store never saw their
                # intents, so nothing may treat them as this driver's calls in flight.
                self.lc.reset(base)
                self.calls.dropped(pending.intents)
                landing.unwrap()
            self.calls.landed(pending.outcomes)
            if landing.released:  # the lease went with the commit: nothing more under it
                self.released = True
                self.lose()
            if landing.cancelled is not None:  # landed, then the drive stops
                self.calls.hold(pending.intents)
                landing.unwrap()
        if pending.model_intent:
            self.model.claim = self.run.revision
        self.calls.start(pending.intents)
        try:
            await self._observe(pending.outcomes)
        except HookFailed as failed:
            return _Committed(tuple(pending.events), failed)
        return _Committed(tuple(pending.events))

    def _lets_go(self, pending: PendingCommit) -> bool:
        """Whether the commit of ``pending`` gives the lease up with it: it brings the run
        to rest and the drive ends with it, nothing of it left to finish (no call running,
        starting or held, no hook to observe its results, no other drive waiting for
        this driver; a command waiting to commit under its lease takes a lease of its
        own once it finds the driver let go)."""
        if not (self.lets_go_at_rest and self.committer.releases and self.lc.run.is_terminal):
            return False
        calls = self.calls
        held = [o for o in calls.outcomes if all(o is not p for p in pending.outcomes)]
        return not (
            pending.intents
            or pending.model_intent
            or calls.tasks
            or calls.unstarted
            or held
            or (self.observing and pending.outcomes)
            or self.seats.awaited
            or self.seats.commanded
        )

    async def _observe(self, outcomes: list[Outcome]) -> None:
        """``on_tool_call_completed`` after the commit, once for each call it completed: at
        most once per result (a crash before a hook skips it; a hook that raises fails the
        run, and retry goes on from the committed result without calling it again)."""
        if not outcomes or not self.observing:
            return
        run = self.run
        for outcome in (o for o in outcomes if not o.waiting):
            for call_id in outcome.ids:
                await hook(self.kernel, "on_tool_call_completed", run, turn_of(run).call(call_id))

    # -- what the kernel asks of a driver ---------------------------------------------

    @property
    def run(self) -> Run:
        """The driver's copy of the run: the last commit, and the transitions staged since."""
        return self.lc.run

    @property
    def committed(self) -> Run:
        """The run at its last committed revision, even while transitions are staged."""
        base = self.pending.base
        return base if base is not None else self.lc.run

    @property
    def lease(self) -> Lease | None:
        """The run's lease this driver commits under (None: unfenced, for new runs, and
        once it was given up with a commit)."""
        if self.tenure is None or self.released:
            return None
        return self.tenure.lease

    @property
    def lost(self) -> bool:
        """True once the lease was found to have moved on: the driver must stop."""
        return self.committer.lost

    def lose(self) -> None:
        """Commit nothing more (the lease moved on, or the kernel lets the run go)."""
        self.committer.lost = True

    @property
    def busy(self) -> bool:
        """True while the driver holds intents a later ``step`` must finish."""
        return self.calls.busy or self.model.claim is not None

    @property
    def idle(self) -> bool:
        """True when no drive holds or waits for the driver and it holds no intents."""
        return self.seats.empty and not self.busy

    @contextlib.asynccontextmanager
    async def command(self, current: Callable[[], bool]) -> AsyncIterator[RunDriver | None]:
        """A one-off driver for a command of the same kernel, committing under this
        driver's lease between two of its commits (``commit_lock`` is held meanwhile);
        this driver goes on from whatever of it landed (``adopt``). None when the run
        was let go meanwhile (the lease lost, or the driver no longer ``current``)."""
        async with self.seats.commit_lock:
            if self.lost or not current():
                yield None
                return
            driver = RunDriver(self.kernel, self.committed, self.tenure)
            try:
                with self.seats.command():
                    yield driver
            finally:
                self.adopt(driver.run)

    def adopt(self, head: Run) -> None:
        """Go on from ``head``, which a command of this kernel committed on top of this
        driver's last commit (under ``commit_lock``): what was staged is applied again on
        top of it, and a model call claimed at the last commit stays claimed."""
        committed = self.committed
        if head.revision == committed.revision:
            return
        moves = self.pending.moves
        self.lc.reset(head)
        self.pending.base, self.pending.events, self.pending.moves = None, [], []
        try:
            for event, payload in moves:
                self.stage(event, **payload)
        except InvalidTransition:  # the command changed what they applied to
            self._drop_staged()
            self.overtaken = True
        self.model.moved(committed.revision, head.revision)

    async def renew_lease(self) -> None:
        """Renew the run's lease (nothing when unfenced or lost); a refused renewal
        loses it (nothing the driver holds is lost: its next commit is refused).
        ``StatekernelError`` when the store cannot renew it now."""
        if self.tenure is None or self.lost:
            return
        try:
            await self.tenure.renew()
        except LeaseLost:
            self.lose()
            log_lease_lost(self.run.run_id, self.run.revision, "renewal refused")

    async def ensure_lease(self) -> None:
        """Return once the run's lease surely lasts the kernel's ``lease_margin`` more:
        called right before a model or tool call starts. ``LeaseLost`` (the driver is
        lost) if the lease moved on; ``StoreError`` if the store cannot say now."""
        run = self.committed
        self.committer.check_cancel(run.run_id)
        if self.lost:
            raise LeaseLost(run.run_id, run.revision)
        if self.tenure is None:
            return
        try:
            await self.tenure.ensure(self.kernel.lease_margin)
        except LeaseLost:
            self.lose()
            log_lease_lost(run.run_id, run.revision, "it moved on before an effect started")
            raise

    async def rearm(self, tenure: Tenure, head: Run) -> None:
        """Commit under ``tenure`` from now on, after the lease was given up with a
        commit (``released``), at ``head`` (the run as loaded under ``tenure``)."""
        self.tenure = tenure
        before = self.committer
        self.committer = Committer(self.kernel.store, tenure.lease)
        self.committer.cancelling = before.cancelling
        self.committer.carried_out = before.carried_out
        self.released = False
        await self.reset(head)

    async def reset(self, run: Run) -> None:
        """Point at a newer head loaded from the store (a command of this kernel, sharing
        the lease, may have committed meanwhile). Calls still in flight in that head stay
        this driver's: their tasks run on and their results in hand are kept; intents of
        anything else lapse."""
        if run.revision != self.lc.run.revision:
            self.lc.reset(run)
            self.model.claim = None
            active = run.state in ("dispatching_tools", "calling_model")
            turn = run.current_turn if active else None
            live = {r.id for r in turn.in_flight} if turn is not None else set()
            await self.calls.narrow(live)

    async def drive_ended(self, *, stop_tasks: bool) -> None:
        """A drive ended: its running calls are stopped (``stop_tasks``; not when the
        store failed: they go on, their results wait for the next drive), and the model
        call it claimed is no longer claimed (the next drive commits a fresh intent)."""
        if stop_tasks:
            await self.calls.stop()
        self.model.claim = None

    def forget(self) -> None:
        """Drop what only this process knew (its process is going down): results in hand
        and intents never started become what a crash leaves, for resume to decide."""
        self.calls.forget()

    async def stop_tasks(self) -> None:
        """Cancel running tool calls and wait until each has ended (their intents stay
        committed: resume decides). Results already in hand are kept: the driver stays
        busy, holding the run, and the next drive commits them.

        A sync tool's thread cannot be stopped: this waits for it to return, even if
        the caller is cancelled meanwhile, so no call of this driver is still executing
        when the drive reports that it stopped (and the run may be driven elsewhere).
        """
        await self.calls.stop()


# -- cancel (``Kernel.cancel``) ---------------------------------------------------------


def cancel_soon(driver: RunDriver, request: Cancellation) -> None:
    """Someone asked to cancel the run ``driver`` drives: from now on no model or tool call
    starts and nothing but the cancellation is committed (``Committer.cancelling``); a
    drive waiting for a call wakes up to carry it out (``carry_out_cancel``)."""
    if driver.committer.cancelling is None:
        driver.committer.cancelling = request
        driver.queue.put_nowait(None)


async def carry_out_cancel(driver: RunDriver) -> tuple[Event, ...]:
    """Stop the run as its cancel request asks (the one ``driver`` knows of, else the one
    its store keeps), in one commit that removes the request.

    Running calls are cancelled and waited for (a tool sees the cancellation; one that
    still returns has its result committed); results in hand are committed; a call
    whose intent landed but that never began gets an error result saying so. A call cut
    off while running stays in flight, as a crash leaves it: ``retry`` runs an
    idempotent one again and pauses for any other. The run fails with the ``Cancelled``
    failure (``run_cancelled``, ``run_failed``)."""
    store, run_id = driver.kernel.store, driver.run.run_id
    request = driver.committer.cancelling
    if request is None and isinstance(store, CancelsRuns):
        request = await store.cancel_request(run_id)
    if request is None:  # carried out meanwhile: the store refuses nothing more
        raise CancelRequested(run_id)
    driver.committer.cancelling = request
    calls = driver.calls
    await calls.stop()
    driver.model.claim = None
    with driver.dropped_unless_committed():
        if driver.run.state == "dispatching_tools":
            for outcome in calls.ready():
                calls.stage_result(outcome)
            for ids, _ in list(calls.unstarted.values()):
                why = f"cancelled before it began: {request.reason}"
                calls.stage_result(Outcome(tuple(ids), None, why))
        if driver.run.state not in ("failed", "completed"):  # paused is cancelled too
            driver.stage("cancel", cancellation=request)
        driver.pending.cancels = True
        events = (await driver._commit()).events  # a hook failing after it changes nothing
    calls.forget()  # what was not committed (calls that wait) stays in flight for retry
    calls.escaped = None
    driver.committer.cancelling = None
    driver.committer.carried_out = request
    return events


def deadline_request(run: Run, now: datetime | None = None) -> Cancellation | None:
    """The stop the run's passed ``deadline`` asks for (``DeadlineExceeded``), or None
    while it has none or it has not passed (at ``now``, default: the current time)."""
    deadline = run.deadline
    if deadline is None or (now or utcnow()) < deadline:
        return None
    reason = f"its deadline {deadline.isoformat(timespec='seconds')} passed"
    return Cancellation(reason, "deadline", deadline, DEADLINE_EXCEEDED)


async def expire(driver: RunDriver) -> tuple[Event, ...]:
    """Fail the run with ``DeadlineExceeded`` when its deadline passed and it is not
    failed or completed (a run touched after its deadline: a drive or a command); the
    events of that commit, none otherwise."""
    run = driver.run
    request = deadline_request(run)
    if request is None or run.state in ("failed", "completed"):
        return ()
    cancel_soon(driver, request)
    return await carry_out_cancel(driver)


@contextlib.contextmanager
def deadline_watch(driver: RunDriver) -> Iterator[None]:
    """While a drive runs: when the run's deadline passes, the drive stops at its next
    safe point as a cancel stops it (a call it waits for is cancelled), failing the run
    with ``DeadlineExceeded``."""
    deadline = driver.run.deadline
    request = None if deadline is None else deadline_request(driver.run, now=deadline)
    if deadline is None or request is None:
        yield
        return
    delay = max((deadline - utcnow()).total_seconds(), 0.0)
    handle = asyncio.get_running_loop().call_later(delay, cancel_soon, driver, request)
    try:
        yield
    finally:
        handle.cancel()
