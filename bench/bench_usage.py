"""``tillerman usage`` against ccusage on the same generated sessions, whole processes.

Both read one folder written by ``fixtures.usage_sessions`` (Claude Code transcripts and
Codex rollouts, seeded): ``tillerman usage --json --by session`` over its ``projects``
and ``sessions`` folders, against ``ccusage claude session --json --offline`` followed
by ``ccusage codex session --json --offline`` (ccusage reads one agent a command), the
pinned release of the parity tests (``fixtures.ccusage_npm``). Each side is timed from
the process's start to its exit, as a person waits for it, alternated with the other.

Rows: the 100 MB folder against the issue's budget (≤ 3× ccusage's time), and a 1 GB
folder reported with its MB/s. ``--quick`` writes a few MB and runs each once.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import INFO, Row, alternate, at_most, fmt_seconds, main, scratch_dir

BUDGET = 3.0
MB = 1 << 20
#: (label, bytes, repeats) of each row, full and quick.
SIZES = {False: (("100 MB", 100 * MB, 5), ("1 GB", 1024 * MB, 3)),
         True: (("2 MB", 2 * MB, 1), ("4 MB", 4 * MB, 1))}


def run(quick: bool) -> list[Row]:
    from fixtures.ccusage_npm import CcusageUnavailable, ccusage_under_test

    try:
        ccusage = ccusage_under_test()
    except CcusageUnavailable as reason:
        return [Row(f"tillerman usage vs ccusage ({label} generated)", f"skipped: {reason}", budget="≤ 3×")
                for label, _, _ in SIZES[quick]]
    budgeted, reported = SIZES[quick]
    return [_row(ccusage, *budgeted, quick=quick, budget=True), _row(ccusage, *reported, quick=quick, budget=False)]


def _row(ccusage: Path, label: str, size: int, repeats: int, *, quick: bool, budget: bool) -> Row:
    folder = generated(size)
    mb = _folder_bytes(folder) / MB
    times = alternate({"tillerman": lambda: _tillerman(folder), "ccusage": lambda: _ccusage(ccusage, folder)},
                      repeats=repeats, warmup=0 if quick else 1)
    ours, theirs = statistics.median(times["tillerman"]), statistics.median(times["ccusage"])
    ratio = ours / theirs
    detail = {"folder_mb": round(mb, 1), "tillerman_s": times["tillerman"], "ccusage_s": times["ccusage"],
              "tillerman_mb_s": round(mb / ours, 1), "ccusage_mb_s": round(mb / theirs, 1),
              "load_average": os.getloadavg()}
    return Row(f"tillerman usage --json vs ccusage session, generated {label} folder",
               f"{fmt_seconds(times['tillerman'])} ({mb / ours:.0f} MB/s)",
               f"ccusage {fmt_seconds(times['ccusage'])} ({mb / theirs:.0f} MB/s)", ratio,
               f"≤ {BUDGET:g}×" if budget else "report", at_most(ratio, BUDGET) if budget else INFO, detail)


def generated(size: int) -> Path:
    """The folder of ``size`` bytes, written once and kept in the scratch directory (the
    generator is deterministic: the same seed and size, the same bytes)."""
    from fixtures.usage_sessions import generate

    folder = Path(scratch_dir()) / f"usage-sessions-{size}"
    done = folder / "complete"
    if not done.exists():
        generate(folder, seed=35, size=size)
        done.touch()
    return folder


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.jsonl"))


def _tillerman(folder: Path) -> float:
    tillerman = Path(sys.executable).with_name("tillerman")  # the installed command, as a person runs it
    command = [str(tillerman)] if tillerman.exists() else [sys.executable, "-m", "tillerman.controller"]
    return _timed_process([*command, "usage", "--json", "--by", "session",
                           str(folder / "claude" / "projects"), str(folder / "codex" / "sessions")], {})


def _ccusage(ccusage: Path, folder: Path) -> float:
    env = {"CLAUDE_CONFIG_DIR": str(folder / "claude"), "CODEX_HOME": str(folder / "codex"), "HOME": str(folder)}
    return sum(_timed_process([str(ccusage), agent, "session", "--json", "--offline"], env)
               for agent in ("claude", "codex"))


def _timed_process(command: list[str], env: dict[str, str]) -> float:
    """Seconds from start to exit; the output is read (as a pipe into a tool would) and
    thrown away. A failed run is an error, not a time."""
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env},
                          check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} exited {done.returncode}: {done.stderr.decode()[-200:]}")
    return elapsed


if __name__ == "__main__":
    main(run)
