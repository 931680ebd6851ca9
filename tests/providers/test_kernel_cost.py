"""What runs cost over a real HTTP provider (the OpenAI wire format): each committed
answer carries its cost at the kernel's prices in its usage, the run's usage sums them,
and a cost limit pauses the run before the next model call once it is reached."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel._records import convert
from statekernel.errors import ConfigError, InvalidArgument
from statekernel.pauses import LimitReached
from statekernel.providers import OpenAIProvider, RetryPolicy
from statekernel.telemetry import Price
from statekernel.web import create_app

from ..statekernel.web.clients import local_client
from .conftest import WireServer
from .test_kernel_limits import CALLS, answer, ask_weather, get_weather

PRICE = Price(input_per_mtok=2.0, output_per_mtok=8.0)
PRICES = {"openai/m": PRICE}


@contextlib.asynccontextmanager
async def kernel_on(url: str, wire: WireServer, prices: Any = None) -> AsyncIterator[sk.Kernel]:
    """A kernel on ``url`` whose ``openai`` provider is the wire server, with ``prices``."""
    provider = OpenAIProvider(base_url=wire.url, retry=RetryPolicy(max_attempts=1))
    try:
        async with sk.Kernel(
            url, tools=[get_weather], providers={"openai": provider}, prices=prices
        ) as kernel:
            yield kernel
    finally:
        await provider.aclose()


def cost_of(prompt: int, completion: int) -> float:
    return PRICE.cost(sk.Usage(input_tokens=prompt, output_tokens=completion))


async def test_each_answer_is_priced_as_it_is_committed_and_the_cost_is_kept(
    wire: WireServer, tmp_path: Path
) -> None:
    CALLS.clear()
    url = f"sqlite:///{tmp_path}/runs.db"
    ask_weather(wire, ["Paris"], prompt=100_000, completion=2_000)
    answer(wire, "Sunny.", prompt=150_000, completion=1_000)
    async with kernel_on(url, wire, PRICES) as kernel:
        run = await kernel.start(model="openai/m", messages=["Weather?"])
        [_ async for _ in kernel.run(run.run_id)]
        ran = await kernel.get(run.run_id)
    assert ran.state == "completed"
    first, second = (turn.result.usage.cost for turn in ran.turns if turn.result)
    assert first is not None
    assert second is not None
    assert first == pytest.approx(cost_of(100_000, 2_000))  # 0.2 + 0.016
    assert second == pytest.approx(cost_of(150_000, 1_000))
    assert ran.usage.cost == pytest.approx(first + second)
    assert ran.usage.cost == pytest.approx(ran.cost(PRICES).total)
    assert convert.unstructure(ran.turns[0])["result"]["usage"]["cost"] == first

    # the cost is what the answer cost when it was committed: a kernel without prices,
    # or with other ones, reads the same figures from the store
    later = {"openai/m": Price(input_per_mtok=100.0, output_per_mtok=100.0)}
    async with kernel_on(url, wire, later) as reader:
        again = await reader.get(run.run_id)
    assert again.usage.cost == ran.usage.cost
    assert again.cost(later).total != again.usage.cost  # re-priced only when asked

    shown = f"{ran.usage.cost:.6g}"
    cli = [sys.executable, "-P", "-m", "statekernel", "runs", "show", run.run_id, "--store", url]
    shower = await asyncio.create_subprocess_exec(*cli, stdout=PIPE, stderr=PIPE)
    out, err = await shower.communicate()
    assert shower.returncode == 0, err.decode()
    assert re.search(rf"cost\s+{re.escape(shown)}", out.decode()), out.decode()
    with local_client(create_app(url)) as client:
        page = client.get(f"/runs/{run.run_id}")
    assert page.status_code == 200
    assert f"cost {shown}" in page.text


async def test_an_answer_without_a_price_has_no_cost(wire: WireServer) -> None:
    answer(wire, "Hi.", prompt=10, completion=5)
    async with kernel_on("memory://", wire, {"openai/other": PRICE}) as kernel:
        run = await kernel.start(model="openai/m", messages=["Hi"])
        [_ async for _ in kernel.run(run.run_id)]
        ran = await kernel.get(run.run_id)
    assert ran.state == "completed"
    assert ran.usage == sk.Usage(input_tokens=10, output_tokens=5)
    assert ran.usage.cost is None
    assert "cost" not in convert.unstructure(ran.usage)  # stored as before


async def test_a_cost_limit_pauses_before_the_next_model_call_and_resumes_raised(
    wire: WireServer, tmp_path: Path
) -> None:
    CALLS.clear()
    url = f"sqlite:///{tmp_path}/runs.db"
    ask_weather(wire, ["Paris"], prompt=100_000, completion=2_000)  # 0.216: under 0.3
    ask_weather(wire, ["Rome"], prompt=120_000, completion=3_000)  # 0.264: past it
    answer(wire, "Sunny in both.", prompt=140_000, completion=1_000)
    spent = cost_of(100_000, 2_000) + cost_of(120_000, 3_000)
    async with kernel_on(url, wire, PRICES) as kernel:
        run = await kernel.start(
            model="openai/m", messages=["Weather?"], limits=sk.Limits(cost=0.3)
        )
        [_ async for _ in kernel.run(run.run_id)]
    async with kernel_on(url, wire, PRICES) as kernel:  # as the store keeps it
        paused = await kernel.get(run.run_id)
        assert paused.state == "paused"
        assert paused.pause is not None
        assert paused.pause.reason == "limit_reached"
        reached = paused.pause.details
        assert isinstance(reached, LimitReached)
        assert (reached.limit, reached.allowed) == ("cost", 0.3)
        assert reached.used == pytest.approx(spent)
        assert type(reached.used) is float
        assert paused.pause.metadata["used"] == reached.used
        assert len(wire.requests) == 2  # the third call was not made
        assert CALLS == ["Paris", "Rome"]

        await kernel.resume(run.run_id, limits=sk.Limits(cost=1))
        [_ async for _ in kernel.run(run.run_id)]
        done = await kernel.get(run.run_id)
    assert done.state == "completed"
    assert done.limits == sk.Limits(cost=1.0)
    assert len(wire.requests) == 3


async def test_a_cost_limit_needs_the_price_of_every_model_the_run_may_call(
    wire: WireServer, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    async with kernel_on(url, wire, PRICES) as kernel:
        with pytest.raises(ConfigError, match="'openai/n'"):
            await kernel.start(
                model=sk.Fallback("openai/m", "openai/n"),
                messages=["Hi"],
                limits=sk.Limits(cost=1.0),
            )
        run = await kernel.start(model="openai/m", messages=["Hi"], limits=sk.Limits(cost=1.0))
    async with kernel_on(url, wire) as unpriced:
        with pytest.raises(ConfigError, match=r"'openai/m'.*Kernel\(prices="):
            [_ async for _ in unpriced.run(run.run_id)]
        with pytest.raises(ConfigError, match="'openai/m'"):
            await unpriced.resume(run.run_id, limits=sk.Limits(cost=2.0))
        stored = await unpriced.get(run.run_id)
        assert stored.turns == ()  # no turn prepared
        assert stored.current_turn is None
        assert stored.state in ("init", "preparing_turn")
        assert wire.requests == []  # no model call was made
        # without a cost limit the same kernel drives it
        other = await unpriced.start(model="openai/m", messages=["Hi"])
        assert other.limits is None


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf, "1", True, None])
def test_a_bad_cost_limit_is_refused_naming_it(bad: Any) -> None:
    if bad is None:
        assert sk.Limits(cost=None).cost is None
        assert sk.Limits(cost=2).cost == 2.0  # an int amount is a float
        assert type(sk.Limits(cost=2).cost) is float
        return
    with pytest.raises(InvalidArgument, match=r"Limits\.cost"):
        sk.Limits(cost=bad)
