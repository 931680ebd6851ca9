"""A worker process of the crash test: ``python temporal_worker_proc.py ADDRESS QUEUE
STORE LEDGER BLOCK``. Its ``pay`` tool (not idempotent) appends ``pay <run> <call>
<fencing token>`` to the ledger; with BLOCK=1 it then appends ``blocked`` and never
returns (the test kills the process there)."""

from __future__ import annotations

import asyncio
import os
import sys

from temporalio.client import Client

import statekernel as sk
from statekernel.integrations.temporal import statekernel_worker
from statekernel.testing import ScriptedProvider, call


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def main(address: str, queue: str, store: str, ledger: str, block: bool) -> None:
    @sk.tool
    async def pay(amount: int, ctx: sk.ToolContext) -> str:
        """Pay ``amount`` (not idempotent)."""
        append(ledger, f"pay {ctx.run_id} {ctx.call_id} {ctx.fencing_token}")
        if block:
            append(ledger, "blocked")
            await asyncio.Event().wait()
        return f"paid {amount}"

    script = ScriptedProvider([call("pay", {"amount": 5}), "Paid."])
    kernel = sk.Kernel(store, tools=[pay], providers={"scripted": script}, lease_ttl=3.0)
    async with kernel:
        client = await Client.connect(address)
        await statekernel_worker(client, kernel, task_queue=queue).run()


if __name__ == "__main__":
    address, queue, store, ledger, block = sys.argv[1:6]
    asyncio.run(main(address, queue, store, ledger, block == "1"))
