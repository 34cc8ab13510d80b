"""Budget conditions: the figure a ``budget`` rule compares with its limit, and the
crossing it names.

A scope instance (``tillerman.ledger.spent``: the turn, the thread, the goal, the UTC
day, the owner's UTC day) only ever spends more, so its tokens and its cost cross a
limit at most once: the crossing is named by the rule, the scope instance and the limit
(``Crossing.instance``), and a finding keyed on it is recorded once however many usage
lines follow. A new turn, day or goal is a new instance, hence a new crossing. Context
use is the last response's, and goes down when a thread compacts: it is reported once
per instance of its scope too (per turn: again in a later turn).

Cost is priced here, from the rule set's price table (``Prices``: ``load_prices`` of
``tillerman.rules.prices``), on a scope's parts (model, speed, tier band): each part at
the rates of a response of its band, so a sum of small responses is never priced as one
large one. A model the table has no price for adds nothing and is named (``unpriced``):
the cost is then a lower bound, never a made-up figure.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from tillerman.ledger.spent import Part, Spent, UsageFigures
from tillerman.ledger.usage import Tokens
from tillerman.rules.ruleset import Budget


class Prices(Protocol):
    """The price table (``tillerman.rules.prices.PriceTable``)."""

    def cost(self, model: str | None, tokens: Tokens, *, speed: str | None = None) -> Any: ...

    def context_window(self, model: str | None) -> int | None: ...


class Crossing(msgspec.Struct, frozen=True, kw_only=True):
    """A budget figure at or over its limit."""

    instance: str  # the scope instance: what the finding's key names
    figure: float
    spent: Spent | None  # None for context (the last response, not a sum)
    unpriced: tuple[str, ...] = ()  # models with no price (cost only): the figure is a lower bound
    price_date: str | None = None


def crossing(condition: Budget, usage: UsageFigures, prices: Prices | None) -> Crossing | None:
    """The crossing of ``condition`` by the thread's figures, or None while under it (or
    when its figure cannot be known: no scope instance, no window, no price table)."""
    spent = usage.scope(condition.per)
    if spent is None:
        return None
    if condition.measure == "context":
        window = usage.context_window or (prices.context_window(usage.model) if prices is not None else None)
        if not window:
            return None
        figure = usage.last_input / window
        return Crossing(instance=spent.instance, figure=figure, spent=None) if figure >= condition.over else None
    if condition.measure == "tokens":
        total = spent.tokens.total
        return Crossing(instance=spent.instance, figure=total, spent=spent) if total >= condition.over else None
    if prices is None:
        return None
    usd, unpriced, date = cost(spent, prices)
    if usd < condition.over:
        return None
    return Crossing(instance=spent.instance, figure=usd, spent=spent, unpriced=unpriced, price_date=date)


def cost(spent: Spent, prices: Prices) -> tuple[float, tuple[str, ...], str | None]:
    """USD of what ``spent`` counted, the models without a price, the table's date."""
    usd, unpriced, date = 0.0, [], None
    for part in spent.parts:
        rates = _rates(prices, part.model, part.speed, part.floor)
        if rates is None:
            unpriced.append(part.model or "unknown")
            continue
        usd += _priced(part, rates[0])
        date = rates[1]
    return usd, tuple(sorted(set(unpriced))), date


def _priced(part: Part, rates: tuple[float, float, float, float, float]) -> float:
    uncached, cached, write_5m, write_1h, output = rates
    t = part.tokens
    return (t.uncached_input * uncached + t.cached_input * cached + (t.cache_write - t.cache_write_1h) * write_5m
            + t.cache_write_1h * write_1h + t.output * output)


#: (id of the table, model, speed, floor) -> (the table, its rates): a table may not be
#: hashable, and it is held so its id is not reused while cached.
_RATES: dict[tuple, tuple[Prices, Any]] = {}


def _rates(prices: Prices, model: str | None, speed: str | None, floor: int):
    key = (id(prices), model, speed, floor)
    cached = _RATES.get(key)
    if cached is None or cached[0] is not prices:
        if len(_RATES) >= 1024:
            _RATES.clear()
        cached = _RATES[key] = (prices, _read_rates(prices, model, speed, floor))
    return cached[1]


def _read_rates(prices: Prices, model: str | None, speed: str | None, floor: int):
    """Per-token USD of a response of ``floor + 1`` input tokens, field by field
    (uncached input, cache read, 5-minute write, 1-hour write, output), read off the
    table by pricing such a response with all its input in that field; and the table's
    date. None when the table has no price for the model."""
    size = floor + 1

    def usd(**fields: int) -> float | None:
        return prices.cost(model, Tokens(input=size, **fields), speed=speed).usd

    base = usd()
    if base is None:
        return None
    with_output = usd(output=size)
    rates = (base / size, usd(cached_input=size) / size, usd(cache_write=size) / size,
             usd(cache_write=size, cache_write_1h=size) / size, (with_output - base) / size)
    return rates, prices.cost(model, Tokens(input=size), speed=speed).date
