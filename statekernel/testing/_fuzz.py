"""``check_crash_resume``: crash an agent at scheduled points, resume it, check the promise.

The invariants checked (each failure raises ``AssertionError`` saying which):

1. after crashes and resumes the run ends like the uninterrupted run: same state,
   transcript and tool results (``model_restarted`` events aside);
2. a non-idempotent tool runs at most once per call id; an idempotent one at least once;
3. revisions are contiguous, every committed state is declared, each consecutive pair
   is a declared transition (or a data-only commit), events are numbered without gaps;
4. nothing acknowledged is lost: after a crash the stored head is never older than the
   newest revision the caller saw committed;
6. a crash never writes ``failed``.
"""

from __future__ import annotations

import contextvars
import inspect
import itertools
import json
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from statekernel._kernel.kernel import Kernel
from statekernel._kernel.middleware import ToolInvocation
from statekernel._kernel.tools import Tool
from statekernel._lifecycle.trace import DATA_EVENTS, DECLARED, transitions_of
from statekernel._records.events import Event
from statekernel._records.messages import JSON
from statekernel._records.pauses import Uncertain
from statekernel._records.run import MAX_TURNS, STATE_IDS, Run, Turn
from statekernel._storage.protocol import CheckpointStore
from statekernel._storage.shielding import shielded
from statekernel.errors import InvalidArgument, RunNotFound
from statekernel.testing._faults import Crash, CrashAt, FaultPlan, FaultyProvider, FaultyStore

__all__ = [
    "CrashResumeReport",
    "Ledger",
    "check_crash_resume",
    "fuzz_agent",
    "run_history_ok",
    "run_outcome",
    "same_outcome",
]

AgentFactory = Callable[[], Mapping[str, Any]]
"""Returns fresh ``Kernel`` keyword arguments (tools, hooks, providers, ...), as a new
process would build them."""

"""(source, target, event) of every transition the chart declares."""


_CALL_KEY: contextvars.ContextVar[str] = contextvars.ContextVar("ledger_call_key", default="")


@attrs.define
class Ledger:
    """What the tools really did, across every simulated process, by idempotency key
    (``f"{run_id}:{call_id}"``).

    Use both ``middleware()`` (it names the call) and ``wrap(tool)`` for each tool (it
    records inside the function, where the effect happens: a sync tool's thread that
    finishes after its call was cancelled is seen too).
    """

    executions: dict[str, int] = attrs.Factory(lambda: defaultdict(int))
    outcomes: dict[str, tuple[bool, Any]] = attrs.Factory(dict)

    def middleware(self) -> Any:
        """Innermost middleware naming the call that the wrapped tool records under.

        Returns:
            The middleware, to put last in the kernel's ``middleware``.
        """

        async def record(call: Any, nxt: Any) -> Any:
            if not isinstance(call, ToolInvocation):
                return await nxt(call)
            token = _CALL_KEY.set(f"{call.run.run_id}:{call.call.id}")
            try:
                return await nxt(call)
            finally:
                _CALL_KEY.reset(token)

        return record

    def wrap(self, tool: Tool) -> Tool:
        """``tool`` with its function recording each execution and its outcome.

        An async call of a tool that is not idempotent runs to its end even when its drive
        is cancelled (as a sync tool's thread does), so its outcome is known when the
        harness answers for it as an operator would, from what really happened.

        Returns:
            A copy of ``tool`` whose function records into this ledger.
        """
        fn = tool.fn
        if inspect.iscoroutinefunction(fn):

            async def execute(key: str, kwargs: dict[str, Any]) -> Any:
                try:
                    output = await fn(**kwargs)
                except Exception as exc:
                    self.outcomes[key] = (False, exc)
                    raise
                self.outcomes[key] = (True, output)
                return output

            async def run_async(**kwargs: Any) -> Any:
                key = self._started()
                if tool.idempotent:
                    return await execute(key, kwargs)
                return await shielded(execute(key, kwargs))

            return attrs.evolve(tool, fn=run_async)

        def run(**kwargs: Any) -> Any:
            key = self._started()
            try:
                output = fn(**kwargs)
            except Exception as exc:
                self.outcomes[key] = (False, exc)
                raise
            self.outcomes[key] = (True, output)
            return output

        return attrs.evolve(tool, fn=run)

    def _started(self) -> str:
        key = _CALL_KEY.get()
        self.executions[key] += 1
        return key


@attrs.frozen
class CrashResumeReport:
    """What happened: crashes fired, processes used, resolutions made, the final runs."""

    crashes: tuple[CrashAt, ...]
    processes: int
    resolutions: int
    final: Run
    baseline: Run


def run_outcome(run: Run | Sequence[Turn]) -> tuple[Any, ...]:
    """What must be equal between an interrupted and an uninterrupted run (or between
    their turns, given as a sequence).

    Tool calls of a turn are compared by id: concurrent calls finish in any order.
    """
    turns = tuple(
        (t.index, sorted((r.id, r.name, r.input, r.output, r.error) for r in t.completed))
        for t in (run.turns if isinstance(run, Run) else run)
    )
    if not isinstance(run, Run):
        return turns
    return run.state, run.messages, turns, run.context


def _first_cut_off(events: Sequence[Event]) -> int | None:
    """The turn of the first answer cut off after calls started early, if any."""
    for event in events:
        if event.type == "model_completed" and "cut_off" in event.data:
            return int(event.data["index"])
    return None


def same_outcome(final: Run, baseline: Run, events: Sequence[Event]) -> None:
    """Invariant 1: ``final`` (its persisted ``events``) ends as ``baseline``, an
    undisturbed drive, did. An answer cut off after calls started early (a drive that
    stopped while it streamed) is closed as committed: the run goes another way from
    that turn on, and everything before it is the same."""
    cut = _first_cut_off(events)
    if cut is None:
        assert run_outcome(final) == run_outcome(baseline), "invariant 1: outcome differs"
        return
    why = f"invariant 1: outcome differs before turn {cut} (cut off)"
    assert run_outcome(final.turns[:cut]) == run_outcome(baseline.turns[:cut]), why
    assert final.turns[cut].request.messages == baseline.turns[cut].request.messages, why


async def run_history_ok(store: CheckpointStore, run_id: str) -> None:
    """Invariant 3 over every stored revision of a run."""
    head = await store.load(run_id)
    runs = [await store.load(run_id, revision=r) for r in range(head.revision + 1)]
    assert [r.revision for r in runs] == list(range(head.revision + 1)), "revisions not contiguous"
    events = await store.events(run_id)
    assert [e.seq for e in events] == list(range(len(events))), "event seq has gaps"
    by_revision: dict[int, list[Event]] = defaultdict(list)
    for event in events:
        by_revision[event.revision].append(event)
    for before, after in itertools.pairwise(runs):
        assert after.state in STATE_IDS, f"undeclared state {after.state!r}"
        committed = by_revision.get(after.revision, [])
        assert committed, f"revision {after.revision} committed no events"
        assert after.event_count - before.event_count == len(committed), "event count drifted"
        steps = transitions_of(before.state, committed)
        if not steps:
            assert {e.type for e in committed} <= DATA_EVENTS, f"unknown events at {after.revision}"
            assert after.state == before.state, f"data commit changed state at {after.revision}"
            continue
        for step in steps:
            assert step in DECLARED, f"undeclared transition {step} at r{after.revision}"
        ends = steps[-1][1]
        assert ends == after.state, f"r{after.revision} is {after.state}, its events end in {ends}"


@attrs.define
class _Approvals:
    """The pauses ``approve(run)`` answered, each at the point the run had reached (its
    transcript, turns and calls done): a pause seen again at the same point after its
    answer landed means the answer never satisfies it, and the run would pause forever."""

    answered: dict[tuple[Any, ...], JSON] = attrs.Factory(dict)

    @staticmethod
    def point(run: Run) -> tuple[Any, ...]:
        """The pause of ``run`` and how far the run got: what an answer must change."""
        assert run.pause is not None
        turn = run.current_turn
        done = len(turn.completed) if turn is not None else 0
        details = json.dumps(run.pause.metadata, sort_keys=True, default=repr)
        return run.pause.reason, details, len(run.messages), len(run.turns), done

    def check(self, run: Run) -> None:
        """Fail fast when ``run`` is paused where an earlier answer left it."""
        point = self.point(run)
        if point not in self.answered:
            return
        assert run.pause is not None
        raise AssertionError(
            f"run {run.run_id!r} paused again with no progress after approve(run) answered"
            f" {self.answered[point]!r:.200}: pause {run.pause.reason!r} with details"
            f" {run.pause.metadata!r:.300}. Pass check_crash_resume an approve= that returns"
            " what this pause waits for (the value its hook reads as run.resume_value),"
            ' e.g. approve=lambda run: {"approve": run.pause.metadata["call"]}'
        )

    def done(self, run: Run, value: JSON) -> None:
        """``value`` answered ``run``'s pause (its resume landed)."""
        self.answered[self.point(run)] = value


async def _settle(
    kernel: Kernel, run: Run, ledger: Ledger, approve: Any, approvals: _Approvals | None = None
) -> bool:
    """Act like an operator on a run at rest; False when it is completed. ``approvals``:
    the pauses answered so far (a pause seen again where an answer left it fails)."""
    approvals = approvals if approvals is not None else _Approvals()
    if run.state == "completed":
        return False
    if run.state == "failed":
        await kernel.retry(run.run_id)
    elif run.pause is not None and isinstance(run.pause.details, Uncertain):
        open_calls = run.pause.details.unresolved
        if not open_calls:  # all answered before a crash came ahead of the resume
            await kernel.resume(run.run_id)
        for call in open_calls:
            done = ledger.outcomes.get(f"{run.run_id}:{call.id}")
            if done is None:
                await kernel.resolve_tool_call(run.run_id, call.id, rerun=True)
            elif done[0]:
                await kernel.resolve_tool_call(run.run_id, call.id, output=done[1])
            else:
                error = f"{type(done[1]).__name__}: {done[1]}"
                await kernel.resolve_tool_call(run.run_id, call.id, error=error)
    elif run.pause is not None and run.pause.reason == MAX_TURNS:
        await kernel.resume(run.run_id, max_turns=(run.max_turns or 0) + 10)
    else:
        approvals.check(run)
        value = approve(run)
        value = await value if inspect.isawaitable(value) else value
        await kernel.resume(run.run_id, value=value)
        approvals.done(run, value)
    return True


def _kernel(
    agent: AgentFactory, store: CheckpointStore, plan: FaultPlan | None, ledger: Ledger
) -> Kernel:
    kwargs = dict(agent())
    kwargs["tools"] = [ledger.wrap(t) for t in kwargs.pop("tools", ())]
    providers = dict(kwargs.pop("providers", {}) or {})
    middleware = list(kwargs.pop("middleware", ()))
    if plan is not None:
        store = FaultyStore(store, plan)
        providers = {name: FaultyProvider(p, plan) for name, p in providers.items()}
        middleware.append(plan.middleware())
    middleware.append(ledger.middleware())
    return Kernel(store, providers=providers, middleware=middleware, **kwargs)


def _not_left_over(run_id: str, processes: int) -> None:
    """A run found before the first process started it was left by an earlier check."""
    if processes == 1:
        raise InvalidArgument(
            f"run {run_id!r} is already in the store: each check needs a store without "
            "it (a fresh store per example, e.g. store='sqlite:///' + a new temporary "
            "folder, or another start['run_id'])"
        )


async def _drive(
    agent: AgentFactory,
    store: Callable[[], CheckpointStore],
    start: Mapping[str, Any],
    plan: FaultPlan | None,
    ledger: Ledger,
    approve: Any,
    max_processes: int,
) -> tuple[Run, int, int]:
    processes = resolutions = 0
    approvals = _Approvals()
    run_id: str = start.get("run_id") or "fuzzed-run"
    acked = -1
    while processes < max_processes:
        processes += 1
        kernel = _kernel(agent, store(), plan, ledger)
        try:
            if acked < 0:
                try:
                    await kernel.get(run_id)
                except RunNotFound:
                    await kernel.start(**{**start, "run_id": run_id})
                else:
                    _not_left_over(run_id, processes)
                acked = 0
            while True:
                async for event in kernel.run(run_id):
                    if event.persisted:
                        acked = max(acked, event.revision)
                run = await kernel.get(run_id)
                acked = max(acked, run.revision)
                if not await _settle(kernel, run, ledger, approve, approvals):
                    return run, processes, resolutions
                resolutions += 1
        except Crash:
            if acked >= 0:
                head = await store().load(run_id)
                assert head.revision >= acked, (
                    f"invariant 4: head r{head.revision} older than acknowledged r{acked}"
                )
        finally:
            await kernel.aclose()
    raise AssertionError(f"run did not complete within {max_processes} processes")


async def check_crash_resume(
    agent: AgentFactory,
    *,
    start: Mapping[str, Any],
    schedule: Sequence[CrashAt],
    store: Callable[[], CheckpointStore] | str,
    baseline_store: Callable[[], CheckpointStore] | None = None,
    approve: Callable[[Run], Any | Awaitable[Any]] = lambda run: True,
    max_processes: int = 60,
) -> CrashResumeReport:
    """Run ``agent`` uninterrupted, then again crashing per ``schedule``; check invariants.

    ``agent()`` returns fresh ``Kernel`` keyword arguments (a new "process" each time);
    ``store`` is a store URL (opened for this check and closed at its end) or a function
    returning the store a new process opens (the same data each call). The run must not
    be in it yet (``InvalidArgument``): give each check a fresh store, or another
    ``start["run_id"]``. ``start`` holds ``kernel.start`` arguments. Paused runs are
    resumed with ``approve(run)`` (default: ``True``), which must return what the pause
    waits for: an approval hook that pauses until ``run.resume_value`` names the call
    needs ``approve=lambda run: {"approve": run.pause.metadata["call"]}`` or the like, and
    a run that pauses again at the same point after its answer fails the check at once.
    Uncertain tool calls are resolved with what the tool really did.

    Returns:
        The report: the crashes that fired, the processes used, the resolutions made,
            and the final run with the uninterrupted one it was compared with.

    Raises:
        AssertionError: an invariant does not hold (named in the message), the run
            paused again with no progress after ``approve(run)`` answered its pause (the
            pause's reason and details named), or it did not complete within
            ``max_processes`` processes.
        InvalidArgument: the run is in ``store`` already.
    """
    if not isinstance(store, str):
        return await _check(agent, start, schedule, store, baseline_store, approve, max_processes)
    from statekernel.stores import open_store

    opened = open_store(store)
    try:
        return await _check(
            agent, start, schedule, lambda: opened, baseline_store, approve, max_processes
        )
    finally:
        await opened.aclose()


async def _check(
    agent: AgentFactory,
    start: Mapping[str, Any],
    schedule: Sequence[CrashAt],
    store: Callable[[], CheckpointStore],
    baseline_store: Callable[[], CheckpointStore] | None,
    approve: Callable[[Run], Any | Awaitable[Any]],
    max_processes: int,
) -> CrashResumeReport:
    from statekernel.stores import MemoryStore

    base_store = MemoryStore()
    base_ledger, ledger = Ledger(), Ledger()
    baseline, _, _ = await _drive(
        agent, baseline_store or (lambda: base_store), start, None, base_ledger, approve, 5
    )
    plan = FaultPlan(schedule)
    final, processes, resolutions = await _drive(
        agent, store, start, plan, ledger, approve, max_processes
    )
    inner = store()
    events = await inner.events(final.run_id)
    same_outcome(final, baseline, events)
    cut = _first_cut_off(events)
    tools: dict[str, Tool] = {t.name: t for t in agent().get("tools", ())}
    names = {f"{final.run_id}:{r.id}": r.name for t in final.turns for r in t.completed}
    for key, count in ledger.executions.items():
        tool = tools.get(names.get(key, ""))
        if tool is not None and not tool.idempotent:
            assert count <= 1, f"invariant 2: {key} ({tool.name}) ran {count} times"
    kept = final.turns if cut is None else final.turns[:cut]
    before = {f"{final.run_id}:{r.id}" for t in kept for r in t.completed}
    for key in base_ledger.executions:
        if key in before or cut is None:
            assert ledger.executions.get(key, 0) >= 1, f"invariant 2: {key} never ran"
    await run_history_ok(inner, final.run_id)
    failures = [e for e in await inner.events(final.run_id) if e.type == "run_failed"]
    assert all(e.data["error"] != "Crash" for e in failures), "invariant 6: a crash wrote failed"
    return CrashResumeReport(tuple(plan.fired), processes, resolutions, final, baseline)


def fuzz_agent(
    script: Sequence[object], *, max_concurrent: int = 2, eager: bool = False
) -> AgentFactory:
    """An agent for the fuzzer: a scripted model and five tools with a visible ledger.

    ``eager``: calls start while the answer streams (``DispatchPolicy(eager=True)``).

    ``side_effect`` is not idempotent, ``lookup`` is, ``explode`` always raises,
    ``ask`` (``ask_user``) pauses the run for an answer (``approve(run)`` gives it), and
    ``helper`` (``delegate``) runs a child run that calls ``lookup`` and answers.
    Their outputs depend only on their input, as the invariants require.

    Returns:
        A function returning fresh ``Kernel`` keyword arguments (tools, providers,
            dispatch, ``max_turns=None``) on each call, for ``check_crash_resume``.
    """
    from statekernel._kernel.asking import ask_user
    from statekernel._kernel.delegate import delegate
    from statekernel._kernel.dispatch import DispatchPolicy
    from statekernel._kernel.tools import tool
    from statekernel.providers._scripted import ScriptedProvider, call

    @tool
    def side_effect(key: str) -> str:
        """Write something somewhere (not idempotent)."""
        return f"wrote {key}"

    @tool(idempotent=True)
    def lookup(key: str) -> dict[str, str]:
        """Read something (idempotent)."""
        return {"key": key, "value": key.upper()}

    @tool
    def explode(key: str) -> str:
        """Always fails."""
        raise RuntimeError(f"exploded on {key}")

    helper = delegate("helper", "Hand a task over.", model="child/fuzz", tools=[lookup])
    child_script = [call("lookup", {"key": "child"}), "child done"]

    def make() -> Mapping[str, Any]:
        return {
            "tools": [side_effect, lookup, explode, ask_user("ask"), helper],
            "providers": {
                "scripted": ScriptedProvider(list(script)),
                "child": ScriptedProvider(child_script),
            },
            "dispatch": DispatchPolicy(max_concurrent=max_concurrent, eager=eager),
            "max_turns": None,
        }

    return make
