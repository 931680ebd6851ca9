"""Runs report OpenTelemetry metrics: the GenAI conventions' token usage and operation
duration, and the kernel's own (commits and their latency per store, takeovers,
uncertain pauses, cancels, fired timers, cost)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import statekernel as sk
from statekernel.stores import Lease, MemoryStore
from statekernel.telemetry import Price
from statekernel.testing import (
    Crash,
    CrashAt,
    FaultPlan,
    FaultyStore,
    ManualClock,
    Reply,
    ScriptedProvider,
    call,
)


def points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict[str, Any], Any]]:
    """The data points of metric ``name``: (attributes, point)."""
    data = reader.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found += [(dict(p.attributes or {}), p) for p in metric.data.data_points]
    return found


def total(reader: InMemoryMetricReader, name: str, **attributes: Any) -> float:
    """The sum of a counter's points whose attributes include ``attributes``."""
    return float(sum(p.value for a, p in points(reader, name) if attributes.items() <= a.items()))


@sk.tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


TOOL_THEN_TEXT: list[object] = [Reply(tool_calls=[call("weather", {"city": "Paris"})]), "Sunny."]
LEASE_TTL = 15.0
"""A kernel's default lease ttl (``Kernel(lease_ttl=)``)."""


async def test_model_calls_record_token_usage_and_duration(
    metrics: InMemoryMetricReader,
) -> None:
    script: list[object] = [Reply(tool_calls=[call("weather", {"city": "Paris"})]), "Sunny."]
    kernel = sk.Kernel(
        MemoryStore(),
        tools=[weather],
        providers={"scripted": ScriptedProvider(script)},
    )
    async with kernel:
        run = await kernel.start(model="scripted/test-model", messages=["weather?"])
        async for _ in kernel.run(run.run_id):
            pass
    common = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "test-model",
        "gen_ai.response.model": "test-model",
    }
    usage = {a["gen_ai.token.type"]: p for a, p in points(metrics, "gen_ai.client.token.usage")}
    assert set(usage) == {"input", "output"}
    assert (usage["input"].count, usage["input"].sum) == (2, 20)
    assert (usage["output"].count, usage["output"].sum) == (2, 10)
    for attributes, _ in points(metrics, "gen_ai.client.token.usage"):
        assert common.items() <= attributes.items()

    durations = {
        a["gen_ai.operation.name"]: p
        for a, p in points(metrics, "gen_ai.client.operation.duration")
    }
    assert durations["chat"].count == 2
    assert durations["invoke_agent"].count == 1
    assert durations["invoke_agent"].sum >= durations["chat"].sum > 0
    [(attributes, _)] = [
        (a, p)
        for a, p in points(metrics, "gen_ai.client.operation.duration")
        if a["gen_ai.operation.name"] == "invoke_agent"
    ]
    assert attributes == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "test-model",
    }


async def test_a_failed_model_call_records_its_error_type(
    metrics: InMemoryMetricReader,
) -> None:
    from statekernel.errors import ProviderError
    from statekernel.testing import Fail

    down = ProviderError("unavailable", status=503, provider="scripted")
    kernel = sk.Kernel(MemoryStore(), providers={"scripted": ScriptedProvider([Fail(down, 5)])})
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["hi"])
        async for _ in kernel.run(run.run_id):
            pass
    chats = [
        a
        for a, _ in points(metrics, "gen_ai.client.operation.duration")
        if a["gen_ai.operation.name"] == "chat"
    ]
    assert chats
    assert all(a["error.type"] == "503" for a in chats)
    assert not points(metrics, "gen_ai.client.token.usage")


async def test_commits_are_counted_and_timed_per_store(
    every_store_url: str, metrics: InMemoryMetricReader
) -> None:
    kernel = sk.Kernel(every_store_url, providers={"scripted": ScriptedProvider(["Hello."])})
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["hi"])
        async for _ in kernel.run(run.run_id):
            pass
        run = await kernel.get(run.run_id)
    kind = every_store_url.partition(":")[0].removesuffix("ql")  # postgresql -> postgres
    landed = {"statekernel.store": kind, "statekernel.commit.outcome": "landed"}
    assert total(metrics, "statekernel.commits", **landed) == run.revision + 1  # + its creation
    [(attributes, latency)] = points(metrics, "statekernel.commit.duration")
    assert attributes == landed
    assert latency.count == run.revision + 1
    assert latency.sum > 0


async def test_intents_in_flight_found_without_a_lease_takeover_are_counted_apart(
    metrics: InMemoryMetricReader,
) -> None:
    """A kernel that crashed mid tool call but closed (its lease given back): the next
    drive takes a free lease and finds the call in flight, counted as ``in_flight``."""
    store = MemoryStore()
    script: list[object] = [Reply(tool_calls=[call("weather", {"city": "Paris"})]), "Sunny."]
    crash = FaultPlan([CrashAt("tool_after_effect", 1)]).middleware()
    first = sk.Kernel(
        store,
        tools=[weather],
        providers={"scripted": ScriptedProvider(script)},
        middleware=[crash],
    )
    run = await first.start(model="scripted/m", messages=["weather?"])
    with pytest.raises(Crash):
        async for _ in first.run(run.run_id):
            pass
    await first.aclose()
    assert total(metrics, "statekernel.takeovers") == 0
    async with sk.Kernel(
        store, tools=[weather], providers={"scripted": ScriptedProvider(script)}
    ) as second:
        async for _ in second.run(run.run_id):
            pass
        paused = await second.get(run.run_id)
    assert paused.pause is not None
    assert paused.pause.reason == "uncertain_tool_calls"
    in_flight = {"statekernel.takeover.kind": "in_flight", "statekernel.takeover.of": "tool_calls"}
    assert [a for a, _ in points(metrics, "statekernel.takeovers")] == [in_flight]
    assert total(metrics, "statekernel.takeovers") == 1
    assert total(metrics, "statekernel.uncertain_pauses") == 1


class DyingStore(FaultyStore):
    """The store as a process sees it, gone with the process: once ``plan`` crashed it,
    nothing it would give back reaches the store (its leases stay, until they expire)."""

    async def release(self, lease: Lease) -> None:
        """Given back while the process lives."""
        if not self.plan.fired:
            await self.inner.release(lease)


async def _died_mid_tool_call(store: MemoryStore) -> tuple[sk.Kernel, str]:
    """A kernel whose process died while its tool call ran, its lease left held; the
    kernel and the run's id."""
    plan = FaultPlan([CrashAt("tool_after_effect", 1)])
    dead = sk.Kernel(
        DyingStore(store, plan),
        tools=[weather],
        providers={"scripted": ScriptedProvider(TOOL_THEN_TEXT)},
        middleware=[plan.middleware()],
    )
    run = await dead.start(model="scripted/m", messages=["weather?"])
    with pytest.raises(Crash):
        async for _ in dead.run(run.run_id):
            pass
    assert await store.holder(run.run_id) == dead.owner  # held by the dead owner
    return dead, run.run_id


async def test_a_lease_taken_over_from_a_dead_owner_is_counted_once(
    metrics: InMemoryMetricReader, spans: InMemorySpanExporter
) -> None:
    """The dead owner's lease expires (on the store's clock) and another kernel's drive
    takes it over with the tool call in flight: counted once, as a ``lease`` takeover,
    and named on the drive's span; the same kernel's later drives count nothing."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    dead, run_id = await _died_mid_tool_call(store)
    clock.advance(LEASE_TTL + 1)
    async with sk.Kernel(
        store, tools=[weather], providers={"scripted": ScriptedProvider(TOOL_THEN_TEXT)}
    ) as second:
        async for _ in second.run(run_id):
            pass
        paused = await second.get(run_id)
        assert paused.pause is not None
        assert paused.pause.reason == "uncertain_tool_calls"
        lease = {"statekernel.takeover.kind": "lease", "statekernel.takeover.of": "tool_calls"}
        assert [a for a, _ in points(metrics, "statekernel.takeovers")] == [lease]
        assert total(metrics, "statekernel.takeovers") == 1
        [drive] = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")][1:]
        attributes = dict(drive.attributes or {})
        assert attributes["statekernel.lease.taken_from"] == dead.owner
        assert attributes["statekernel.takeover.of"] == "tool_calls"
        await second.resolve_tool_call(run_id, "call_0_0", output="sunny in Paris")
        async for _ in second.run(run_id):  # a plain drive: its lease was free
            pass
        assert (await second.get(run_id)).state == "completed"
    assert total(metrics, "statekernel.takeovers") == 1  # the resolved call was no intent
    later = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent")][-1]
    assert "statekernel.lease.taken_from" not in (later.attributes or {})
    await dead.aclose()


async def test_a_command_that_takes_a_dead_owner_s_lease_counts_it(
    metrics: InMemoryMetricReader,
) -> None:
    """Not only drives take leases over: a cancel from another kernel, once the dead
    owner's lease expired, counts the takeover with what it found in flight."""
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    dead, run_id = await _died_mid_tool_call(store)
    async with sk.Kernel(store, providers={"scripted": ScriptedProvider([])}) as other:
        clock.advance(LEASE_TTL + 1)
        result = await other.cancel(run_id, reason="owner gone")
    assert result.outcome == "cancelled"
    lease = {"statekernel.takeover.kind": "lease", "statekernel.takeover.of": "tool_calls"}
    assert [a for a, _ in points(metrics, "statekernel.takeovers")] == [lease]
    assert total(metrics, "statekernel.cancels") == 1
    await dead.aclose()


async def test_cancels_and_fired_timers_are_counted(metrics: InMemoryMetricReader) -> None:
    class Nap(sk.Hooks):
        def on_turn_completed(self, run: sk.Run, turn: sk.Turn) -> sk.Decision | None:
            if not run.turns:  # after the first turn only: a timer due at once
                return sk.Pause("nap", timeout=0, on_timeout="awake")
            return None

    script: list[object] = ["One.", "Two."]
    kernel = sk.Kernel(MemoryStore(), hooks=Nap(), providers={"scripted": ScriptedProvider(script)})
    async with kernel:
        napping = await kernel.start(model="scripted/m", messages=["hi"])
        async for _ in kernel.run(napping.run_id):
            pass
        assert (await kernel.get(napping.run_id)).state == "paused"
        async for _ in kernel.run(napping.run_id):  # fires the timer, then goes on
            pass
        assert (await kernel.get(napping.run_id)).state == "completed"
        doomed = await kernel.start(model="scripted/m", messages=["hi"])
        await kernel.cancel(doomed.run_id, reason="not needed")
    assert total(metrics, "statekernel.timers.fired") == 1
    assert total(metrics, "statekernel.cancels") == 1
    assert total(metrics, "statekernel.uncertain_pauses") == 0


async def test_model_answers_are_priced(metrics: InMemoryMetricReader) -> None:
    prices = {"scripted/m": Price(input_per_mtok=2.5, output_per_mtok=10.0)}
    kernel = sk.Kernel(
        MemoryStore(), providers={"scripted": ScriptedProvider(["Hello."])}, prices=prices
    )
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["hi"])
        async for _ in kernel.run(run.run_id):
            pass
    expected = (10 * 2.5 + 5 * 10.0) / 1_000_000
    assert total(metrics, "statekernel.cost", **{"gen_ai.request.model": "m"}) == pytest.approx(
        expected
    )
