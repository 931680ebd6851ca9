"""A process that drives one run until it rests, for the cancel-by-id tests.

Usage: python cancel_driver.py URL LEDGER RUN_ID WHERE

``WHERE`` is where the run waits to be cancelled: ``model`` (the model call never
answers), ``pay`` (a tool that is not idempotent never returns) or ``lookup`` (an
idempotent tool that never returns). Every model call and every tool execution appends
``start <what> <attempt>`` to LEDGER before it begins and ``cancelled <what>`` when it
sees its cancellation (O_APPEND, fsynced), the ledger the tests read from outside. The
kernel's lease is short (renewed every half second), so a cancel request kept by the
store reaches the drive within that. At the end the process prints the run's state and
failure as one line of JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import statekernel as sk
from statekernel.middleware import ModelCall
from statekernel.testing import ScriptedProvider, call


def append(path: str, line: str) -> None:
    """Append one line to the ledger and make it durable before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def wait_forever(ledger: str, what: str) -> None:
    """Block until cancelled, saying so in the ledger."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        append(ledger, f"cancelled {what}")
        raise


def agent(ledger: str, where: str) -> dict[str, Any]:
    """The kernel's tools, model and middleware for this process."""

    @sk.tool
    async def pay(amount: int, ctx: sk.ToolContext) -> str:
        """Pay an amount (not idempotent).

        Args:
            amount: How much.
        """
        append(ledger, f"start pay {ctx.attempt}")
        await wait_forever(ledger, "pay")
        return "paid"

    @sk.tool(idempotent=True)
    async def lookup(key: str, ctx: sk.ToolContext) -> str:
        """Look a key up (idempotent).

        Args:
            key: What to look up.
        """
        append(ledger, f"start lookup {ctx.attempt}")
        await wait_forever(ledger, "lookup")
        return "found"

    models = 0

    async def ledgered(invocation: Any, proceed: Callable[[Any], Awaitable[Any]]) -> Any:
        nonlocal models
        if isinstance(invocation, ModelCall):
            models += 1
            append(ledger, f"start model {models}")
            if where == "model":
                await wait_forever(ledger, "model")
        return await proceed(invocation)

    tool_call = call("pay", {"amount": 5}) if where != "lookup" else call("lookup", {"key": "k"})
    provider = ScriptedProvider([tool_call, "all done"])
    return {
        "tools": [pay, lookup],
        "providers": {"scripted": provider},
        "middleware": [ledgered],
        "lease_ttl": 1.5,
    }


async def main(url: str, ledger: str, run_id: str, where: str) -> None:
    async with sk.Kernel(url, **agent(ledger, where)) as kernel:
        async for _ in kernel.run(run_id):
            pass
        run = await kernel.get(run_id)
    failure = run.failure
    print(
        json.dumps(
            {
                "state": run.state,
                "error": failure.error if failure else None,
                "by": failure.cancellation.by if failure and failure.cancellation else None,
                "failed_in": failure.failed_in if failure else None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
