"""Replay's memory does not grow with its input: peak RSS of a whole ``tillerman replay``
process over a directory of sessions ten times larger stays within 1.2× (a ratio of
the same measurement at two sizes, not a time)."""

from __future__ import annotations

import os
import sys

import pytest

from bench.bench_replay import measure
from bench.sessions import rollout_name, write_rollout

LINES_PER_FILE = 5_000
GROWTH_BUDGET = 1.2


def _sessions(folder, files: int) -> str:
    """``files`` rollouts of one session each, written one after another (never held)."""
    os.makedirs(folder, exist_ok=True)
    for seed in range(1, files + 1):
        write_rollout(os.path.join(folder, rollout_name(seed)), LINES_PER_FILE, seed)
    return str(folder)


def _peak_rss(folder: str, *extra: str) -> float:
    return measure([sys.executable, "-m", "tillerman.controller", "replay", "--json", *extra, folder])[1]


@pytest.mark.slow
def test_replay_of_ten_times_the_sessions_stays_flat(tmp_path):
    small = _sessions(tmp_path / "small", 20)  # 100k lines
    large = _sessions(tmp_path / "large", 200)  # 1M lines
    in_memory = _peak_rss(large) / _peak_rss(small)
    into_ledger = (_peak_rss(large, "--ledger", str(tmp_path / "large.sqlite3"))
                   / _peak_rss(small, "--ledger", str(tmp_path / "small.sqlite3")))
    assert in_memory <= GROWTH_BUDGET, f"in memory: peak RSS grew {in_memory:.2f}×"
    assert into_ledger <= GROWTH_BUDGET, f"into a ledger: peak RSS grew {into_ledger:.2f}×"
