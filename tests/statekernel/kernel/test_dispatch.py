"""Dispatch rules: concurrency limits, unsafe tools alone, identical calls once, call order."""

from __future__ import annotations

import asyncio
import json

import pytest

import statekernel as sk
from statekernel.testing import call

from ..conftest import MakeKernel, drain, start


class Meter:
    """Counts concurrent executions and remembers the peak."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.log: list[str] = []

    async def run(self, label: str, seconds: float) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        self.log.append(f"+{label}")
        await asyncio.sleep(seconds)
        self.log.append(f"-{label}")
        self.now -= 1


def make_tools(meter: Meter) -> list[sk.Tool]:
    @sk.tool
    async def slow(label: str, seconds: float = 0.02) -> str:
        """A slow, concurrency-safe tool."""
        await meter.run(label, seconds)
        return f"slow {label}"

    @sk.tool(concurrency_safe=False)
    async def exclusive(label: str) -> str:
        """A tool that must run alone."""
        await meter.run(label, 0.02)
        return f"exclusive {label}"

    @sk.tool(idempotent=True)
    async def fetch(label: str) -> str:
        """A slow read (idempotent)."""
        await meter.run(label, 0.02)
        return f"fetched {label}"

    return [slow, exclusive, fetch]


@pytest.mark.parametrize(("limit", "peak"), [(1, 1), (2, 2), (0, 6)])
async def test_max_concurrent_bounds_the_peak(
    make_kernel: MakeKernel, limit: int, peak: int
) -> None:
    meter = Meter()
    calls = [call("slow", {"label": str(i)}) for i in range(6)]
    kernel, _, _ = make_kernel(
        [calls, "done"], tools=make_tools(meter), dispatch=sk.DispatchPolicy(max_concurrent=limit)
    )
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert meter.peak == peak
    assert (await kernel.get(run.run_id)).state == "completed"


async def test_unsafe_tools_run_alone(make_kernel: MakeKernel) -> None:
    meter = Meter()
    calls = [
        call("slow", {"label": "a"}),
        call("slow", {"label": "b"}),
        call("exclusive", {"label": "X"}),
        call("slow", {"label": "c"}),
        call("slow", {"label": "d"}),
    ]
    kernel, _, _ = make_kernel(
        [calls, "done"], tools=make_tools(meter), dispatch=sk.DispatchPolicy(max_concurrent=0)
    )
    run = await start(kernel)
    await drain(kernel, run.run_id)
    log = meter.log
    start_x, end_x = log.index("+X"), log.index("-X")
    assert end_x == start_x + 1, f"something overlapped the exclusive tool: {log}"
    assert log.index("-a") < start_x
    assert log.index("-b") < start_x
    assert log.index("+c") > end_x
    assert log.index("+d") > end_x
    assert meter.peak == 2


async def test_identical_idempotent_calls_in_a_batch_run_once(make_kernel: MakeKernel) -> None:
    meter = Meter()
    calls = [
        call("fetch", {"label": "same"}),
        call("fetch", {"label": "other"}),
        call("fetch", {"label": "same"}),
    ]
    kernel, _, _ = make_kernel([calls, "done"], tools=make_tools(meter))
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert sorted(x for x in meter.log if x.startswith("+")) == ["+other", "+same"]
    final = await kernel.get(run.run_id)
    results = [m.content[0] for m in final.messages if m.role == "tool"]
    assert [r.tool_call_id for r in results] == ["call_0_0", "call_0_1", "call_0_2"]  # type: ignore[union-attr]
    assert [r.content for r in results] == ["fetched same", "fetched other", "fetched same"]  # type: ignore[union-attr]


async def test_identical_non_idempotent_calls_each_run(make_kernel: MakeKernel) -> None:
    payments: list[tuple[str, int, str]] = []

    @sk.tool
    def pay(to: str, amount: int, ctx: sk.ToolContext) -> str:
        """Pay someone (not idempotent)."""
        payments.append((to, amount, ctx.call_id))
        return f"payment {len(payments)}"

    calls = [call("pay", {"to": "Bob", "amount": 50}), call("pay", {"to": "Bob", "amount": 50})]
    kernel, _, _ = make_kernel([calls, "done"], tools=[pay])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert sorted(payments) == [("Bob", 50, "call_0_0"), ("Bob", 50, "call_0_1")]
    final = await kernel.get(run.run_id)
    outputs = {r.id: r.output for r in final.turns[0].completed}
    assert sorted(outputs.values()) == ["payment 1", "payment 2"]


async def test_merging_can_be_turned_off(make_kernel: MakeKernel) -> None:
    meter = Meter()
    calls = [call("fetch", {"label": "same"}), call("fetch", {"label": "same"})]
    kernel, _, _ = make_kernel(
        [calls, "done"],
        tools=make_tools(meter),
        dispatch=sk.DispatchPolicy(merge_identical=False),
    )
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert [x for x in meter.log if x.startswith("+")] == ["+same", "+same"]
    final = await kernel.get(run.run_id)
    assert [r.output for r in final.turns[0].completed] == ["fetched same"] * 2


async def test_results_go_back_in_call_order(make_kernel: MakeKernel) -> None:
    meter = Meter()
    calls = [
        call("slow", {"label": "late", "seconds": 0.06}),
        call("slow", {"label": "early", "seconds": 0.0}),
        call("slow", {"label": "middle", "seconds": 0.03}),
    ]
    kernel, _, provider = make_kernel([calls, "done"], tools=make_tools(meter))
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    finished = [e.data["call_id"] for e in events if e.type == "tool_call_completed"]
    assert finished == ["call_0_1", "call_0_2", "call_0_0"]  # completion order differs...
    sent = provider.requests[1].messages
    order = [m.content[0].tool_call_id for m in sent if m.role == "tool"]  # type: ignore[union-attr]
    assert order == ["call_0_0", "call_0_1", "call_0_2"]  # ...call order does not


async def test_tool_errors_become_error_results_and_the_run_goes_on(
    make_kernel: MakeKernel,
) -> None:
    @sk.tool
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b

    calls = [
        call("divide", {"a": 1, "b": 0}),
        call("no_such_tool", {}),
        call("divide", {"a": "one", "b": 2}),
        call("divide", '{"a": 1, "b": '),
        call("divide", {"a": 1, "b": 2, "c": 3}),
        call("divide", {"a": 6, "b": 3}),
    ]
    kernel, _, provider = make_kernel([calls, "recovered"], tools=[divide])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    assert final.state == "completed"
    results = [m.content[0] for m in final.messages if m.role == "tool"]
    errors = [(r.is_error, r.content) for r in results]  # type: ignore[union-attr]
    assert errors[0] == (True, "ZeroDivisionError: float division by zero")
    assert errors[1][0]
    assert "unknown tool 'no_such_tool'" in errors[1][1]
    assert errors[2][0]
    assert "$.a" in errors[2][1]
    assert errors[3][0]
    assert "not a JSON object" in errors[3][1]
    assert errors[4][0]
    assert "extra fields" in errors[4][1]
    assert errors[5] == (False, "2.0")
    assert provider.requests[1].messages[-1].content[0] == results[-1]
    # validation failures never started the tool: no intent was committed for them
    started = [
        e.data["call_id"] for e in await kernel.events(run.run_id) if e.type == "tool_call_started"
    ]
    assert started == ["call_0_0", "call_0_5"]


async def test_tool_output_events_stream_progress(make_kernel: MakeKernel) -> None:
    @sk.tool
    async def download(url: str, ctx: sk.ToolContext) -> str:
        """Download something, reporting progress."""
        for pct in (50, 100):
            ctx.report({"percent": pct})
            await asyncio.sleep(0)
        return json.dumps({"key": ctx.idempotency_key})

    kernel, _, _ = make_kernel([call("download", {"url": "x"}), "ok"], tools=[download])
    run = await start(kernel)
    events = await drain(kernel, run.run_id)
    progress = [e.data for e in events if e.type == "tool_output"]
    assert progress == [
        {"call_id": "call_0_0", "data": {"percent": 50}},
        {"call_id": "call_0_0", "data": {"percent": 100}},
    ]
    final = await kernel.get(run.run_id)
    assert json.loads(final.turns[0].completed[0].output) == {"key": f"{run.run_id}:call_0_0"}


def test_policy_rejects_negative_limits() -> None:
    with pytest.raises(ValueError, match="max_concurrent"):
        sk.DispatchPolicy(max_concurrent=-1)
