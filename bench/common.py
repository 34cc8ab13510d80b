"""What every benchmark shares: a result row, timing helpers, and the verdicts.

Machines running this are shared and noisy, so no figure here is a wall-clock
assertion: each is a ratio against a baseline measured in the same run (alternated
with it, repeated, median taken) or a percentile over many samples.

A benchmark module exposes ``run(quick: bool) -> list[Row]`` (``Row`` or a plain
dict with the same keys); ``bench.run`` runs each module in a child process and
collects the rows.
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

PASS, FAIL, INFO = "pass", "FAIL", "info"


@dataclass
class Row:
    benchmark: str
    measured: str  # the measured value, with its unit and spread
    baseline: str = ""  # the baseline it is compared with ("" for a percentile budget)
    ratio: float | None = None  # measured / baseline, in the direction the budget names
    budget: str = ""  # e.g. "≥ 0.6×", "≤ 3×", "p99 ≤ 10 ms"
    verdict: str = INFO  # pass | FAIL | info (reported, no budget)
    detail: dict = field(default_factory=dict)  # raw numbers for the JSON

    def as_dict(self) -> dict:
        return asdict(self)


def at_least(ratio: float, limit: float) -> str:
    return PASS if ratio >= limit else FAIL


def at_most(ratio: float, limit: float) -> str:
    return PASS if ratio <= limit else FAIL


def spread(samples: list[float]) -> float:
    """Half the min–max range, relative to the median (a ± figure)."""
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / 2 / med if med else 0.0


def fmt_rate(samples: list[float], unit: str) -> str:
    med = statistics.median(samples)
    return f"{_si(med)} {unit} ±{spread(samples):.0%}"


def fmt_seconds(samples: list[float]) -> str:
    med = statistics.median(samples)
    return f"{med:.3g} s ±{spread(samples):.0%}"


def _si(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call takes (the collector quiet, so its pauses land between runs)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()


def alternate(contenders: dict[str, Callable[[], float]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run each contender ``repeats`` times, interleaved (A B C A B C …), after
    ``warmup`` rounds that are thrown away: drift in machine load hits every contender
    alike. A contender does its own untimed setup and returns the seconds its timed
    part took (see ``timed``)."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            times[name].append(fn())
    return times


def percentile(samples: list[float], p: float) -> float:
    """The p-th percentile (0–100), nearest-rank: a value that was really observed."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), -(-len(ordered) * p // 100)))
    return ordered[int(rank) - 1]


def peak_rss_mb() -> float:
    """This process's peak resident set size, MiB (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 1024 / 1024


def children_peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 1024 / 1024


def scratch_dir() -> str:
    """Where benchmark inputs go: $TILLERMAN_BENCH_DIR, else a cache directory (not
    the repository, not a tmpfs that would flatter the disk figures)."""
    base = os.environ.get("TILLERMAN_BENCH_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tillerman", "bench")
    os.makedirs(base, exist_ok=True)
    return base


def main(run: Callable[[bool], list[Row]]) -> None:
    """``python -m bench.bench_x [--quick]``: run one benchmark and print its rows."""
    from bench.run import print_table

    quick = "--quick" in sys.argv[1:]
    rows = [r if isinstance(r, dict) else r.as_dict() for r in run(quick)]
    print_table(rows)
