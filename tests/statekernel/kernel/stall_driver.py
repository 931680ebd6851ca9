"""A process that drives one run whose only call is a payment, for the stall tests.

Usage: python stall_driver.py ROLE URL LEDGER RUN_ID LEASE_TTL BUSY_TIMEOUT [CLOCK_SHIFT]

``ROLE`` ``hold``: drive the run; once the payment's intent is committed, print
``INTENT`` and wait for a line on stdin before the call goes on to start (the test
freezes the process meanwhile, or lets another process try to take the run).
``ROLE`` ``operator``: drive the run; a pause on uncertain calls is answered with
``rerun=True`` (an operator who saw no payment) and the run is driven again.
``CLOCK_SHIFT``: seconds added to this process's wall clock (an NTP step, a migrated
VM), before statekernel is imported.

The payment appends ``pay <pid> <fencing token>`` to LEDGER (O_APPEND, fsynced) as its
effect. At the end the process prints one line of JSON: ``{"outcome": ..., "state":
...}`` where the outcome is ``done``, ``busy`` or ``lost``.
"""

from __future__ import annotations

import sys
import time

if len(sys.argv) > 7:  # before anything reads the clock
    _shift = float(sys.argv[7])
    _wall = time.time
    time.time = lambda: _wall() + _shift

import asyncio
import json
import os
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under PYTHONSAFEPATH
from race_driver import append  # the same fsynced ledger line

import statekernel as sk
from statekernel.errors import LeaseLost
from statekernel.middleware import ToolInvocation
from statekernel.testing import ScriptedProvider, call

SCRIPT: list[object] = [call("pay", {"to": "bob", "amount": 5}), "paid"]


def kernel(role: str, url: str, ledger: str, lease_ttl: float, busy_timeout: float) -> sk.Kernel:
    """The agent both roles run: one payment, then an answer."""

    @sk.tool
    async def pay(to: str, amount: int, ctx: sk.ToolContext) -> str:
        """Pay someone (not idempotent)."""
        append(ledger, f"pay {os.getpid()} {ctx.fencing_token}")
        return f"paid {amount} to {to}"

    async def hold(invocation: Any, call_next: Any) -> Any:
        if isinstance(invocation, ToolInvocation):  # its intent is committed
            print("INTENT", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        return await call_next(invocation)

    return sk.Kernel(
        url,
        tools=[pay],
        providers={"scripted": ScriptedProvider(SCRIPT)},
        middleware=[hold] if role == "hold" else [],
        lease_ttl=lease_ttl,
        busy_timeout=busy_timeout,
    )


async def warm() -> None:
    """A drive's one-time work in a process (the stored format's generated code), done
    before the lease is taken: on a loaded machine it could outlast a short lease."""
    async with sk.Kernel("memory://", providers={"scripted": ScriptedProvider(["ok"])}) as k:
        run = await k.start(model="scripted/x", messages=["hi"])
        async for _ in k.run(run.run_id):
            pass


async def main(role: str, url: str, ledger: str, run_id: str, ttl: float, wait: float) -> None:
    outcome = "done"
    await warm()
    async with kernel(role, url, ledger, ttl, wait) as k:
        try:
            async for _ in k.run(run_id):
                pass
            run = await k.get(run_id)
            if role == "operator" and run.pause is not None:
                for c in run.pause.metadata.get("calls", []):
                    await k.resolve_tool_call(run_id, c["id"], rerun=True)
                async for _ in k.run(run_id):
                    pass
        except sk.RunBusy:
            outcome = "busy"
        except LeaseLost:
            outcome = "lost"
        state = (await k.get(run_id)).state
    print(json.dumps({"outcome": outcome, "state": state}), flush=True)


if __name__ == "__main__":
    role, url, ledger, run_id, ttl, wait = sys.argv[1:7]
    asyncio.run(main(role, url, ledger, run_id, float(ttl), float(wait)))
