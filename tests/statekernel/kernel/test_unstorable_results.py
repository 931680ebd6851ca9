"""A tool whose function ran and returned a value the store cannot hold is never reported
as not run: a tool that is not idempotent pauses the run as uncertain (the operator says
what it returned), an idempotent one is an error result; both log a WARNING."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import statekernel as sk
from statekernel._records.pauses import Uncertain
from statekernel.testing import ScriptedProvider, call


class Receipt:
    """What a payment SDK returns: an object, not JSON."""

    def __init__(self, charge_id: str) -> None:
        self.charge_id = charge_id


def tools(counts: dict[str, int]) -> list[sk.Tool]:
    @sk.tool
    def charge(amount: int) -> Receipt:
        """Charge the card (not idempotent)."""
        counts["charge"] = counts.get("charge", 0) + 1
        return Receipt(f"ch_{amount}")

    @sk.tool(idempotent=True)
    def quote(amount: int) -> Receipt:
        """Read a quote (idempotent)."""
        counts["quote"] = counts.get("quote", 0) + 1
        return Receipt(f"q_{amount}")

    return [charge, quote]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def test_a_tool_that_ran_and_returned_no_json_pauses_as_uncertain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counts: dict[str, int] = {}
    model = ScriptedProvider([call("charge", {"amount": 5}, id="c1"), "Charged."])
    store = f"sqlite:///{tmp_path}/runs.db"
    async with sk.Kernel(store, tools=tools(counts), providers={"scripted": model}) as kernel:
        run = await kernel.start(model="scripted/x", messages=["Charge 5."])
        async for _ in kernel.run(run.run_id):
            pass
        paused = await kernel.get(run.run_id)
        assert paused.state == "paused"
        assert paused.pause is not None
        assert paused.pause.reason == "uncertain_tool_calls"
        details = paused.pause.details
        assert isinstance(details, Uncertain)
        (uncertain,) = details.calls
        assert (uncertain.id, uncertain.name, uncertain.returned) == ("c1", "charge", "Receipt")
        assert paused.pause.metadata["calls"][0]["returned"] == "Receipt"
        turn = paused.current_turn
        assert turn is not None
        assert [r.id for r in turn.in_flight] == ["c1"]
        assert not turn.completed  # the model was never told the call failed
        events = [e.type for e in await kernel.events(run.run_id)]
        assert "tool_call_completed" not in events
        assert events[-1] == "run_paused"
        said = warnings_of(caplog)
        assert any("'charge'" in w and "Receipt" in w for w in said), said

        await kernel.resolve_tool_call(run.run_id, "c1", output={"charge_id": "ch_5"})
        async for _ in kernel.run(run.run_id):
            pass
        done = await kernel.get(run.run_id)
    assert done.state == "completed"
    assert counts == {"charge": 1}  # never charged twice
    (record,) = done.turns[0].completed
    assert (record.output, record.error) == ({"charge_id": "ch_5"}, None)


async def test_the_pause_survives_a_new_kernel(tmp_path: Path) -> None:
    counts: dict[str, int] = {}
    model = ScriptedProvider([call("charge", {"amount": 5}, id="c1"), "Charged."])
    store = f"sqlite:///{tmp_path}/runs.db"
    async with sk.Kernel(store, tools=tools(counts), providers={"scripted": model}) as kernel:
        run = await kernel.start(model="scripted/x", messages=["Charge 5."])
        async for _ in kernel.run(run.run_id):
            pass
    async with sk.Kernel(store, tools=tools(counts), providers={"scripted": model}) as kernel:
        async for _ in kernel.run(run.run_id):
            pass  # at rest: nothing runs again
        head = await kernel.get(run.run_id)
        assert head.state == "paused"
        assert head.pause is not None
        assert head.pause.metadata["calls"][0]["returned"] == "Receipt"
    assert counts == {"charge": 1}


async def test_an_idempotent_tool_is_an_error_result_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counts: dict[str, int] = {}
    model = ScriptedProvider([call("quote", {"amount": 5}, id="q1"), "No quote."])
    store = f"sqlite:///{tmp_path}/runs.db"
    async with sk.Kernel(store, tools=tools(counts), providers={"scripted": model}) as kernel:
        run = await kernel.start(model="scripted/x", messages=["Quote 5."])
        async for _ in kernel.run(run.run_id):
            pass
        done = await kernel.get(run.run_id)
    assert done.state == "completed"
    (record,) = done.turns[0].completed
    assert record.error is not None
    assert "not JSON" in record.error
    said = warnings_of(caplog)
    assert any("'quote'" in w and "Receipt" in w for w in said), said
