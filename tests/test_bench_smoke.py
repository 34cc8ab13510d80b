"""``python -m bench.run --quick`` runs every benchmark on tiny inputs and prints one
table with the agreed columns. Only the shape is checked, never a time: these
machines are shared, and the figures of a quick run are not worth quoting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.run import COLUMNS, discover

ROOT = Path(__file__).resolve().parent.parent


def _codex_available() -> bool:
    from fixtures.codex_npm import CodexUnavailable, codex_under_test

    try:
        codex_under_test()
    except CodexUnavailable:
        return False
    return True


def test_quick_run_prints_one_table_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, TILLERMAN_BENCH_DIR=str(tmp_path / "scratch"))
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr  # 1: some budget missed, still a table
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [c.upper() for c in COLUMNS]

    data = json.loads(out.read_text())
    assert data["quick"] is True and data["columns"] == list(COLUMNS)
    rows = data["rows"]
    modules = {r["detail"]["module"] for r in rows}
    assert modules == set(discover())  # every benchmark present contributed rows
    for row in rows:
        assert set(COLUMNS) <= set(row)
        assert row["verdict"] in ("pass", "FAIL", "info")
        if "real app-server" in row["benchmark"] and not _codex_available():
            continue  # the pickup benchmark needs the Codex binary of the live tests
        assert not row["measured"].startswith("error"), row  # each benchmark ran to the end
        assert row["ratio"] is None or isinstance(row["ratio"], float)
    brain = next(r for r in rows if "in-process brain" in r["benchmark"])
    assert brain["detail"]["decision_samples"] > 0  # its rounds ran and decided (not a coroutine left unawaited)
    sse = next(r for r in rows if "commit → SSE message" in r["benchmark"])
    assert sse["detail"]["commits"] > 0 and sse["detail"]["undelivered"] == 0  # every commit reached the stream
    names = " ".join(r["benchmark"] for r in rows)
    for expected in ("vs raw executemany", "vs eventsourcing", "replay", "peak RSS", "notification", "picked up",
                     "commit → SSE message"):
        assert expected in names
    # one table: a data line per row, in the order of the JSON
    assert len([ln for ln in lines[1:] if ln.strip() and not ln.startswith(tuple("0123456789"))]) == len(rows)


def test_a_failing_module_becomes_a_fail_row():
    from bench import run as bench_run

    rows, _ = bench_run.run_module("bench.no_such_benchmark", quick=True, timeout=60)
    assert rows[0]["verdict"] == "FAIL" and rows[0]["measured"].startswith("error")
