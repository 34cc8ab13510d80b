"""Times as people type and read them: ISO-8601 UTC.

Every time a person hands tillerman passes through the checks here before anything is
written, as every duration passes through ``tillerman.rules.durations``: a value is
finite and in range, so each deadline an intent records can be stored, read back and
printed (an infinite deadline is stored as JSON ``null`` and no longer decodes; a far
one has no calendar date to print).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from tillerman.rules.durations import MAX_DURATION

#: Times tillerman records and prints: the years 1970 to 9998, so that a time plus the
#: longest duration still has a calendar date.
MIN_TIME = 0.0
MAX_TIME = datetime(9999, 1, 1, tzinfo=UTC).timestamp() - MAX_DURATION


def shorten(text: str, limit: int = 40) -> str:
    """A value quoted back to a person, cut to a readable length."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_time(ts: float, name: str = "time") -> float:
    """``ts`` (epoch seconds) unless it is not finite or outside 1970 to 9998."""
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts):
        raise ValueError(f"{name} {ts!r} is not a finite time")
    if not MIN_TIME <= ts <= MAX_TIME:
        raise ValueError(f"{name} {ts!r} is outside the years 1970 to 9998")
    return float(ts)


def iso(ts: float | None) -> str | None:
    """Epoch seconds -> ``2026-11-30T12:00:00Z`` (milliseconds when present)."""
    if ts is None:
        return None
    dt = datetime.fromtimestamp(ts, UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if dt.microsecond:
        text += f".{dt.microsecond // 1000:03d}"
    return text + "Z"


def parse_time(text: str) -> float:
    """An ISO-8601 time (``Z`` or an offset; naive means UTC) -> epoch seconds, in the
    years ``check_time`` takes."""
    try:
        dt = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise ValueError(f"{shorten(text)!r} is not an ISO-8601 time; write it like 2026-11-30T12:00:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        return check_time(dt.timestamp())
    except (ValueError, OverflowError):
        raise ValueError(f"{shorten(text)!r} is outside the years 1970 to 9998; give a time in that range") from None
