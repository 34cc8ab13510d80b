"""Times and durations as people type and read them: ISO-8601 UTC and ``90s``/``5m``.

Every duration and time a person or a rule hands tillerman passes through the checks
here before anything is written: a value is finite and in range, so each deadline an
intent records can be stored, read back and printed (an infinite deadline is stored as
JSON ``null`` and no longer decodes; a far one has no calendar date to print).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
#: The longest duration tillerman takes: no intervention stays relevant for longer.
MAX_DURATION = 366 * 86400.0
#: Times tillerman records and prints: the years 1970 to 9998, so that a time plus the
#: longest duration still has a calendar date.
MIN_TIME = 0.0
MAX_TIME = datetime(9999, 1, 1, tzinfo=UTC).timestamp() - MAX_DURATION


def parse_duration(text: str) -> float:
    """``90s``, ``5m``, ``2h``, ``1d`` (or ``250ms``) -> seconds, at most ``MAX_DURATION``."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{shorten(text)!r} is not a duration; write it like 90s, 5m, 2h or 1d")
    return check_duration(float(match.group(1)) * _UNIT_SECONDS[match.group(2)], text=text)


def check_duration(seconds: float, name: str = "duration", *, text: str | None = None) -> float:
    """``seconds`` unless it is not finite, not positive or longer than ``MAX_DURATION``."""
    shown = shorten(text if text is not None else f"{seconds!r}s")
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not math.isfinite(seconds):
        raise ValueError(f"{name} {shown!r} is not a finite duration; write it like 90s, 5m, 2h or 1d")
    if seconds <= 0:
        raise ValueError(f"{name} {shown!r} is not positive; write it like 90s, 5m, 2h or 1d")
    if seconds > MAX_DURATION:
        raise ValueError(f"{name} {shown!r} is longer than {format_duration(MAX_DURATION)}; give a shorter one")
    return float(seconds)


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


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            whole, rest = divmod(seconds, size)
            return f"{whole}{unit}" if not rest or unit == "d" else f"{whole}{unit}{format_duration(rest)}"
    return f"{seconds}s"


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
