"""A DBOS application process SIGKILLed while its tools run (``dbos_app.py``); the same
application launched again on the same system database recovers its segments: DBOS runs
each step again and statekernel's resume decides. The idempotent call runs again and its
run completes; the payment, not idempotent, is never made twice: its run pauses with
``uncertain_tool_calls`` until it is resolved (through the engine)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dbos import DBOS

import statekernel as sk
from statekernel.integrations.dbos import Segment

from .dbos_app import make_app
from .dbosenv import BACKENDS, Ledger, databases_for, launched, wait_for

HERE = Path(__file__).parent

pytestmark = pytest.mark.slow


@pytest.fixture(params=BACKENDS)
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    yield from databases_for(request, tmp_path)


def test_a_killed_process_is_recovered_without_a_second_payment(
    databases: tuple[str, str], tmp_path: Path
) -> None:
    system, store = databases
    ledger = Ledger(tmp_path / "ledger")
    argv = [sys.executable, str(HERE / "dbos_app.py"), system, store, str(ledger.path)]
    err = (tmp_path / "app.err").open("wb")
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(
            lambda: len(ledger.lines()) == 2 or process.poll() is not None,
            "both tools to start in the application process",
        )
        assert process.poll() is None, (tmp_path / "app.err").read_text()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert [row[:2] for row in sorted(ledger.lines())] == [["lookup", "look-1"], ["pay", "pay-1"]]

    app = make_app(store, str(ledger.path), block=False)
    with launched(app, system, agents={}):  # DBOS recovers the pending segments
        looked: Segment = DBOS.retrieve_workflow("look-1@0").get_result()
        paid: Segment = DBOS.retrieve_workflow("pay-1@0").get_result()
        assert looked["state"] == "completed"
        assert paid["state"] == "paused"
        lookups = ledger.lines("lookup")
        assert len(lookups) == 2, "the idempotent call ran again"
        assert lookups[0][2] == lookups[1][2], "with the same idempotency key"
        assert len(ledger.lines("pay")) == 1, "the payment was not made again"

        async def get(kernel: sk.Kernel) -> sk.Run:
            return await kernel.get("pay-1")

        run = app._call(get)
        assert run.pause is not None
        assert run.pause.reason == "uncertain_tool_calls"
        [uncertain] = run.pause.metadata["calls"]
        # an operator checks the payment service: it was made; the run goes on from there
        resolved = app.resolve_tool_call("pay-1", uncertain["id"], output="paid 50 to Bob")
        assert resolved.get_result()["state"] == "completed"
        wait_for(lambda: app._call(get).state == "completed", "the resolved run to complete")
    assert len(ledger.lines("pay")) == 1
