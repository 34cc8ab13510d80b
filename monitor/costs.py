"""A vendor's cost figure, read the way token counts are (``tillerman.ledger.usage``):
checked on the way in, refused with a reason rather than read as 0.

Claude Code writes its own estimate (``total_cost_usd``, ``costUSD``, ``totalCostUSD``);
the Codex app-server answers ``account/usage/read`` with ``estimatedUsageUsdMicros``.
"""

from __future__ import annotations

from typing import Any

from tillerman.ledger.usage import UsageRefused
from tillerman.monitor.lines import WRONG_TYPE

#: No session costs this much: a larger figure is forged or corrupt.
MAX_COST_USD = 1e9


def cost_usd(value: Any, field: str) -> float | None:
    """A vendor's cost in USD: a non-negative number up to ``MAX_COST_USD``, or None
    when absent; anything else is refused (never read as 0)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageRefused(WRONG_TYPE, field, value)
    if value < 0:
        raise UsageRefused("usage_negative", field, value)
    if not value <= MAX_COST_USD:  # also NaN
        raise UsageRefused("usage_out_of_range", field, value)
    return float(value)
