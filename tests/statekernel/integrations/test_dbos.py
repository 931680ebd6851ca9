"""statekernel.integrations.dbos on a real DBOS (launched by each test, its system
database a SQLite file or a fresh PostgreSQL database): segments complete, one segment
enqueued twice is one workflow, commands (resume, send, cancel, retry) go through the
engine, a question's timeout fires through a delayed segment, DBOS's flow control (a
partition's concurrency, a rate limit) holds, a cron schedule starts runs, and a run's
limits, tags and model chain are given where it starts (its limit raised on resume)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dbos
import pytest
from dbos import DBOS, WorkflowHandle

import statekernel as sk
from statekernel.errors import InvalidArgument, InvalidTag, ProviderUnavailable, RunNotFound
from statekernel.integrations.dbos import Segment, StatekernelDBOS, segment_id
from statekernel.pauses import LimitReached
from statekernel.testing import Fail, call

from .dbosenv import (
    BACKENDS,
    PAY_BOB,
    Ledger,
    agent,
    databases_for,
    launched,
    wait_for,
)


@pytest.fixture(params=BACKENDS)
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    yield from databases_for(request, tmp_path)


def run_of(app: StatekernelDBOS, run_id: str) -> sk.Run:
    async def get(kernel: sk.Kernel) -> sk.Run:
        return await kernel.get(run_id)

    return app._call(get)


def events_of(app: StatekernelDBOS, run_id: str) -> list[str]:
    async def get(kernel: sk.Kernel) -> list[str]:
        return [event.type for event in await kernel.events(run_id)]

    return app._call(get)


def status(workflow_id: str) -> str:
    found = DBOS.get_workflow_status(workflow_id)
    assert found is not None, workflow_id
    return found.status


def test_segments_complete_and_one_enqueued_twice_is_one_workflow(
    databases: tuple[str, str], tmp_path: Path
) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    app = StatekernelDBOS(agent(store, ledger, PAY_BOB), queue="agents")
    with launched(app, system, agents={"worker_concurrency": 4}):
        first = app.start(
            model="scripted/bank", messages=["Pay Bob."], run_id="r1", delay_seconds=1
        )
        again = [app.submit("r1") for _ in range(3)]  # before it ran: the same segment
        assert {h.workflow_id for h in again} == {first.workflow_id} == {segment_id("r1", 0)}
        others = [
            app.start(model="scripted/bank", messages=["Pay Bob."], run_id=f"r{i}") for i in (2, 3)
        ]
        results: list[Segment] = [h.get_result() for h in [first, *again, *others]]
        assert [r["state"] for r in results] == ["completed"] * 6
        assert results[0] == results[1], "one workflow, one result"
        assert results[0]["failure"] is None
        assert sorted(row[1] for row in ledger.lines("pay")) == ["r1", "r2", "r3"]
        assert events_of(app, "r1").count("run_completed") == 1
        done = app.submit("r1")  # at rest: a segment from its revision, which drives nothing
        assert done.workflow_id == segment_id("r1", results[0]["revision"])
        assert done.get_result() == results[0]
        later = app.send("r1", "Thanks.")
        assert later.get_result()["state"] == "completed"
        assert run_of(app, "r1").output == "Paid Bob."
        assert len(ledger.lines("pay")) == 3, "the next input paid nobody again"


def test_a_deduplication_id_refuses_a_second_segment_while_the_first_waits(
    databases: tuple[str, str], tmp_path: Path
) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    app = StatekernelDBOS(agent(store, ledger, PAY_BOB), queue="agents")
    with launched(app, system, agents={}):
        first = app.start(
            model="scripted/bank",
            messages=["Pay Bob."],
            run_id="d1",
            deduplication_id="bob",
            delay_seconds=1,
        )
        with pytest.raises(dbos.error.DBOSQueueDeduplicatedError):
            app.start(
                model="scripted/bank", messages=["Pay Bob."], run_id="d2", deduplication_id="bob"
            )
        assert first.get_result()["state"] == "completed"
        assert run_of(app, "d2").state == "init", "started, its segment refused"
        assert app.submit("d2", deduplication_id="bob").get_result()["state"] == "completed"
        assert sorted(row[1] for row in ledger.lines("pay")) == ["d1", "d2"]


class Approvals(sk.Hooks):
    """``pay`` waits for a human: resumed with ``{"approve": call id}``."""

    def on_tool_call_started(self, run: sk.Run, call: Any) -> Any:
        if call.name == "pay" and run.resume_value != {"approve": call.id}:
            return sk.Pause("approval", {"call": call.id})
        return None


def test_an_approval_resumes_the_run_through_the_engine(
    databases: tuple[str, str], tmp_path: Path
) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    app = StatekernelDBOS(agent(store, ledger, PAY_BOB, hooks=Approvals()), queue="agents")
    with launched(app, system, agents={}):
        waiting = app.start(model="scripted/bank", messages=["Pay Bob."], run_id="r1")
        paused = waiting.get_result()
        assert paused["state"] == "paused"
        assert paused["due_in"] is None
        assert ledger.lines("pay") == [], "nothing paid before the approval"
        run = run_of(app, "r1")
        assert run.pause is not None
        approved = app.resume("r1", value={"approve": run.pause.metadata["call"]})
        assert approved.workflow_id == segment_id("r1", paused["revision"] + 1)
        assert approved.get_result()["state"] == "completed"
        assert len(ledger.lines("pay")) == 1


def test_a_question_that_times_out_is_fired_by_a_delayed_segment(
    databases: tuple[str, str], tmp_path: Path
) -> None:
    system, store = databases
    approve = sk.ask_user(
        "approve",
        "Ask a human to approve the payment.",
        answer_schema={"type": "boolean"},
        timeout=1,
        on_timeout=False,
    )
    script: list[object] = [call("approve", {"question": "Pay Bob 50?"}), "Not paid."]
    app = StatekernelDBOS(agent(store, Ledger(tmp_path / "l"), script, tools=(approve,)))
    with launched(app, system, statekernel={}):
        paused = app.start(model="scripted/bank", messages=["Pay Bob."], run_id="q1").get_result()
        assert paused["state"] == "paused"
        assert paused["due_in"] is not None
        assert paused["due_in"] <= 1
        # nobody answers: the segment enqueued for the timer's time drives the run on
        fired: WorkflowHandle[Segment] = DBOS.retrieve_workflow(
            segment_id("q1", paused["revision"])
        )
        assert fired.get_result()["state"] == "completed"
        assert "timer_fired" in events_of(app, "q1")
        assert run_of(app, "q1").output == "Not paid."


def test_cancel_stops_the_run_and_its_segment(databases: tuple[str, str], tmp_path: Path) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    script: list[object] = [call("hold", {"seconds": 600}), "Held."]
    app = StatekernelDBOS(agent(store, ledger, script, others={"bank": PAY_BOB}), queue="agents")
    with launched(app, system, agents={}):
        running = app.start(model="scripted/bank", messages=["Hold."], run_id="c1")
        wait_for(lambda: ledger.lines("start") != [], "the tool to start")
        result = app.cancel("c1", "no longer needed", by="tests")
        assert result.outcome in ("requested", "cancelled")
        wait_for(lambda: status(running.workflow_id) == "CANCELLED", "the workflow cancelled")
        wait_for(lambda: run_of(app, "c1").state == "failed", "the run to stop")
        failure = run_of(app, "c1").failure
        assert failure is not None
        assert failure.error == "Cancelled"
        assert ledger.lines("end") == [], "the call was stopped, not finished"

        queued = app.start(model="bank/pay", messages=["Pay."], run_id="c2", delay_seconds=600)
        assert status(queued.workflow_id) in ("DELAYED", "ENQUEUED")
        assert app.cancel("c2").outcome == "cancelled", "nobody drove it: cancelled at once"
        assert status(queued.workflow_id) == "CANCELLED"
        # retry: the run returns to where it was cancelled, in a segment of its own
        assert app.retry("c2").get_result()["state"] == "completed"


def starts_and_ends(ledger: Ledger) -> dict[str, tuple[float, float]]:
    starts = {row[1]: float(row[2]) for row in ledger.lines("start")}
    ends = {row[1]: float(row[2]) for row in ledger.lines("end")}
    return {run_id: (starts[run_id], ends[run_id]) for run_id in starts}


def test_a_partition_runs_one_segment_at_a_time(databases: tuple[str, str], tmp_path: Path) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    script: list[object] = [call("hold", {"seconds": 0.3}), "Held."]
    app = StatekernelDBOS(agent(store, ledger, script), queue="tenants")
    limits = {"partition_concurrency": 1, "worker_concurrency": 8}
    with launched(app, system, tenants=limits):
        handles = [
            app.start(
                model="scripted/bank",
                messages=["Hold."],
                run_id=f"{tenant}{i}",
                queue_partition_key=tenant,
            )
            for i in range(3)
            for tenant in ("a", "b")
        ]
        assert [h.get_result()["state"] for h in handles] == ["completed"] * 6
    spans = starts_and_ends(ledger)
    assert len(spans) == 6
    for tenant in ("a", "b"):
        mine = sorted(span for run_id, span in spans.items() if run_id.startswith(tenant))
        for (_, end), (start, _) in itertools.pairwise(mine):
            assert end <= start, f"two segments of partition {tenant} overlapped"


def test_a_rate_limit_spaces_the_starts_of_segments(
    databases: tuple[str, str], tmp_path: Path
) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    app = StatekernelDBOS(agent(store, ledger, PAY_BOB), queue="limited")
    limit, period = 2, 1.0
    with launched(app, system, limited={"limiter": {"limit": limit, "period": period}}):
        handles = [
            app.start(model="scripted/bank", messages=["Pay."], run_id=f"r{i}") for i in range(6)
        ]
        assert [h.get_result()["state"] for h in handles] == ["completed"] * 6
        dequeued = []
        for handle in handles:
            found = DBOS.get_workflow_status(handle.workflow_id)
            assert found is not None
            assert found.dequeued_at is not None
            dequeued.append(found.dequeued_at)
    dequeued.sort()
    for first, then in zip(dequeued, dequeued[limit:], strict=False):
        assert then - first >= period * 1000, f"more than {limit} starts in {period} s"
    assert len(ledger.lines("pay")) == 6


def test_a_schedule_starts_a_run_at_each_tick(databases: tuple[str, str], tmp_path: Path) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    app = StatekernelDBOS(agent(store, ledger, PAY_BOB))

    def daily(when: Any) -> Any:
        return {
            "model": "scripted/bank",
            "messages": [f"Pay Bob for {when:%H:%M:%S}."],
            "limits": sk.Limits(tool_calls=3),
            "tags": {"job": "payroll"},
        }

    def completed() -> list[str]:
        async def look(kernel: sk.Kernel) -> list[str]:
            page = await kernel.store.list_runs(state="completed", limit=100)
            return [run.run_id for run in page.runs]

        return app._call(look)

    with launched(app, system, statekernel={}):
        app.schedule("payroll", "* * * * * *", daily)  # every second
        wait_for(lambda: len(completed()) >= 2, "two ticks' runs to complete")
        DBOS.delete_schedule("payroll")
        done = completed()
    assert all(run_id.startswith("payroll.") for run_id in done)
    assert all(run_of(app, run_id).tags == {"job": "payroll"} for run_id in done)
    assert all(run_of(app, run_id).limits == sk.Limits(tool_calls=3) for run_id in done)
    paid = [row[1] for row in ledger.lines("pay")]
    assert sorted(set(paid)) == sorted(paid), "each tick's run paid once"
    assert set(done) <= set(paid)


def test_unknown_enqueue_options_are_refused(tmp_path: Path) -> None:
    app = StatekernelDBOS(agent(f"sqlite:///{tmp_path / 'r.db'}", Ledger(tmp_path / "l"), []))
    with (
        launched(app, f"sqlite:///{tmp_path / 'dbos.sqlite'}", statekernel={}),
        pytest.raises(InvalidArgument, match="unknown enqueue options"),
    ):
        app.submit("r1", partition="a")
    with pytest.raises(InvalidArgument, match="drive_attempts"):
        StatekernelDBOS(lambda: sk.Kernel("memory://"), drive_attempts=0)


def test_a_run_started_with_limits_tags_and_a_chain_is_raised_through_the_engine(
    databases: tuple[str, str], tmp_path: Path
) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    down: list[object] = [Fail(ProviderUnavailable("overloaded", provider="down"), times=1_000)]
    app = StatekernelDBOS(agent(store, ledger, PAY_BOB, others={"down": down}), queue="agents")
    chain = sk.Fallback("down/big", "scripted/bank")
    with launched(app, system, agents={}):
        capped = app.start(
            model=chain,
            messages=["Pay Bob."],
            run_id="l1",
            limits=sk.Limits(tool_calls=0, total_tokens=1_000),
            tags={"team": "payments"},
        )
        paused = capped.get_result()
        assert paused["state"] == "paused"
        run = run_of(app, "l1")
        assert run.pause is not None
        assert run.pause.details == LimitReached("tool_calls", 0, 0)
        assert (run.fallback, run.tags) == (chain, {"team": "payments"})
        assert run.turns == ()  # the first turn waits in flight: its call did not start
        assert ledger.lines("pay") == [], "nothing paid past the limit"
        raised = app.resume("l1", limits=sk.Limits(tool_calls=1, total_tokens=1_000))
        assert raised.workflow_id == segment_id("l1", paused["revision"] + 1)
        assert raised.get_result()["state"] == "completed"
        done = run_of(app, "l1")
        assert done.limits == sk.Limits(tool_calls=1, total_tokens=1_000)
        assert [turn.model for turn in done.turns] == ["scripted/bank"] * 2  # the chain's next
        assert done.output == "Paid Bob."
        assert len(ledger.lines("pay")) == 1
        with pytest.raises(InvalidTag, match="'bad key'"):
            app.start(model="scripted/bank", run_id="l2", tags={"bad key": "x"})
        with pytest.raises(InvalidArgument, match=r"limits must be None or a statekernel\.Limits"):
            app.start(model="scripted/bank", run_id="l3", limits={"tool_calls": 1})  # type: ignore[arg-type]
        with pytest.raises(RunNotFound):
            run_of(app, "l2")
