"""Times and durations as people type and read them: ISO-8601 UTC and ``90s``/``5m``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``5m``, ``2h``, ``1d`` (or ``250ms``) -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration; write it like 90s, 5m, 2h or 1d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


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
    """An ISO-8601 time (``Z`` or an offset; naive means UTC) -> epoch seconds."""
    try:
        dt = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 time; write it like 2026-11-30T12:00:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
