"""The kernel loop: commits, persisted events, pause/resume, input, max_turns, fork."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

import statekernel as sk
from statekernel.errors import ConflictError, InvalidArgument, InvalidTransition, RunNotFound
from statekernel.pauses import HookPause
from statekernel.providers import StreamEnd, StreamPart, TextDelta
from statekernel.stores import MemoryStore
from statekernel.testing import Fail, Reply, call

from ..conftest import MakeKernel, drain, start


@sk.tool
def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: What to echo.
    """
    return f"echo: {text}"


async def test_one_tool_turn_persists_exactly_the_documented_events(
    make_kernel: MakeKernel,
) -> None:
    kernel, store, _ = make_kernel([call("echo", {"text": "a"}), "done"], tools=[echo])
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    persisted = [e.type for e in events if e.persisted]
    assert persisted == [
        "run_started",
        "turn_started",
        "turn_prepared",
        "model_started",
        "model_completed",
        "tool_call_started",
        "tool_call_completed",
        "tools_completed",
        "turn_completed",
        "turn_started",
        "turn_prepared",
        "model_started",
        "model_completed",
        "turn_completed",
        "run_completed",
    ]
    stored = await store.events(run.run_id)
    assert [e.type for e in stored] == persisted
    assert [e.seq for e in stored] == list(range(len(stored)))
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert final.messages[-1].text == "done"
    tool_msg = final.messages[2]
    assert tool_msg.role == "tool"
    assert tool_msg.content[0].content == "echo: a"  # type: ignore[union-attr]


async def test_commits_land_at_effect_boundaries(make_kernel: MakeKernel) -> None:
    kernel, store, _ = make_kernel([call("echo", {"text": "a"}), "ok"], tools=[echo])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    cps = [c for c in store.checkpoints if c.run.run_id == run.run_id]
    assert [[e.type for e in c.events] for c in cps[1:]] == [
        # the model's intent lands before the call
        ["run_started", "turn_started", "turn_prepared", "model_started"],
        # its answer lands with the intent of the call it asked for, before the tool runs
        ["model_completed", "tool_call_started"],
        # the result, the end of the turn and the next model intent
        [
            "tool_call_completed",
            "tools_completed",
            "turn_completed",
            "turn_started",
            "turn_prepared",
            "model_started",
        ],
        ["model_completed", "turn_completed", "run_completed"],
    ]
    assert [c.run.state for c in cps] == [
        "init",
        "calling_model",
        "dispatching_tools",
        "calling_model",
        "completed",
    ]


async def test_revisions_count_commits(make_kernel: MakeKernel) -> None:
    script = [[call("echo", {"text": "a"}), call("echo", {"text": "b"})], "ok"]
    kernel, store, _ = make_kernel(script, tools=[echo])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    cps = [c for c in store.checkpoints if c.run.run_id == run.run_id]
    assert [c.run.revision for c in cps] == list(range(len(cps)))
    assert all(c.run.state in sk.STATE_IDS for c in cps)
    for before, after in itertools.pairwise(cps):
        assert after.events
        assert all(e.revision == after.run.revision for e in after.events)
        assert [e.seq for e in after.events] == list(
            range(before.run.event_count, after.run.event_count)
        )
    # the transcript is appended, never rewritten, and only new parts are sent
    assert not any(c.transcript_replaced for c in cps[1:])
    assert sum(c.new_messages for c in cps) == len(cps[-1].run.messages)
    assert sum(c.new_turns for c in cps) == len(cps[-1].run.turns) == 2


async def test_live_events_stream_before_their_commit(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel([Reply(text="hello world", chunk=3)])
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    deltas = [e.data["text"] for e in events if e.type == "text_delta"]
    assert deltas == ["hel", "lo ", "wor", "ld"]
    kinds = [e.type for e in events]
    assert kinds.index("text_delta") < kinds.index("model_completed")
    assert all(not e.persisted for e in events if e.type in sk.LIVE_EVENTS)


async def test_pause_then_resume_with_a_value(make_kernel: MakeKernel) -> None:
    seen: list[object] = []

    class Approve(sk.Hooks):
        def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> sk.Decision:
            seen.append(run.resume_value)
            if run.resume_value is None:
                return sk.Pause("approval", {"call": call.id})
            return sk.Continue()

    kernel, _, _ = make_kernel([call("echo", {"text": "x"}), "ok"], tools=[echo], hooks=Approve())
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    assert events[-1].type == "run_paused"
    paused = await kernel.get(run.run_id)
    assert paused.state == "paused"
    assert paused.pause == sk.PauseInfo(
        "approval", "dispatching_tools", HookPause({"call": "call_0_0"})
    )
    assert await drain(kernel, run.run_id) == []  # a paused run waits
    resumed = await kernel.resume(run.run_id, value={"approved": True})
    assert resumed.state == "dispatching_tools"
    events = await drain(kernel, run.run_id)
    assert events[-1].type == "run_completed"
    assert seen == [None, {"approved": True}]


async def test_input_sent_to_a_completed_run_continues_it(make_kernel: MakeKernel) -> None:
    kernel, _, provider = make_kernel(["first", "second"])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    after = await kernel.send(run.run_id, "and then?")
    assert after.state == "preparing_turn"
    events = await drain(kernel, run.run_id)
    assert "input_received" not in [e.type for e in events]  # committed by send itself
    final = await kernel.get(run.run_id)
    assert [m.text for m in final.messages] == ["hi", "first", "and then?", "second"]
    assert len(provider.requests[-1].messages) == 3
    with pytest.raises(InvalidArgument):
        await kernel.send(run.run_id)


async def test_input_given_to_run_lands_with_the_next_turns_first_commit(
    make_kernel: MakeKernel,
) -> None:
    kernel, store, provider = make_kernel(["first", "second"])
    run = await start(kernel)
    done = await drain(kernel, run.run_id)
    events = [e async for e in kernel.run(run.run_id, "and then?", sk.Message.user("twice"))]
    persisted = [e for e in events if e.persisted]
    first = [e for e in persisted if e.revision == done[-1].revision + 1]  # one commit
    assert (first[0].type, first[-1].type) == ("input_received", "model_started")
    final = await kernel.get(run.run_id)
    assert [m.text for m in final.messages] == ["hi", "first", "and then?", "twice", "second"]
    assert [m.text for m in provider.requests[-1].messages] == ["hi", "first", "and then?", "twice"]
    assert final.revision == done[-1].revision + 2  # input + model_started, then the answer
    assert store.states(run.run_id)[-2:] == ["calling_model", "completed"]


async def test_input_given_to_run_is_lost_with_a_crash_before_its_commit() -> None:
    from statekernel.testing import Crash, CrashAt, FaultPlan, FaultyStore, ScriptedProvider

    inner = MemoryStore()
    provider = ScriptedProvider(["first", "second"])
    kernel = sk.Kernel(inner, providers={"scripted": provider})
    run = await start(kernel)
    await drain(kernel, run.run_id)
    rested = await kernel.get(run.run_id)
    plan = FaultPlan([CrashAt("before_commit", 1)])
    crashing = sk.Kernel(FaultyStore(inner, plan), providers={"scripted": provider})
    with pytest.raises(Crash):
        async for _ in crashing.run(run.run_id, "lost"):
            pass
    after = await kernel.get(run.run_id)
    assert (after.revision, after.state, after.messages) == (
        rested.revision,
        "completed",
        rested.messages,
    )
    assert len(provider.requests) == 1  # the model was not called for the lost input


async def test_input_given_to_run_is_refused_before_anything_commits(
    make_kernel: MakeKernel,
) -> None:
    kernel, _, _ = make_kernel(["x"])
    run = await start(kernel)
    await kernel.step(run.run_id)  # init -> calling_model
    with pytest.raises(InvalidTransition):
        async for _ in kernel.run(run.run_id, "too early"):
            pass
    with pytest.raises(InvalidArgument):
        async for _ in kernel.run(run.run_id, 42):  # type: ignore[arg-type]
            pass
    stored = await kernel.get(run.run_id)
    assert (stored.revision, stored.state) == (1, "calling_model")
    assert [e.type for e in await drain(kernel, run.run_id)][-1] == "run_completed"


async def test_input_is_rejected_while_the_run_is_active(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel(["x"])
    run = await start(kernel)
    await kernel.step(run.run_id)  # init -> preparing_turn
    with pytest.raises(InvalidTransition):
        await kernel.send(run.run_id, "too early")
    assert (await kernel.get(run.run_id)).revision == 1


async def test_max_turns_pauses_and_a_raised_budget_resumes(make_kernel: MakeKernel) -> None:
    script = [call("echo", {"text": str(i)}) for i in range(3)] + ["done"]
    kernel, _, _ = make_kernel(script, tools=[echo], max_turns=2)
    run = await start(kernel)
    await drain(kernel, run.run_id)
    paused = await kernel.get(run.run_id)
    assert paused.state == "paused"
    assert paused.pause is not None
    assert paused.pause.reason == "max_turns"
    assert len(paused.turns) == 2
    await kernel.resume(run.run_id, max_turns=10)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    assert len(final.turns) == 4
    assert final.max_turns == 10


async def test_model_error_fails_the_run_and_retry_completes_it(make_kernel: MakeKernel) -> None:
    error = sk.errors.ProviderUnavailable("overloaded", provider="scripted")
    kernel, _, _ = make_kernel([Fail(error, times=1, then=Reply(text="fine"))])
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    assert events[-1].type == "run_failed"
    failed = await kernel.get(run.run_id)
    assert failed.failure == sk.FailureInfo("ProviderUnavailable", "overloaded", "calling_model")
    await kernel.retry(run.run_id)
    events = await drain(kernel, run.run_id)
    kinds = [e.type for e in events if e.persisted]
    assert kinds[0] == "model_restarted"
    assert kinds[-1] == "run_completed"


class CutShort:
    """A model whose first answer stops without a ``StreamEnd``; later ones are whole."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: sk.ModelRequest) -> AsyncIterator[StreamPart]:
        self.calls += 1
        yield TextDelta("half an answ")
        if self.calls > 1:
            yield TextDelta("er")
            yield StreamEnd("stop", request.model_name)

    async def aclose(self) -> None:
        pass


async def test_a_stream_without_finish_fails_the_run_and_retry_calls_again() -> None:
    model = CutShort()
    kernel = sk.Kernel(MemoryStore(), providers={"cut": model})
    run = await kernel.start(model="cut/x", messages=["hi"])
    events = await drain(kernel, run.run_id)
    assert events[-1].type == "run_failed"
    failed = await kernel.get(run.run_id)
    assert failed.failure is not None
    assert (failed.failure.error, failed.failure.failed_in) == ("ProviderError", "calling_model")
    assert "StreamEnd" in failed.failure.message
    await kernel.retry(run.run_id)
    await drain(kernel, run.run_id)
    done = await kernel.get(run.run_id)
    assert done.state == "completed"
    assert model.calls == 2
    assert done.messages[-1].text == "half an answer"


async def test_step_commits_one_transition_at_a_time(make_kernel: MakeKernel) -> None:
    kernel, store, _ = make_kernel([call("echo", {"text": "a"}), "done"], tools=[echo])
    run = await start(kernel)
    revisions = []
    while (await kernel.get(run.run_id)).state != "completed":
        await kernel.step(run.run_id)
        revisions.append((await kernel.get(run.run_id)).revision)
    assert revisions == list(range(1, len(revisions) + 1))
    assert await kernel.step(run.run_id) == []
    assert len(store.states(run.run_id)) == len(revisions) + 1


async def test_fork_from_a_past_revision_is_independent(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel(["one", "two", "three"])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    original = await kernel.get(run.run_id)
    fork = await kernel.fork(run.run_id, at_revision=1)
    assert fork.run_id != run.run_id
    assert fork.revision == 0
    assert fork.state == "calling_model"
    await drain(kernel, fork.run_id)
    forked = await kernel.get(fork.run_id)
    assert forked.state == "completed"
    assert [m.text for m in forked.messages] == ["hi", "one"]
    await kernel.send(fork.run_id, "again")
    await drain(kernel, fork.run_id)
    assert (await kernel.get(run.run_id)) == original
    events = await kernel.events(fork.run_id)
    assert events[0].type == "run_forked"
    assert events[0].data == {"from_run_id": run.run_id, "from_revision": 1}
    with pytest.raises(RunNotFound):
        await kernel.fork(run.run_id, at_revision=999)


async def test_update_context_is_compare_and_set(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel(["x"])
    run = await start(kernel, context={"n": 1})
    updated = await kernel.update_context(run.run_id, lambda c: {**c, "n": c["n"] + 1})
    assert updated.context == {"n": 2}
    assert updated.revision == 1
    assert updated.state == "init"
    events = await kernel.events(run.run_id)
    assert [e.type for e in events] == ["context_updated"]


@pytest.mark.parametrize("attempts", [0, -1])
async def test_update_context_with_no_attempts_is_invalid(
    make_kernel: MakeKernel, attempts: int
) -> None:
    kernel, _, _ = make_kernel(["x"])
    run = await start(kernel, context={"n": 1})
    with pytest.raises(InvalidArgument, match="attempts"):
        await kernel.update_context(run.run_id, lambda c: c, attempts=attempts)
    assert (await kernel.get(run.run_id)).revision == run.revision


async def test_two_kernels_racing_on_one_run_conflict(make_kernel: MakeKernel) -> None:
    kernel, store, provider = make_kernel(["x"])
    other = sk.Kernel(store, providers={"scripted": provider})
    run = await start(kernel)
    stale = await kernel.get(run.run_id)
    await other.step(run.run_id)  # other moves the run on
    driver_run = await store.load(run.run_id)
    assert driver_run.revision == stale.revision + 1
    from statekernel._kernel.drive import RunDriver

    loser = RunDriver(kernel, stale)
    loser.stage("start")
    with pytest.raises(ConflictError):
        await loser.commit()
    assert loser.run is stale
    assert (await store.load(run.run_id)) == driver_run


async def test_bad_input_gets_typed_errors(make_kernel: MakeKernel) -> None:
    kernel, _, _ = make_kernel(["x"])
    with pytest.raises(sk.errors.ConfigError):
        await kernel.start(model="no-provider", messages=["x"])
    with pytest.raises(InvalidArgument):
        await kernel.start(model="scripted/x", run_id="../../etc")
    with pytest.raises(RunNotFound):
        await kernel.get("missing")
    with pytest.raises(RunNotFound):
        await drain(kernel, "missing")
    run = await start(kernel, run_id="fixed")
    with pytest.raises(ConflictError):
        await start(kernel, run_id="fixed")
    assert (await kernel.get("fixed")) == run
    with pytest.raises(InvalidArgument):
        sk.Kernel("memory://", max_turns=0)
    with pytest.raises(sk.errors.ConfigError):
        sk.Kernel("bogus://x")


async def test_commands_inside_the_event_loop_do_not_deadlock(make_kernel: MakeKernel) -> None:
    class Gate(sk.Hooks):
        def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> sk.Decision:
            return sk.Continue() if run.resume_value else sk.Pause("approval")

    kernel, _, _ = make_kernel([call("echo", {"text": "x"}), "ok"], tools=[echo], hooks=Gate())
    run = await start(kernel)
    after: list[str] = []
    async for event in kernel.run(run.run_id):
        if after:
            after.append(event.type)
        if event.type == "run_paused":
            await asyncio.wait_for(kernel.resume(run.run_id, value=True), timeout=60)
            after.append("resumed")
    # the drive went on from the command's commit, in the same loop
    assert after[0] == "resumed"
    assert "tool_call_completed" in after
    assert after[-1] == "run_completed"
    assert (await kernel.get(run.run_id)).state == "completed"


async def test_calls_that_start_together_share_their_intent_commit(
    make_kernel: MakeKernel,
) -> None:
    script = [[call("echo", {"text": "a"}), call("echo", {"text": "b"})], "ok"]
    kernel, store, _ = make_kernel(script, tools=[echo])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    cps = [c for c in store.checkpoints if c.run.run_id == run.run_id]
    answer = next(c for c in cps if any(e.type == "model_completed" for e in c.events))
    assert [e.type for e in answer.events] == [
        "model_completed",
        "tool_call_started",
        "tool_call_started",
    ]
    assert [e.seq for e in answer.events] == list(
        range(answer.events[0].seq, answer.run.event_count)
    )


async def test_a_model_of_an_unknown_provider_is_refused_before_a_run_exists() -> None:
    from statekernel.errors import ConfigError
    from statekernel.stores import MemoryStore
    from statekernel.testing import ScriptedProvider

    store = MemoryStore()
    kernel = sk.Kernel(store, providers={"scripted": ScriptedProvider(["hi"])})
    with pytest.raises(ConfigError) as info:
        await kernel.start(model="nope/x", messages=["hi"], run_id="never")
    assert "unknown model provider 'nope'" in str(info.value)
    assert "this kernel's: scripted" in str(info.value)  # the kernel's own are named too
    assert "openai" in str(info.value)
    assert (await store.list_runs()).runs == ()
    await kernel.start(model="openai/gpt-4o-mini", messages=["hi"])  # built in: no key needed yet
    await kernel.aclose()
