"""Middleware chains around model calls and tool calls."""

from __future__ import annotations

from typing import Any

import attrs

import statekernel as sk
from statekernel.middleware import Middleware, ModelCall, ToolInvocation
from statekernel.testing import call

from ..conftest import MakeKernel, drain, start


@sk.tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_order_is_outermost_first(make_kernel: MakeKernel) -> None:
    trace: list[str] = []

    def named(name: str) -> Middleware:
        async def mw(c: Any, nxt: Any) -> Any:
            kind = "model" if isinstance(c, ModelCall) else "tool"
            trace.append(f"{name}>{kind}")
            result = await nxt(c)
            trace.append(f"{name}<{kind}")
            return result

        return mw

    kernel, _, _ = make_kernel(
        [call("add", {"a": 1, "b": 2}), "3"],
        tools=[add],
        middleware=[named("outer"), named("inner")],
    )
    run = await start(kernel)
    await drain(kernel, run.run_id)
    one_call = ["outer>{k}", "inner>{k}", "inner<{k}", "outer<{k}"]
    expected = [s.format(k=k) for k in ("model", "tool", "model") for s in one_call]
    assert trace == expected


async def test_middleware_can_short_circuit_the_model(make_kernel: MakeKernel) -> None:
    async def cache(c: Any, nxt: Any) -> Any:
        if isinstance(c, ModelCall):
            return sk.ModelResult(sk.Message.assistant("from cache"))
        return await nxt(c)

    kernel, _, provider = make_kernel(["from model"], middleware=[cache])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert provider.requests == []
    assert (await kernel.get(run.run_id)).messages[-1].text == "from cache"


async def test_middleware_can_short_circuit_and_rewrite_tools(make_kernel: MakeKernel) -> None:
    async def sandbox(c: Any, nxt: Any) -> Any:
        if isinstance(c, ToolInvocation):
            if c.input["a"] > 100:
                raise sk.errors.ToolError("blocked by sandbox")
            return await nxt(attrs.evolve(c, input={**c.input, "b": 0}))
        return await nxt(c)

    script = [[call("add", {"a": 1, "b": 2}), call("add", {"a": 500, "b": 1})], "ok"]
    kernel, _, _ = make_kernel(script, tools=[add], middleware=[sandbox])
    run = await start(kernel)
    await drain(kernel, run.run_id)
    final = await kernel.get(run.run_id)
    done = {r.id: r for r in final.turns[0].completed}
    assert done["call_0_0"].output == 1
    assert done["call_0_1"].error == "blocked by sandbox"


async def test_retry_middleware_retries_the_model(make_kernel: MakeKernel) -> None:
    from statekernel.testing import Fail, Reply

    async def retry(c: Any, nxt: Any) -> Any:
        for attempt in range(3):
            try:
                return await nxt(c)
            except sk.errors.ProviderError:
                if attempt == 2:
                    raise
        raise AssertionError

    err = sk.errors.RateLimited("slow down")
    kernel, _, provider = make_kernel(
        [Fail(err, times=2, then=Reply(text="ok"))], middleware=[retry]
    )
    run = await start(kernel)
    await drain(kernel, run.run_id)
    assert (await kernel.get(run.run_id)).state == "completed"
    assert len(provider.requests) == 3
