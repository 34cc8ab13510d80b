"""The built-in usage report: a thread whose UTC day cost crosses ``DAILY_COST_USD``, or
whose last response filled ``CONTEXT_SHARE`` of its context window, is told to a person
without any rule (``usage`` notices, ``tillerman.controller.notify.notices``); ``[defaults]
usage_report = false`` turns it off.

The figures are the fold's (``tillerman.ledger.spent.UsageFigures``, priced by
``tillerman.rules.budget``), read when notices are due, so nothing is summed again and
no decision of the rule step changes: a notice is not a decision, and replay decides
the same with or without it. Once per crossing: a day's cost crosses once per thread
and UTC day; the context crosses when it goes from under the share to at or over it,
and again only after a compaction brought it under.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from tillerman.ledger.projections import Projection
from tillerman.ledger.spent import UsageFigures
from tillerman.rules.budget import crossing
from tillerman.rules.prices import PriceTable, load_prices
from tillerman.rules.ruleset import Budget, RuleSet

#: A day's cost per thread worth a person's look: about a full working day of one agent
#: on a frontier model at list prices; far above a day of small tasks, far below a runaway.
DAILY_COST_USD = 20.0
#: The share of the context window past which the agent is about to compact or fail.
CONTEXT_SHARE = 0.9

_COST = Budget(measure="cost_usd", over=DAILY_COST_USD, per="day")
_CONTEXT = Budget(measure="context", over=CONTEXT_SHARE, per="thread")
_OVER = "over"


class UsageReport:
    """What crossed, from a thread's figures; ``prices`` is the price table in force at
    start (``tillerman.rules.prices.load_prices`` with the config's overrides)."""

    def __init__(self, prices: Any) -> None:
        self.prices = prices

    @classmethod
    def for_ruleset(cls, ruleset: RuleSet) -> UsageReport:
        """With the rule set's price table, or the one in force with its overrides when
        no budget needed one. Raises ``PriceFileError`` for a spoiled imported table."""
        return cls(prices_in_force(ruleset))

    def crossings(self, thread_id: str, figures: UsageFigures, marks: dict[str, str],
                  now: float) -> Iterator[tuple[str, str, dict]]:
        """(subject, step, facts) of each new crossing; ``marks`` (kept with the
        notices' fold) remembers what was reported, so each is reported once."""
        today = dt.datetime.fromtimestamp(now, dt.timezone.utc).date().isoformat()
        cost = crossing(_COST, figures, self.prices)
        # a day already over (an old ledger read at start) is not news any more
        if cost is not None and cost.instance == today and marks.get(f"{thread_id}:cost") != cost.instance:
            marks[f"{thread_id}:cost"] = cost.instance
            yield f"usage:{thread_id}:cost_usd:{cost.instance}", "cost_usd", {
                "measure": "cost_usd", "figure": round(cost.figure, 6), "limit": DAILY_COST_USD, "day": cost.instance,
                "price_date": cost.price_date, "unpriced": ",".join(cost.unpriced) or None, "usage_seq": figures.seq}
        context = crossing(_CONTEXT, figures, self.prices)
        key = f"{thread_id}:context"
        if context is None:
            marks.pop(key, None)  # under again (a compaction): the next crossing is news
        elif marks.get(key) != _OVER:
            marks[key] = _OVER
            yield f"usage:{thread_id}:context:{figures.seq}", "context", {
                "measure": "context", "figure": round(context.figure, 4), "limit": CONTEXT_SHARE,
                "last_input": figures.last_input, "context_window": self.window(figures), "usage_seq": figures.seq}

    def window(self, figures: UsageFigures) -> int | None:
        return figures.context_window or (self.prices.context_window(figures.model) if self.prices else None)

    def settled(self, thread_id: str, facts: dict, projection: Projection) -> str | None:
        """How a usage subject settled: its day ended, or the context went under the
        share again; None while it stands."""
        thread = projection.threads.get(thread_id)
        figures = thread.usage if thread is not None else None
        if figures is None:
            return "usage_unknown"
        if facts.get("measure") == "cost_usd":
            return None if figures.day is not None and figures.day.instance == facts.get("day") else "day_ended"
        return None if crossing(_CONTEXT, figures, self.prices) is not None else "context_below"


def describe(thread_id: str, facts: dict) -> str:
    """The one log line of a crossing, for a daemon without a sink taking usage notices."""
    if facts["measure"] == "cost_usd":
        return (f"usage: thread {thread_id} spent ${facts['figure']:.2f} on {facts['day']} (UTC), over"
                f" ${facts['limit']:g} a day ([defaults] usage_report = false turns this off)")
    return (f"usage: thread {thread_id}'s last response filled {facts['figure']:.0%} of its context window"
            f" ({facts['last_input']} of {facts['context_window']} tokens; [defaults] usage_report = false turns"
            " this off)")


def prices_in_force(ruleset: RuleSet) -> PriceTable:
    """The rule set's price table, or the one in force with its overrides when no budget
    needed one: what the daemon prices usage with. Raises ``PriceFileError`` for a spoiled
    imported table."""
    return ruleset.prices if ruleset.prices is not None else load_prices(ruleset.price_overrides)
