"""File append → ledger latency of ``tillerman run --watch`` (budget p99 ≤ 200 ms).

The real daemon in its own process follows a directory of 20 Codex rollouts; this
process appends agent-message lines to them at a steady total rate (default 2,000
lines/s, one line per file per tick) for ``--seconds`` (default 60), noting when
each line was written, and polls the ledger (every 5 ms, read-only) for the event
recorded at each line's offset. Latency: the poll that first saw the row minus the
write — so it includes watchfiles' debounce, the read, the parse, the brain's
transaction (events and offsets together) and commit, plus ≤ 5 ms of polling. No
assertion on time: the figures are printed (p50, p99, max, and the daemon's CPU).

    python -m bench.bench_tail_latency [--seconds 60] [--rate 2000] [--files 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import FAIL, PASS, Row, percentile

BUDGET_MS = 200.0
ROOT = Path(__file__).resolve().parents[1]
THREAD = "01a229c4-3717-7c10-9d2e-{:012x}"


def _meta(n: int) -> bytes:
    return json.dumps({"timestamp": "2026-11-30T00:00:00Z", "type": "session_meta",
                       "payload": {"id": THREAD.format(n), "originator": "bench", "cli_version": "0.163.0"}}
                      ).encode() + b"\n"


def _line(i: int) -> bytes:
    return json.dumps({"timestamp": "2026-11-30T00:00:01Z", "type": "event_msg",
                       "payload": {"type": "agent_message", "message": f"progress {i}: reading src/module.py"}}
                      ).encode() + b"\n"


def daemon(watch: Path, ledger: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "from tillerman.controller.cli.main import main; main()", "run",
                             "--watch", str(watch), "--ledger", str(ledger)], cwd=ROOT)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_rows(ledger: Path, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ledger.exists():
            try:
                db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
                if db.execute("SELECT count(*) FROM events").fetchone()[0] >= count:
                    db.close()
                    return
                db.close()
            except sqlite3.Error:
                pass
        time.sleep(0.05)
    raise TimeoutError(f"the ledger never reached {count} rows")


def measure(seconds: float, rate: int, files: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tail-latency-"))
    try:
        watch, ledger = work / "sessions", work / "ledger.sqlite3"
        watch.mkdir()
        paths = [watch / f"rollout-2026-11-30T00-00-00-{THREAD.format(n)}.jsonl" for n in range(files)]
        for n, path in enumerate(paths):
            path.write_bytes(_meta(n))
        proc = daemon(watch, ledger)
        try:
            wait_rows(ledger, files, 30)
            written: dict[tuple[str, int], float] = {}
            sizes = {str(p): p.stat().st_size for p in paths}
            done = threading.Event()

            def writer() -> None:
                handles = [open(p, "ab", buffering=0) for p in paths]  # noqa: SIM115
                tick = files / rate
                start = time.monotonic()
                i = 0
                while (now := time.monotonic()) - start < seconds:
                    for path, fh in zip(paths, handles, strict=True):
                        line = _line(i)
                        key = (f"file:{path}", sizes[str(path)])
                        written[key] = time.monotonic()
                        fh.write(line)
                        sizes[str(path)] += len(line)
                    i += 1
                    time.sleep(max(0.0, start + i * tick - now))
                for fh in handles:
                    fh.close()
                done.set()

            cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
            thread = threading.Thread(target=writer)
            thread.start()
            seen: dict[tuple[str, int], float] = {}
            db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
            last = db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
            drain_until = None
            while True:
                rows = db.execute("SELECT seq, source, offset FROM events WHERE seq > ? ORDER BY seq",
                                  (last,)).fetchall()
                now = time.monotonic()
                for seq, source, offset in rows:
                    last = seq
                    seen.setdefault((source, offset), now)
                if done.is_set():
                    drain_until = drain_until or now + 10
                    if len(seen) >= len(written) or now > drain_until:
                        break
                time.sleep(0.005)
            cpu1, wall1 = cpu_seconds(proc.pid), time.monotonic()
            thread.join()
            db.close()
        finally:
            proc.terminate()
            proc.wait(timeout=15)
        delays = [(seen[k] - t) * 1000 for k, t in written.items() if k in seen]
        return {"lines": len(written), "recorded": len(delays), "missing": len(written) - len(delays),
                "seconds": seconds, "rate": rate, "files": files,
                "p50_ms": percentile(delays, 50), "p99_ms": percentile(delays, 99), "max_ms": max(delays),
                "daemon_cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(quick: bool) -> list[Row]:
    r = measure(5.0 if quick else 60.0, 2000, 20)
    ok = r["p99_ms"] <= BUDGET_MS and r["missing"] == 0
    return [Row(benchmark="file append → ledger (2,000 lines/s, 20 files)",
                measured=f"p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, max {r['max_ms']:.0f} ms"
                         f" ({r['recorded']} lines, {r['daemon_cpu_pct']:.0f}% CPU)",
                budget=f"p99 ≤ {BUDGET_MS:.0f} ms", verdict=PASS if ok else FAIL, detail=r)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=2000, help="lines per second, all files together")
    parser.add_argument("--files", type=int, default=20)
    args = parser.parse_args()
    result = measure(args.seconds, args.rate, args.files)
    print(json.dumps(result, indent=2))
    print(f"append → ledger: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms,"
          f" max {result['max_ms']:.1f} ms over {result['recorded']} lines ({result['missing']} missing);"
          f" budget p99 ≤ {BUDGET_MS:.0f} ms; daemon CPU {result['daemon_cpu_pct']:.0f}% of a core")
