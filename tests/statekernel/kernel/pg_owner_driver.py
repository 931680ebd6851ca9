"""A process that drives one run of a PostgreSQL store, for the ownership tests.

Usage: python pg_owner_driver.py URL FOLDER RUN_ID TOOL [stop] [ttl=S] [busy=S]

The run's one turn calls ``TOOL``: ``pay`` (not idempotent) or ``fetch`` (idempotent).
Each execution appends ``start <run>:<call> <attempt> <pid> <tool>`` to ``FOLDER/ledger``
(fsynced) before its effect, waits until the file ``FOLDER/gate`` exists, and appends
``end ...``. ``stop``: a middleware stops this process (SIGSTOP) right after the call's
intent committed, before the lease check that precedes the effect. ``ttl``: the lease's
TTL (default 15 s); ``busy``: how long to wait for another owner (default 0.5 s). At the
end the process prints one line of JSON: the error the drive
ended with (its type name, or null) and the run's state.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import statekernel as sk
from statekernel.middleware import ToolInvocation
from statekernel.stores import open_store
from statekernel.testing import ScriptedProvider, call


def append(path: Path, line: str) -> None:
    """Append one line to the ledger and make it durable before returning."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def gate(folder: Path) -> None:
    """Return once the test opened the gate."""
    for _ in itertools.count():
        if (folder / "gate").exists():
            return
        await asyncio.sleep(0.01)


def agent(folder: Path) -> dict[str, Any]:
    """Kernel options: the scripted model and the two ledger-writing tools."""

    async def effect(tool: str, ctx: sk.ToolContext) -> None:
        key = f"{ctx.run_id}:{ctx.call_id} {ctx.attempt} {os.getpid()} {tool}"
        append(folder / "ledger", f"start {key}")
        await gate(folder)
        append(folder / "ledger", f"end {key}")

    @sk.tool
    async def pay(amount: int, ctx: sk.ToolContext) -> str:
        """Not idempotent."""
        await effect("pay", ctx)
        return f"paid {amount}"

    @sk.tool(idempotent=True)
    async def fetch(key: str, ctx: sk.ToolContext) -> str:
        """Idempotent."""
        await effect("fetch", ctx)
        return f"value {key}"

    return {"tools": [pay, fetch]}


def script(tool: str) -> list[object]:
    """One call of ``tool``, then the answer."""
    return [call(tool, {"amount": 5} if tool == "pay" else {"key": "k"}), "done"]


async def stop_before_effect(invocation: Any, nxt: Any) -> Any:
    """Stop this process after the intent committed, before the lease check."""
    if isinstance(invocation, ToolInvocation):
        os.kill(os.getpid(), signal.SIGSTOP)
    return await nxt(invocation)


async def main(argv: list[str]) -> None:
    url, folder_name, run_id, tool, *rest = argv
    folder = Path(folder_name)
    options = dict(a.split("=", 1) for a in rest if "=" in a)
    store = open_store(url)
    kernel = sk.Kernel(
        store,
        **agent(folder),
        providers={"scripted": ScriptedProvider(script(tool))},
        middleware=[stop_before_effect] if "stop" in rest else [],
        lease_ttl=float(options.get("ttl", 15.0)),
        busy_timeout=float(options.get("busy", 0.5)),
    )
    error = None
    try:
        async for _ in kernel.run(run_id):
            pass
    except sk.StatekernelError as exc:
        error = type(exc).__name__
    try:
        state = (await kernel.get(run_id)).state
    finally:
        await kernel.aclose()
        await store.aclose()
    print(json.dumps({"error": error, "state": state}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
