"""Replay's memory does not grow with its input: peak RSS of a whole ``tillerman replay``
process over a 2 GB directory of generated sessions (about 550 rollouts of 5,000
lines, 2.8 million lines) stays within 1.2× of the same replay over 20 of them (100k
lines, 70 MB), in memory and into a ledger (a ratio of the same measurement at two
sizes, not a time). Each rollout is one session and its own group
(``tillerman.controller.replay.parallel``): its fold and in-memory ledger are let go
when its file ends, and into a ledger the rows stream to the file (the parent writes
the workers' rows through the ledger's load: ``parallel_replay._appender``). It writes 2 GB to
the temporary directory and replays it twice (under two minutes on 2 cores).
Within one group, what could grow is one long session's: its ids and its turns
(``test_one_long_session_stays_flat_in_memory``, on the benchmark's cached inputs)."""

from __future__ import annotations

import os
import sys

import pytest

from bench.bench_replay import measure, rollout
from bench.sessions import rollout_name, write_rollout

LINES_PER_FILE = 5_000
SMALL_FILES = 20
LARGE_BYTES = 2 * 10**9
GROWTH_BUDGET = 1.2


def _sessions(folder, *, files: int | None = None, total_bytes: int | None = None) -> str:
    """Rollouts of one session each, written one after another (never held): ``files``
    of them, or as many as make ``total_bytes``."""
    os.makedirs(folder, exist_ok=True)
    seed, written = 0, 0
    while (files is not None and seed < files) or (total_bytes is not None and written < total_bytes):
        seed += 1
        path = os.path.join(folder, rollout_name(seed))
        write_rollout(path, LINES_PER_FILE, seed)
        written += os.path.getsize(path)
    return str(folder)


def _peak_rss(path: str, *extra: str) -> float:
    return measure([sys.executable, "-m", "tillerman.controller", "replay", "--json", *extra, path])[1]


@pytest.mark.slow
def test_replay_of_a_2_gb_directory_of_sessions_stays_flat(tmp_path):
    small = _sessions(tmp_path / "small", files=SMALL_FILES)
    large = _sessions(tmp_path / "large", total_bytes=LARGE_BYTES)
    in_memory = _peak_rss(large) / _peak_rss(small)
    into_ledger = (_peak_rss(large, "--ledger", str(tmp_path / "large.sqlite3"))
                   / _peak_rss(small, "--ledger", str(tmp_path / "small.sqlite3")))
    assert in_memory <= GROWTH_BUDGET, f"in memory: peak RSS grew {in_memory:.2f}×"
    assert into_ledger <= GROWTH_BUDGET, f"into a ledger: peak RSS grew {into_ledger:.2f}×"


@pytest.mark.slow
def test_one_long_session_stays_flat_in_memory():
    """The benchmark's row: one session of 100k lines, then of 1M. Its observations keep
    no id (``ChainOnlyRecorder.append_new``) and its ended turns about 15 bytes each
    (``tillerman.ledger.projections.RECENT_TURNS``)."""
    growth = _peak_rss(rollout(1_000_000, seed=1)) / _peak_rss(rollout(100_000, seed=2))
    assert growth <= GROWTH_BUDGET, f"in memory: peak RSS grew {growth:.2f}×"
