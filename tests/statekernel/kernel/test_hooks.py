"""Each hook and each decision it can return."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import pytest

import statekernel as sk
from statekernel.errors import ConfigError
from statekernel.pauses import HookPause
from statekernel.stores import MemoryStore
from statekernel.testing import Crash, CrashAt, FaultPlan, FaultyStore, ScriptedProvider, call

from ..conftest import MakeKernel, drain, start

CALLS: list[dict[str, object]] = []


@sk.tool
def record(item: str) -> str:
    """Record an item (a side effect the tests can see)."""
    CALLS.append({"item": item})
    return f"recorded {item}"


def setup_function() -> None:
    CALLS.clear()


class Deciding(sk.Hooks):
    def __init__(self, decision: sk.Decision | None) -> None:
        self.decision = decision

    def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> sk.Decision | None:
        return self.decision


async def run_with(make_kernel: MakeKernel, hooks: object, script: list[object]) -> sk.Run:
    kernel, _, _ = make_kernel(script, tools=[record], hooks=hooks)
    run = await start(kernel)
    await drain(kernel, run.run_id)
    return await kernel.get(run.run_id)


def tool_results(run: sk.Run) -> list[tuple[str, bool]]:
    return [
        (p.content, p.is_error)
        for m in run.messages
        if m.role == "tool"
        for p in m.content
        if isinstance(p, sk.ToolResult)
    ]


async def test_continue_runs_the_tool(make_kernel: MakeKernel) -> None:
    run = await run_with(
        make_kernel, Deciding(sk.Continue()), [call("record", {"item": "a"}), "ok"]
    )
    assert CALLS == [{"item": "a"}]
    assert tool_results(run) == [("recorded a", False)]
    assert run.state == "completed"


async def test_rewrite_changes_the_input(make_kernel: MakeKernel) -> None:
    hooks = Deciding(sk.Rewrite({"item": "safe"}))
    run = await run_with(make_kernel, hooks, [call("record", {"item": "rm -rf"}), "ok"])
    assert CALLS == [{"item": "safe"}]
    turn = run.turns[0]
    assert turn.completed[0].input == {"item": "safe"}
    assert turn.completed[0].arguments == '{"item": "rm -rf"}'


async def test_skip_records_a_result_without_running(make_kernel: MakeKernel) -> None:
    run = await run_with(
        make_kernel, Deciding(sk.Skip({"cached": 1})), [call("record", {"item": "a"}), "ok"]
    )
    assert CALLS == []
    assert tool_results(run) == [('{"cached":1}', False)]
    assert run.turns[0].completed[0].attempt == 0  # never started
    skipped = await run_with(
        make_kernel, Deciding(sk.Skip(error="denied")), [call("record", {"item": "a"}), "ok"]
    )
    assert tool_results(skipped) == [("denied", True)]


async def test_pause_decision_pauses_before_the_side_effect(make_kernel: MakeKernel) -> None:
    run = await run_with(
        make_kernel,
        Deciding(sk.Pause("approve?", {"risk": "high"})),
        [call("record", {"item": "a"}), "ok"],
    )
    assert CALLS == []
    assert run.state == "paused"
    assert run.pause == sk.PauseInfo("approve?", "dispatching_tools", HookPause({"risk": "high"}))


@pytest.mark.parametrize("metadata", [[], 0, "", False, None])
async def test_a_pause_keeps_its_metadata_as_the_hook_gave_it(
    make_kernel: MakeKernel, metadata: Any
) -> None:
    # falsy JSON is kept (it was replaced by {}); only None means "none" and is {}
    hooks = Deciding(sk.Pause("approve?", metadata))
    run = await run_with(make_kernel, hooks, [call("record", {"item": "a"}), "ok"])
    assert run.pause is not None
    assert isinstance(run.pause.details, HookPause)
    kept = run.pause.details.metadata
    expected = {} if metadata is None else metadata
    assert (type(kept), kept) == (type(expected), expected)


async def test_finish_completes_without_running_remaining_calls(make_kernel: MakeKernel) -> None:
    script: list[object] = [[call("record", {"item": "a"}), call("record", {"item": "b"})], "never"]
    run = await run_with(make_kernel, Deciding(sk.Finish("enough")), script)
    assert CALLS == []
    assert run.state == "completed"
    assert [e for e, _ in tool_results(run)] == ["not run: the run finished (enough)"] * 2
    assert len(run.turns) == 1
    assert [r.skipped for r in run.turns[0].completed] == ["enough"] * 2


async def test_a_finish_reason_is_kept_whatever_it_reads(make_kernel: MakeKernel) -> None:
    script: list[object] = [call("record", {"item": "a"}), "never"]
    reason = "done (see the log) x" * 20  # long: stored apart from the record
    run = await run_with(make_kernel, Deciding(sk.Finish(reason)), script)
    assert run.state == "completed"
    assert run.turns[0].completed[0].skipped == reason


async def test_a_skip_whose_error_reads_like_a_finish_does_not_finish_the_run(
    make_kernel: MakeKernel,
) -> None:
    script: list[object] = [call("record", {"item": "a"}), "after the skip"]
    skip = sk.Skip(error="not run: the run finished (so it seems)")
    run = await run_with(make_kernel, Deciding(skip), script)
    assert run.state == "completed"
    assert len(run.turns) == 2, "the model reads the skipped call's result and answers"
    assert run.output == "after the skip"
    assert run.turns[0].completed[0].skipped is None


async def test_turn_prepared_hook_sets_the_exact_request(make_kernel: MakeKernel) -> None:
    class System(sk.Hooks):
        def on_turn_prepared(self, run: sk.Run, request: sk.ModelRequest) -> sk.ModelRequest:
            msgs = (sk.Message.system("be brief"), *request.messages)
            return attrs.evolve(request, messages=msgs, max_tokens=50)

    kernel, _, provider = make_kernel(["ok"], hooks=System())
    run = await start(kernel)
    await drain(kernel, run.run_id)
    sent = provider.requests[0]
    assert sent.messages[0] == sk.Message.system("be brief")
    assert sent.max_tokens == 50
    stored = await kernel.get(run.run_id)
    assert stored.turns[0].request == sent


async def test_model_completed_hook_can_replace_the_result(make_kernel: MakeKernel) -> None:
    class Redact(sk.Hooks):
        async def on_model_completed(self, run: sk.Run, result: sk.ModelResult) -> sk.ModelResult:
            return attrs.evolve(result, message=sk.Message.assistant("[redacted]"))

    kernel, _, _ = make_kernel(["secret"], hooks=Redact())
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert (await kernel.get(run.run_id)).messages[-1].text == "[redacted]"


async def test_turn_completed_decisions(make_kernel: MakeKernel) -> None:
    class AfterTurn(sk.Hooks):
        def __init__(self, decision: sk.Decision | None) -> None:
            self.decision = decision
            self.turns: list[int] = []

        def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision | None:
            self.turns.append(turn.index)
            decision, self.decision = self.decision, None
            return decision

    script = [call("record", {"item": "a"}), "text", "more"]
    hooks = AfterTurn(sk.Finish("stop early"))
    run = await run_with(make_kernel, hooks, script)
    assert run.state == "completed"
    assert len(run.turns) == 1

    hooks = AfterTurn(sk.Pause("review"))
    kernel, _, _ = make_kernel(script, tools=[record], hooks=hooks)
    started = await start(kernel)
    await drain(kernel, started.run_id)
    paused = await kernel.get(started.run_id)
    assert paused.state == "paused"
    assert paused.pause == sk.PauseInfo("review", "preparing_turn")
    assert len(paused.turns) == 1
    await kernel.resume(started.run_id)
    await drain(kernel, started.run_id)
    assert (await kernel.get(started.run_id)).state == "completed"

    # Continue after a text-only turn takes another turn
    hooks = AfterTurn(None)
    kernel, _, _ = make_kernel(["first", "second"], hooks=hooks)
    hooks.decision = sk.Continue()
    started = await start(kernel)
    await drain(kernel, started.run_id)
    final = await kernel.get(started.run_id)
    assert [m.text for m in final.messages] == ["hi", "first", "second"]
    assert hooks.turns == [0, 1]


async def test_tool_call_completed_hook_sees_the_output(make_kernel: MakeKernel) -> None:
    seen: list[tuple[str, object]] = []

    class Observe(sk.Hooks):
        def on_tool_call_completed(self, run: sk.Run, call: sk.ToolCallRecord) -> None:
            seen.append((call.id, call.output))

    await run_with(make_kernel, Observe(), [call("record", {"item": "z"}), "ok"])
    assert seen == [("call_0_0", "recorded z")]


async def test_a_raising_hook_fails_the_run_and_retry_completes(make_kernel: MakeKernel) -> None:
    class Flaky(sk.Hooks):
        def __init__(self) -> None:
            self.calls = 0

        def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> None:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("policy service down")

    kernel, _, _ = make_kernel([call("record", {"item": "a"}), "ok"], tools=[record], hooks=Flaky())
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    assert events[-1].type == "run_failed"
    failed = await kernel.get(run.run_id)
    assert failed.state == "failed"
    assert failed.failure == sk.FailureInfo(
        "RuntimeError", "policy service down", "dispatching_tools"
    )
    assert CALLS == []
    await kernel.retry(run.run_id)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert CALLS == [{"item": "a"}]


async def test_a_raising_prepare_hook_fails_in_preparing_turn(make_kernel: MakeKernel) -> None:
    class Broken(sk.Hooks):
        def on_turn_prepared(self, run: sk.Run, request: sk.ModelRequest) -> None:
            raise KeyError("memory")

    kernel, _, _ = make_kernel(["ok"], hooks=Broken())
    run = await start(kernel)
    await drain(kernel, run.run_id)
    failed = await kernel.get(run.run_id)
    assert failed.failure is not None
    assert failed.failure.failed_in == "preparing_turn"
    assert failed.failure.error == "KeyError"


async def test_a_pause_waits_for_calls_already_in_flight(make_kernel: MakeKernel) -> None:
    import asyncio

    @sk.tool
    async def slow(item: str) -> str:
        """A slow call that is running when the pause is asked for."""
        await asyncio.sleep(0.05)
        CALLS.append({"slow": item})
        return f"slow {item}"

    class ApproveRecord(sk.Hooks):
        def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> sk.Decision | None:
            if call.name == "record" and run.resume_value is None:
                return sk.Pause("approval")
            return None

    script = [[call("slow", {"item": "a"}), call("record", {"item": "b"})], "ok"]
    kernel, _, _ = make_kernel(script, tools=[slow, record], hooks=ApproveRecord())
    run = await start(kernel)
    await drain(kernel, run.run_id)
    paused = await kernel.get(run.run_id)
    assert paused.state == "paused"
    assert paused.current_turn is not None
    assert [r.id for r in paused.current_turn.completed] == ["call_0_0"]  # finished first
    assert paused.current_turn.in_flight == ()
    await kernel.resume(run.run_id, value="yes")
    await drain(kernel, run.run_id)
    assert (await kernel.get(run.run_id)).state == "completed"
    assert CALLS == [{"slow": "a"}, {"item": "b"}]  # nothing ran twice, nothing uncertain


def test_a_misspelt_hook_method_is_a_config_error() -> None:
    class Typo(sk.Hooks):
        def on_tool_started(self, run: sk.Run, call: sk.ToolCallRecord) -> None:
            """Meant to be on_tool_call_started."""

    with pytest.raises(ConfigError) as info:
        sk.Kernel("memory://", hooks=Typo())
    message = str(info.value)
    assert "'on_tool_started'" in message
    assert "did you mean 'on_tool_call_started'?" in message
    for known in sk.Hooks.__dict__:
        if known.startswith("on_"):
            assert known in message


def test_an_unknown_hook_on_any_object_is_a_config_error() -> None:
    class Plain:
        def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> None:
            """A known hook."""

        def on_everything(self) -> None:
            """Not a hook."""

        def helper(self) -> None:
            """Not named like a hook: allowed."""

    with pytest.raises(ConfigError, match="'on_everything'") as info:
        sk.Kernel("memory://", hooks=Plain())
    assert "did you mean" not in str(info.value)


def test_known_hooks_and_other_attributes_are_accepted() -> None:
    class Fine:
        on_call_count = 0  # not a method

        def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> None:
            """A known hook."""

        def helper(self) -> None:
            """Not named like a hook."""

    sk.Kernel("memory://", hooks=Fine())
    sk.Kernel("memory://", hooks=sk.Hooks())


class Completions(sk.Hooks):
    """Notes each on_tool_call_completed call; may raise on the first ones."""

    def __init__(self, raising: list[BaseException] | None = None) -> None:
        self.seen: list[tuple[str, object, str | None]] = []
        self.raising = raising or []

    def on_tool_call_completed(self, run: sk.Run, call: sk.ToolCallRecord) -> None:
        completed = run.current_turn.completed if run.current_turn else ()
        assert call.id in [r.id for r in completed]  # the result is committed already
        if self.raising:
            raise self.raising.pop(0)
        self.seen.append((call.id, call.output, call.error))


async def test_tool_call_completed_runs_once_for_each_call_of_one_commit(
    make_kernel: MakeKernel,
) -> None:
    @sk.tool(idempotent=True)
    def read(key: str) -> str:
        """Read a key (idempotent: identical calls share one run)."""
        CALLS.append({"read": key})
        return f"value {key}"

    hooks = Completions()
    script: list[object] = [[call("read", {"key": "k"}), call("read", {"key": "k"})], "ok"]
    kernel, _, _ = make_kernel(script, tools=[read], hooks=hooks)
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert CALLS == [{"read": "k"}]
    assert hooks.seen == [("call_0_0", "value k", None), ("call_0_1", "value k", None)]

    finish = Completions()
    script = [[call("record", {"item": "a"}), call("record", {"item": "b"})], "never"]

    class FinishAndObserve(Completions):
        def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> sk.Decision:
            return sk.Finish("enough")

    finish = FinishAndObserve()
    await run_with(make_kernel, finish, script)
    why = "not run: the run finished (enough)"
    assert finish.seen == [("call_0_0", None, why), ("call_0_1", None, why)]


async def test_a_crash_between_the_commit_and_the_hook_skips_the_hook() -> None:
    inner = MemoryStore()
    plan = FaultPlan([CrashAt("after_commit", 4)])  # the commit of tool_call_completed
    hooks = Completions()
    script = [call("record", {"item": "a"}), "ok"]

    def kernel_over(store: object) -> sk.Kernel:
        provider = ScriptedProvider(script)
        return sk.Kernel(store, tools=[record], hooks=hooks, providers={"scripted": provider})  # type: ignore[arg-type]

    kernel = kernel_over(FaultyStore(inner, plan))
    run = await start(kernel)
    with pytest.raises(Crash):
        await drain(kernel, run.run_id)
    assert [e.type for e in await inner.events(run.run_id)][-1] == "tool_call_completed"
    assert hooks.seen == []

    resumed = kernel_over(inner)
    await drain(resumed, run.run_id)
    final = await resumed.get(run.run_id)
    assert final.state == "completed"
    assert CALLS == [{"item": "a"}]
    assert hooks.seen == []  # at most once: a crash after the commit skipped it for good


async def test_a_raising_completion_hook_fails_the_run_and_retry_does_not_call_it_again(
    make_kernel: MakeKernel,
) -> None:
    hooks = Completions(raising=[RuntimeError("audit log down")])
    script = [call("record", {"item": "a"}), call("record", {"item": "b"}), "ok"]
    kernel, _, _ = make_kernel(script, tools=[record], hooks=hooks)
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    assert [e.type for e in events][-2:] == ["tool_call_completed", "run_failed"]
    failed = await kernel.get(run.run_id)
    assert failed.failure == sk.FailureInfo("RuntimeError", "audit log down", "dispatching_tools")
    assert failed.current_turn is not None
    assert [r.output for r in failed.current_turn.completed] == ["recorded a"]  # result stays

    await kernel.retry(run.run_id)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert CALLS == [{"item": "a"}, {"item": "b"}]  # nothing ran twice
    assert hooks.seen == [("call_1_0", "recorded b", None)]  # call_0_0's hook is not re-run


async def test_a_crash_inside_the_completion_hook_is_not_repeated_on_resume() -> None:
    inner = MemoryStore()
    hooks = Completions(raising=[Crash("after_commit", 0)])
    script = [call("record", {"item": "a"}), "ok"]

    def kernel_over() -> sk.Kernel:
        provider = ScriptedProvider(script)
        return sk.Kernel(inner, tools=[record], hooks=hooks, providers={"scripted": provider})

    kernel = kernel_over()
    run = await start(kernel)
    with pytest.raises(Crash):
        await drain(kernel, run.run_id)
    resumed = kernel_over()
    await drain(resumed, run.run_id)
    assert (await resumed.get(run.run_id)).state == "completed"
    assert CALLS == [{"item": "a"}]
    assert hooks.seen == []


class Observer(sk.Hooks):
    """Notes what the store holds when a result is observed and when the turn ends."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.notes: list[tuple[str, list[str]]] = []

    async def _head(self, run: sk.Run) -> list[str]:
        return [e.type for e in await self.store.events(run.run_id)]

    async def on_tool_call_completed(self, run: sk.Run, call: sk.ToolCallRecord) -> None:
        self.notes.append(("completed " + call.id, await self._head(run)))

    async def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> None:
        self.notes.append((f"turn {turn.index}", await self._head(run)))


async def test_an_observed_result_lands_before_the_turn_goes_on() -> None:
    store = MemoryStore()
    hooks = Observer(store)
    provider = ScriptedProvider([call("record", {"item": "a"}), "ok"])
    kernel = sk.Kernel(store, tools=[record], hooks=hooks, providers={"scripted": provider})
    run = await start(kernel)
    await drain(kernel, run.run_id)
    (first, stored), (second, later) = hooks.notes[:2]
    assert (first, second) == ("completed call_0_0", "turn 0")
    assert stored[-1] == "tool_call_completed"  # its own commit, before the turn's end
    assert later == stored  # the end of the turn is decided before it lands
    events = await store.events(run.run_id)
    result = next(e for e in events if e.type == "tool_call_completed")
    end = next(e for e in events if e.type == "tools_completed")
    assert end.revision == result.revision + 1


async def test_a_hook_that_raises_on_results_landed_at_close_fails_the_run() -> None:
    """``aclose`` commits the results a driver holds; a hook observing them that raises
    fails the run as in a drive, and closing never raises it."""
    ran = asyncio.Event()

    @sk.tool(idempotent=True)
    async def quick(key: str) -> str:
        """Answer at once."""
        ran.set()
        return f"ok {key}"

    class Observer(sk.Hooks):
        async def on_tool_call_completed(self, run: sk.Run, call: sk.ToolCallRecord) -> None:
            raise RuntimeError("the observer broke")

    store = MemoryStore()
    provider = ScriptedProvider([call("quick", {"key": "a"}), "done"])
    kernel = sk.Kernel(store, tools=[quick], providers={"scripted": provider}, hooks=Observer())
    run = await kernel.start(model="scripted/x", messages=["go"])
    while (await kernel.get(run.run_id)).state != "dispatching_tools":
        await kernel.step(run.run_id)  # the answer and the call's intent: it runs on
    await ran.wait()
    while not kernel._tenancy.drivers[run.run_id].calls.outcomes:  # noqa: ASYNC110 - its result in hand
        await asyncio.sleep(0)
    await kernel.aclose()
    after = await store.load(run.run_id)
    assert after.state == "failed"
    assert after.failure is not None
    assert after.failure.error == "RuntimeError"
    assert after.failure.message == "the observer broke"
    assert [r.output for r in after.current_turn.completed] == ["ok a"]  # type: ignore[union-attr]


async def test_a_hook_that_raises_on_an_answer_fails_the_run_resume_returns_it() -> None:
    """The answer ``resume`` commits is a result the hooks observe; one that raises
    fails the run (committed), and ``resume`` returns it instead of raising."""

    class Observer(sk.Hooks):
        async def on_tool_call_completed(self, run: sk.Run, call: sk.ToolCallRecord) -> None:
            raise RuntimeError("the observer broke")

    ask = sk.ask_user()
    provider = ScriptedProvider([call(ask.name, {"question": "why?"}), "done"])
    store = MemoryStore()
    async with sk.Kernel(store, tools=[ask], providers={"scripted": provider}) as plain:
        run = await plain.start(model="scripted/x", messages=["go"])
        async for _ in plain.run(run.run_id):
            pass
    async with sk.Kernel(
        store, tools=[ask], providers={"scripted": provider}, hooks=Observer()
    ) as kernel:
        resumed = await kernel.resume(run.run_id, value="because")
    assert resumed.state == "failed"
    assert resumed.failure is not None
    assert resumed.failure.message == "the observer broke"
    stored = await store.load(run.run_id)
    assert stored.revision == resumed.revision
    assert [r.output for r in stored.current_turn.completed] == ["because"]  # type: ignore[union-attr]
