"""What model calls cost: the prices a user gives per model, and the cost of a turn's or
a run's token usage at those prices.

A ``Price`` is per million tokens in whatever currency the table is in (one table, one
currency). Plain input tokens cost ``input_per_mtok``; tokens read from the provider's
prompt cache ``cached_input_per_mtok`` and tokens written to it ``cache_write_per_mtok``
(each the input price when not given); output tokens, reasoning tokens included (as the
providers count them), ``output_per_mtok``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import attrs

from statekernel._records.messages import Usage
from statekernel.errors import InvalidArgument

__all__ = ["Price", "Prices", "RunCost", "TurnCost", "check_prices", "priced", "turns_cost"]

_MTOK = 1_000_000


def _amount(name: str, value: object, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidArgument(f"Price {name} must be a finite number >= 0, got {value!r}")


@attrs.frozen
class Price:
    """The price of a model's tokens, per million tokens (``mtok``).

    ``cached_input_per_mtok``: tokens read from the prompt cache (None: the input price);
    ``cache_write_per_mtok``: tokens written to it (None: the input price). A price that is
    not a finite number >= 0 raises ``InvalidArgument`` naming it.
    """

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def __attrs_post_init__(self) -> None:
        _amount("input_per_mtok", self.input_per_mtok)
        _amount("output_per_mtok", self.output_per_mtok)
        _amount("cached_input_per_mtok", self.cached_input_per_mtok, optional=True)
        _amount("cache_write_per_mtok", self.cache_write_per_mtok, optional=True)

    def cost(self, usage: Usage) -> float:
        """What ``usage`` costs at this price.

        Returns:
            The cost, in the price table's currency.
        """
        plain = self.input_per_mtok
        read = plain if self.cached_input_per_mtok is None else self.cached_input_per_mtok
        written = plain if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        return (
            usage.input_tokens * plain
            + usage.cache_read_tokens * read
            + usage.cache_write_tokens * written
            + usage.output_tokens * self.output_per_mtok
        ) / _MTOK


Prices = Mapping[str, Price]
"""A price table: ``"provider/name"`` (a run's ``model``) to its ``Price``."""


def check_prices(prices: object) -> dict[str, Price]:
    """``prices`` as a dict, checked: ``InvalidArgument`` naming what is wrong (not a
    mapping, a key that is not ``"provider/name"``, a value that is not a ``Price``)."""
    if not isinstance(prices, Mapping):
        raise InvalidArgument(
            f"prices must map 'provider/name' to a Price, got {type(prices).__name__}"
        )
    table: dict[str, Price] = {}
    for model, price in prices.items():
        provider, sep, name = model.partition("/") if isinstance(model, str) else ("", "", "")
        if not (provider and sep and name):
            raise InvalidArgument(f"prices: a key must look like 'provider/name', got {model!r}")
        if not isinstance(price, Price):
            raise InvalidArgument(
                f"prices[{model!r}] must be a statekernel.telemetry.Price,"
                f" got {type(price).__name__}"
            )
        table[model] = price
    return table


@attrs.frozen
class TurnCost:
    """The cost of one turn's model answer: the turn's index, the model it asked and the
    cost (None when the price table has no price for that model)."""

    index: int
    model: str
    cost: float | None


@attrs.frozen
class RunCost:
    """The cost of a run's model answers at a price table (``Run.cost``).

    ``total``: the sum over the priced turns; ``turns``: each turn with an answer;
    ``unpriced``: the models of turns the table has no price for (their cost is not in
    ``total``).
    """

    total: float
    turns: tuple[TurnCost, ...]
    unpriced: tuple[str, ...] = ()


def turns_cost(answered: Iterable[tuple[int, str, Usage]], prices: Prices) -> RunCost:
    """The cost of answered turns, each given as (index, model, usage).

    Returns:
        Their total and each turn's cost.
    """
    turns: list[TurnCost] = []
    unpriced: dict[str, None] = {}
    total = 0.0
    for index, model, usage in answered:
        price = prices.get(model)
        if price is None:
            unpriced[model] = None
            turns.append(TurnCost(index, model, None))
            continue
        cost = price.cost(usage)
        total += cost
        turns.append(TurnCost(index, model, cost))
    return RunCost(total, tuple(turns), tuple(unpriced))


def priced(usage: Usage, model: str, prices: Prices) -> Usage:
    """``usage`` with its ``cost`` at the price of ``model`` in ``prices``; as it is when
    the table has no price for the model.

    Returns:
        The usage, priced where it could be.
    """
    price = prices.get(model)
    return usage if price is None else attrs.evolve(usage, cost=price.cost(usage))
