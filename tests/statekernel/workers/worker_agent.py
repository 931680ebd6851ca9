"""The agent of the worker process tests, loaded by ``statekernel worker --agent
worker_agent:make`` (with this folder on ``PYTHONPATH``).

A scripted model that sleeps ``SK_MODEL_DELAY`` seconds per answer and asks, for each of
``SK_TURNS`` turns, for a non-idempotent ``side_effect`` and an idempotent ``lookup``.
Both tools append a line to the side-effect log ``SK_WORKER_LOG``; a middleware also
appends ``ack <run> <revision> <call>`` before a tool runs: the revision whose commit
(``tool_call_started``) the worker saw land.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import statekernel as sk
from statekernel.middleware import ToolInvocation
from statekernel.testing import Reply, ScriptedProvider, call


def script(turns: int, delay: float) -> list[object]:
    items: list[object] = [
        Reply(
            tool_calls=(call("side_effect", {"key": f"s{i}"}), call("lookup", {"key": f"l{i}"})),
            delay=delay,
        )
        for i in range(turns)
    ]
    return [*items, Reply("all done", delay=delay)]


def make(
    log_path: str | None = None, turns: int | None = None, delay: float | None = None
) -> dict[str, Any]:
    """Kernel options for the worker (arguments default to the environment)."""
    path = log_path or os.environ["SK_WORKER_LOG"]
    turns = turns if turns is not None else int(os.environ.get("SK_TURNS", "3"))
    delay = delay if delay is not None else float(os.environ.get("SK_MODEL_DELAY", "0.02"))

    def append(line: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    @sk.tool
    async def side_effect(key: str, ctx: sk.ToolContext) -> str:
        """Not idempotent: appends to the log."""
        append(f"side {ctx.run_id} {ctx.call_id} {key}")
        await asyncio.sleep(0.002)
        return f"wrote {key}"

    @sk.tool(idempotent=True)
    async def lookup(key: str, ctx: sk.ToolContext) -> str:
        """Idempotent: appends to the log."""
        append(f"idem {ctx.run_id} {ctx.call_id} {ctx.idempotency_key}")
        await asyncio.sleep(0.002)
        return f"value {key}"

    async def acknowledged(invocation: Any, nxt: Any) -> Any:
        if isinstance(invocation, ToolInvocation):
            run = invocation.run
            append(f"ack {run.run_id} {run.revision} {invocation.call.id}")
        return await nxt(invocation)

    return {
        "tools": [side_effect, lookup],
        "providers": {"scripted": ScriptedProvider(script(turns, delay))},
        "middleware": [acknowledged],
        "max_turns": None,
    }
