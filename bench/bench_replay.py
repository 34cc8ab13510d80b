"""Replay, whole process: ``tillerman replay`` of a large synthetic Codex rollout
(``bench.sessions``) against the floor (``bench.floor``: read the same file, decode
every line with one reused ``msgspec.json.Decoder()``, nothing else).

Four processes, alternated and repeated: the floor, parsing alone (``bench.parse_only``:
the same file turned into events by its parser, no projection, rules or ledger),
``tillerman replay`` in memory, and ``tillerman replay --ledger`` into a fresh SQLite
file. Each figure is the ratio of median wall times (process start to exit,
interpreter start-up included for all). Budgets: in memory ≤ 3×, into a ledger ≤ 5×
the floor; parsing alone is reported, the share of replay's time it takes.

Parallel replay: ``--jobs 2`` against ``--jobs 1`` on 20 generated rollouts (20 thread
families), alternated, the ratio of median wall times in the same run (budget ≥ 1.6×:
two workers, with pool start-up and the merge, on a 2-core machine).

Memory: peak RSS of each replay process (``wait4``'s ``ru_maxrss``) at two session
lengths, 100k and 1M lines; streaming means it must not grow with the file (budget
≤ 1.2× from the short to the long one, in memory and into a ledger). In memory the
ledger keeps its chain head and a compact id table (``tillerman.ledger.chain_only``),
not its rows.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from bench.common import INFO, Row, at_least, at_most, fmt_seconds, main, scratch_dir
from bench.sessions import rollout_name, write_rollout

MEMORY_BUDGET = 1.2
IN_MEMORY_BUDGET = 3.0
LEDGER_BUDGET = 5.0
JOBS_BUDGET = 1.6
JOBS_FILES = 20
GENERATOR_VERSION = 1


def rollout(lines: int, seed: int) -> str:
    """The synthetic rollout of about ``lines`` lines, generated once and kept."""
    folder = os.path.join(scratch_dir(), f"rollouts-v{GENERATOR_VERSION}-{lines}-{seed}")
    path = os.path.join(folder, rollout_name(seed))
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        tmp = path + ".part"
        write_rollout(tmp, lines, seed)
        os.replace(tmp, path)
    return path


def rollouts(count: int, lines: int) -> str:
    """A folder of ``count`` synthetic rollouts (one thread each), generated once and kept."""
    folder = os.path.join(scratch_dir(), f"rollouts-v{GENERATOR_VERSION}-{count}x{lines}")
    for seed in range(1, count + 1):
        path = os.path.join(folder, rollout_name(seed))
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            write_rollout(path + ".part", lines, seed)
            os.replace(path + ".part", path)
    return folder


def measure(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:5])} … exited {proc.returncode}: {err.strip()[-300:]}")
    return elapsed, usage.ru_maxrss / 1024


def commands(path: str, ledger: str) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "floor": [py, "-m", "bench.floor", path],
        "parse": [py, "-m", "bench.parse_only", path],
        "memory": [py, "-m", "tillerman.controller", "replay", "--json", path],
        "ledger": [py, "-m", "tillerman.controller", "replay", "--json", "--ledger", ledger, path],
    }


def _remove_ledger(ledger: str) -> None:
    for suffix in ("", "-wal", "-shm", ".head"):
        if os.path.exists(ledger + suffix):
            os.unlink(ledger + suffix)


def run_alternated(path: str, repeats: int) -> dict[str, list[tuple[float, float]]]:
    ledger = os.path.join(os.path.dirname(path), "replay-bench.sqlite3")
    cmds = commands(path, ledger)
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    for _ in range(repeats):
        for name, argv in cmds.items():
            _remove_ledger(ledger)
            out[name].append(measure(argv))
    _remove_ledger(ledger)
    return out


def run(quick: bool) -> list[Row]:
    long_lines = 6_000 if quick else 1_000_000
    short_lines = long_lines // 10
    repeats = 2 if quick else 3  # a median of three: the floor alone has read 1.56 and 2.49 s in one run
    path = rollout(long_lines, seed=1)
    short_path = rollout(short_lines, seed=2)
    size_mb = os.path.getsize(path) / 2**20
    with open(path, "rb") as fh:
        lines = sum(1 for _ in fh)

    measure(commands(path, "/dev/null")["floor"])  # warm the page cache and the imports
    runs = run_alternated(path, repeats)
    short = run_alternated(short_path, 1)

    wall = {k: [t for t, _ in v] for k, v in runs.items()}
    med = {k: statistics.median(v) for k, v in wall.items()}
    rss_long = {k: max(r for _, r in v) for k, v in runs.items()}
    rss_short = {k: max(r for _, r in v) for k, v in short.items()}
    events = _events(path)
    detail = {"lines": lines, "bytes": os.path.getsize(path), "events": events, "repeats": repeats,
              "seconds": wall, "peak_rss_mib": rss_long, "short_lines": short_lines,
              "short_peak_rss_mib": rss_short}
    rows = [Row(f"parse only {lines // 1000}k lines (file → events)", fmt_seconds(wall["parse"]),
                f"floor {fmt_seconds(wall['floor'])}", med["parse"] / med["floor"], "report", INFO, detail)]
    for mode, budget, label in (("memory", IN_MEMORY_BUDGET, "in memory"), ("ledger", LEDGER_BUDGET, "into a ledger")):
        ratio = med[mode] / med["floor"]
        rate = f"{events / med[mode] / 1000:.0f}k ev/s, {size_mb / med[mode]:.1f} MB/s"
        rows.append(Row(f"replay {lines // 1000}k lines {label}", f"{fmt_seconds(wall[mode])} ({rate})",
                        f"floor {fmt_seconds(wall['floor'])}", ratio, f"≤ {budget:g}×", at_most(ratio, budget),
                        detail))
    for mode, label in (("ledger", "into a ledger"), ("memory", "in memory")):
        growth = rss_long[mode] / rss_short[mode]
        rows.append(Row(f"replay peak RSS {short_lines // 1000}k→{lines // 1000}k lines, {label}",
                        f"{rss_short[mode]:.0f}→{rss_long[mode]:.0f} MiB",
                        f"floor {rss_long['floor']:.0f} MiB", growth, f"≤ {MEMORY_BUDGET}× growth",
                        at_most(growth, MEMORY_BUDGET), detail))
    rows.append(jobs_row(quick))
    return rows


def jobs_row(quick: bool) -> Row:
    """``--jobs 2`` vs ``--jobs 1`` on the same files, alternated, repeated."""
    folder = rollouts(JOBS_FILES, 1_000 if quick else 8_000)
    argv = {jobs: [sys.executable, "-m", "tillerman.controller", "replay", "--json", "--jobs", jobs, folder]
            for jobs in ("1", "2")}
    measure(argv["1"])  # warm the page cache
    wall: dict[str, list[float]] = {"1": [], "2": []}
    for _ in range(2 if quick else 7):  # about 1-2 s each, ±10% between runs: a median of seven
        for jobs, command in argv.items():
            wall[jobs].append(measure(command)[0])
    ratio = statistics.median(wall["1"]) / statistics.median(wall["2"])
    size_mb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 2**20
    return Row(f"replay {JOBS_FILES} files ({size_mb:.0f} MB), --jobs 2 vs --jobs 1", f"--jobs 2 {fmt_seconds(wall['2'])}",
               f"--jobs 1 {fmt_seconds(wall['1'])}", ratio, f"≥ {JOBS_BUDGET}×", at_least(ratio, JOBS_BUDGET),
               {"files": JOBS_FILES, "bytes": round(size_mb * 2**20), "seconds": wall, "cpus": os.cpu_count(),
                "load": os.getloadavg()})


def _events(path: str) -> int:
    """Events replay records from the file (from one in-memory run's summary)."""
    import json

    out = subprocess.run([sys.executable, "-m", "tillerman.controller", "replay", "--json", path],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["events"]


if __name__ == "__main__":
    main(run)
