"""Prices: a price table per model, what a turn's and a run's usage cost at it, and the
typed errors of a bad table."""

from __future__ import annotations

import math

import pytest

import statekernel as sk
from statekernel.errors import InvalidArgument, ProviderUnavailable
from statekernel.stores import MemoryStore
from statekernel.telemetry import Price, RunCost, TurnCost
from statekernel.testing import Fail, Reply, ScriptedProvider, call

PRICE = Price(input_per_mtok=2.5, output_per_mtok=10.0, cached_input_per_mtok=1.25)


def test_a_price_costs_each_kind_of_token() -> None:
    usage = sk.Usage(input_tokens=1_000, output_tokens=200, cache_read_tokens=4_000)
    assert PRICE.cost(usage) == pytest.approx((1_000 * 2.5 + 4_000 * 1.25 + 200 * 10.0) / 1e6)
    written = sk.Usage(cache_write_tokens=1_000_000)
    assert PRICE.cost(written) == 2.5  # at the input price unless given
    assert Price(1, 1, cache_write_per_mtok=3.75).cost(written) == 3.75
    assert Price(1.0, 2.0).cost(sk.Usage(cache_read_tokens=1_000_000)) == 1.0


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ((-1, 1), "input_per_mtok"),
        ((1, math.inf), "output_per_mtok"),
        ((1, "2"), "output_per_mtok"),
        ((True, 1), "input_per_mtok"),
        ((1, 1, math.nan), "cached_input_per_mtok"),
        ((1, 1, None, -0.5), "cache_write_per_mtok"),
    ],
)
def test_a_bad_price_is_refused_naming_it(arguments: tuple[object, ...], named: str) -> None:
    with pytest.raises(InvalidArgument, match=named):
        Price(*arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prices", "says"),
    [
        ([("openai/gpt-4o", PRICE)], "must map"),
        ({"gpt-4o": PRICE}, "'provider/name'"),
        ({"openai/gpt-4o": 2.5}, r"prices\['openai/gpt-4o'\] must be"),
        ({"openai/gpt-4o": {"input_per_mtok": 1}}, "Price"),
    ],
)
def test_a_bad_price_table_is_refused_by_the_kernel(prices: object, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        sk.Kernel(MemoryStore(), prices=prices)  # type: ignore[arg-type]


@sk.tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def test_a_run_costs_its_answered_turns_at_their_models_price() -> None:
    script: list[object] = [Reply(tool_calls=[call("weather", {"city": "Paris"})]), "Sunny."]
    prices = {"scripted/m": PRICE}
    kernel = sk.Kernel(
        MemoryStore(),
        tools=[weather],
        providers={"scripted": ScriptedProvider(script)},
        prices=prices,
    )
    async with kernel:
        run = await kernel.start(model="scripted/m", messages=["weather?"])
        async for _ in kernel.run(run.run_id):
            pass
        run = await kernel.get(run.run_id)
        assert kernel.prices == prices
    each = (10 * 2.5 + 5 * 10.0) / 1e6  # the scripted model's usage per answer
    cost = run.cost(kernel.prices)
    assert cost.turns == (TurnCost(0, "scripted/m", each), TurnCost(1, "scripted/m", each))
    assert cost.total == pytest.approx(2 * each)
    assert cost.total == pytest.approx(PRICE.cost(run.usage))
    assert cost.unpriced == ()
    assert run.cost({}) == RunCost(
        0.0, (TurnCost(0, "scripted/m", None), TurnCost(1, "scripted/m", None)), ("scripted/m",)
    )
    assert sk.Run(run_id="new", model="scripted/m").cost(prices) == RunCost(0.0, ())


async def test_a_turn_answered_by_a_fallback_is_priced_at_the_model_that_answered() -> None:
    down = ScriptedProvider([Fail(ProviderUnavailable("down", provider="down"), times=100)])
    cheap = Price(input_per_mtok=1.0, output_per_mtok=2.0)
    prices = {"down/m": PRICE, "up/m": cheap}
    providers = {"down": down, "up": ScriptedProvider(["Hello."])}
    async with sk.Kernel(MemoryStore(), providers=providers, prices=prices) as kernel:
        run = await kernel.start(model=sk.Fallback("down/m", "up/m"), messages=["Hi"])
        async for _ in kernel.run(run.run_id):
            pass
        run = await kernel.get(run.run_id)
    assert run.turns[0].answered_by == "up/m"
    assert run.cost(prices).turns == (TurnCost(0, "up/m", cheap.cost(run.usage)),)
