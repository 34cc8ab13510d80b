"""Durations as people write and read them: ``90s``, ``5m``, ``1.5h``, ``1h30m``, ``250ms``.

One parser for every duration tillerman is given, on the command line
(``--ack-deadline 2m``) and in rule files (``for = "10m"``), and one formatter for every
duration it prints or writes back into a rule file.

A duration is one or more parts, each a number (whole or decimal) and a unit (``d``,
``h``, ``m``, ``s``, ``ms``), largest unit first and each unit at most once, with no
spaces: ``1h30m`` is ``90m`` is ``1.5h``. It is exact to the millisecond, positive, and
at most ``MAX_DURATION`` (366 days). A bare number is refused: seconds or minutes would
be a guess. ``format_duration`` writes the same form, so what it writes reads back as
the same value.
"""

from __future__ import annotations

import math
import re

from tillerman.rules.errors import show

#: Milliseconds in each unit, largest first: the order parts are written in.
UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION = re.compile(rf"(?:{_PART.pattern})+")
#: The longest duration tillerman takes: a year, leap or not. A wait or deadline beyond it
#: is a typo, and an unbounded one would overflow the clock arithmetic it feeds.
MAX_DURATION = 366 * 86400.0
HOW = "write a number and a unit, like 90s, 5m, 1.5h, 1h30m or 250ms"


def parse_duration(value: object, *, name: str = "duration") -> float:
    """The seconds ``value`` (a string as described above) stands for; ``ValueError``
    naming ``name`` and saying how to write it otherwise."""
    parts = _parts(value) if isinstance(value, str) and _DURATION.fullmatch(value) else None
    if parts is None:
        raise ValueError(f"invalid {name} {show(value)}; {HOW}")
    return check_duration(sum(float(number) * UNIT_MS[unit] for number, unit in parts) / 1000, name, text=value)


def _parts(text: str) -> list[tuple[str, str]] | None:
    """The (number, unit) parts of ``text``, or None unless the units come largest
    first and each once."""
    parts = _PART.findall(text)
    order = [list(UNIT_MS).index(unit) for _, unit in parts]
    return parts if order == sorted(set(order)) else None


def check_duration(seconds: float, name: str = "duration", *, text: str | None = None) -> float:
    """``seconds`` to the millisecond, unless it is not finite, not positive or longer
    than ``MAX_DURATION``. ``text`` is what the person wrote, for the message."""
    shown = show(text if text is not None else f"{seconds!r}s")
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or math.isnan(seconds):
        raise ValueError(f"{name} {shown} is not a finite duration; {HOW}")
    if seconds > MAX_DURATION:  # infinity too
        raise ValueError(f"{name} {shown} is too long; at most {format_duration(MAX_DURATION)}")
    if not seconds > 0 or round(seconds * 1000) <= 0:
        raise ValueError(f"{name} {shown} is not positive (the shortest is 1ms); {HOW}")
    return round(seconds * 1000) / 1000


def format_duration(seconds: float, *, parts: int | None = None) -> str:
    """``1h30m``, ``2d``, ``250ms``: the largest units first, exact to the millisecond
    (``parse_duration`` reads it back as the same value). With ``parts``, only that many
    of the largest non-zero parts, the rest cut off: ``12m34s`` rather than
    ``12m34s250ms``, for a person reading a table or a finding."""
    left = max(0, round(seconds * 1000))
    shown = []
    for unit, size in UNIT_MS.items():
        count, left = divmod(left, size)
        if count:
            shown.append(f"{count}{unit}")
    return "".join(shown[:parts]) or "0s"
