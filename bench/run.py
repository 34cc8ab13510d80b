"""``make bench``: run every ``bench/bench_*.py`` and print one table.

    python -m bench.run [--quick] [--json FILE] [--only NAME ...]

Each benchmark module runs in its own child process (so one's memory and imports
never colour another's figures, and peak RSS is per benchmark) and hands back its
rows as JSON. A module that fails is reported as a FAIL row with its error; the
others still run. The exit status is 1 when any verdict is FAIL.

``--quick`` uses small inputs (a smoke run for CI: the shape of the table, not
figures worth quoting).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tillerman.controller.cli.output import print_table as shared_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COLUMNS = ("benchmark", "measured", "baseline", "ratio", "budget", "verdict")
_CHILD = "import json, sys, importlib; m = importlib.import_module(sys.argv[1]); " \
         "rows = m.run(sys.argv[2] == 'quick'); " \
         "print('\\n@@ROWS@@' + json.dumps([r if isinstance(r, dict) else r.as_dict() for r in rows]))"


def discover(only: list[str] | None = None) -> list[str]:
    """Module names of every benchmark present, in a stable order."""
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if only:
        names = [n for n in names if any(o in n for o in only)]
    return [f"bench.{n}" for n in names]


def run_module(module: str, quick: bool, timeout: float | None) -> tuple[list[dict], float]:
    start = time.monotonic()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # Measured as installed: with PYTHONDONTWRITEBYTECODE every tillerman process would
    # compile its modules again at each start, which no installed copy does.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, module, "quick" if quick else "full"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [_failed(module, f"timed out after {timeout:.0f}s")], time.monotonic() - start
    elapsed = time.monotonic() - start
    marker = proc.stdout.rfind("@@ROWS@@")
    if proc.returncode != 0 or marker < 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return [_failed(module, f"exit {proc.returncode}: {tail[0][:200]}")], elapsed
    rows = json.loads(proc.stdout[marker + len("@@ROWS@@"):])
    for row in rows:
        row.setdefault("detail", {})["module"] = module
    return rows, elapsed


def _failed(module: str, why: str) -> dict:
    return {"benchmark": module.removeprefix("bench."), "measured": f"error: {why}", "baseline": "",
            "ratio": None, "budget": "runs", "verdict": "FAIL", "detail": {"module": module}}


def _cell(row: dict, column: str) -> str:
    value = row.get(column)
    if value is None:
        return ""
    if column == "ratio":
        return f"{value:.2f}×"
    return str(value)


def print_table(rows: list[dict]) -> None:
    shared_table([{c: _cell(r, c) for c in COLUMNS} for r in rows], COLUMNS, "no benchmarks ran")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small inputs: a smoke run, figures not for quoting")
    parser.add_argument("--json", metavar="FILE", help="also write the table (with raw numbers) as JSON")
    parser.add_argument("--only", nargs="*", help="run only benchmarks whose module name contains one of these")
    parser.add_argument("--timeout", type=float, default=None, help="seconds allowed per benchmark module")
    args = parser.parse_args(argv)

    rows: list[dict] = []
    timings: dict[str, float] = {}
    started = time.time()
    for module in discover(args.only):
        print(f"running {module}{' (quick)' if args.quick else ''} …", file=sys.stderr, flush=True)
        got, elapsed = run_module(module, args.quick, args.timeout)
        rows.extend(got)
        timings[module] = round(elapsed, 1)
    print_table(rows)
    failed = [r for r in rows if r.get("verdict") == "FAIL"]
    per_module = ", ".join(f"{m.removeprefix('bench.')} {s}s" for m, s in timings.items())
    print(f"\n{len(rows)} rows, {len(failed)} FAIL; {time.time() - started:.0f}s ({per_module})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "quick": args.quick, "started": started, "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "module_seconds": timings, "columns": list(COLUMNS), "rows": rows,
        }, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
