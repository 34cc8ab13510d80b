"""Idle CPU of ``tillerman run --watch`` following 1,000 quiet files (budget < 1% of a core).

1,000 small Codex rollouts under dated folders; the real daemon in its own process
reads them all, then nothing changes. After the catch-up has settled, the daemon's
CPU time (user + system, ``/proc/PID/stat``) is sampled over ``--seconds`` (default
20) and printed as a percentage of one core. Everything the idle daemon does counts:
the watcher's wake-ups, the periodic rescan (a stat per file), the brain's ledger
poll, the heartbeat and the rule-file poll.

    python -m bench.bench_idle_cpu [--seconds 20] [--files 1000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.bench_tail_latency import THREAD, _line, _meta, cpu_seconds, daemon, wait_rows
from bench.common import FAIL, PASS, Row

BUDGET_PCT = 1.0


def measure(seconds: float, files: int, settle: float = 3.0) -> dict:
    work = Path(tempfile.mkdtemp(prefix="idle-cpu-"))
    try:
        watch, ledger = work / "sessions", work / "ledger.sqlite3"
        for n in range(files):
            day = watch / "2026" / "11" / f"{n % 30 + 1:02d}"
            day.mkdir(parents=True, exist_ok=True)
            (day / f"rollout-2026-11-30T00-00-00-{THREAD.format(n)}.jsonl").write_bytes(
                _meta(n) + b"".join(_line(i) for i in range(5)))
        proc = daemon(watch, ledger)
        try:
            start = time.monotonic()
            wait_rows(ledger, files * 6, 120)
            catch_up = time.monotonic() - start
            time.sleep(settle)
            cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(seconds)
            cpu1, wall1 = cpu_seconds(proc.pid), time.monotonic()
        finally:
            proc.terminate()
            proc.wait(timeout=15)
        return {"files": files, "seconds": wall1 - wall0, "cpu_seconds": cpu1 - cpu0,
                "cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0), "catch_up_seconds": catch_up}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(quick: bool) -> list[Row]:
    r = measure(5.0 if quick else 20.0, 300 if quick else 1000)
    return [Row(benchmark=f"idle daemon following {r['files']:,} quiet files",
                measured=f"{r['cpu_pct']:.2f}% of a core over {r['seconds']:.0f} s",
                budget=f"< {BUDGET_PCT:.0f}%", verdict=PASS if r["cpu_pct"] < BUDGET_PCT else FAIL, detail=r)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    result = measure(args.seconds, args.files)
    print(json.dumps(result, indent=2))
    print(f"idle CPU following {result['files']} files: {result['cpu_pct']:.2f}% of one core"
          f" over {result['seconds']:.0f} s (budget < {BUDGET_PCT:.0f}%); catch-up took"
          f" {result['catch_up_seconds']:.1f} s")
