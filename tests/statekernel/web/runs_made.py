"""Runs for the web view's tests, made in a store by the test agent (``web_agent``)."""

from __future__ import annotations

import contextlib

import pytest

import statekernel as sk
from statekernel.stores import CheckpointStore
from statekernel.testing import Crash, CrashAt, FaultPlan

from .web_agent import kernel_options


async def drive(kernel: sk.Kernel, run_id: str) -> sk.Run:
    """Drive ``run_id`` to rest; the run at rest."""
    async for _ in kernel.run(run_id):
        pass
    return await kernel.get(run_id)


async def make_runs(url: CheckpointStore | str) -> None:
    """In the store (or the store at ``url``): ``asking`` (paused on a question),
    ``injected`` (completed, a tool result holding ``<script>``), ``uncertain`` (paused
    on an uncertain call) and ``chat`` (completed)."""
    async with sk.Kernel(url, **kernel_options()) as kernel:
        for run_id, model in (("asking", "ask/m"), ("injected", "inject/m"), ("chat", "chat/m")):
            await kernel.start(model=model, messages=["go"], run_id=run_id)
            await drive(kernel, run_id)
        await kernel.start(model="book/m", messages=["book two"], run_id="uncertain")
    plan = FaultPlan([CrashAt("tool_after_effect", 1)])
    crashing = sk.Kernel(url, **{**kernel_options(), "middleware": [plan.middleware()]})
    with pytest.raises(Crash):
        await drive(crashing, "uncertain")
    with contextlib.suppress(Exception):
        await crashing.aclose()
    async with sk.Kernel(url, **kernel_options(), lease_ttl=0.5) as kernel:
        run = await drive(kernel, "uncertain")
        assert run.pause is not None, run.state
        assert run.pause.reason == "uncertain_tool_calls"
