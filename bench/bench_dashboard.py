"""The dashboard's live updates: ledger commit → server-sent event, at fleet load.

200 active threads × 50 events/s, read as 50 app-server notifications a second *per
thread* (10,000/s in all), the harder of the two readings and the one ``bench_scale``
holds the daemon to; the tap turns them into about 3,000 ledger rows a second (of the
44 notifications of the fake app-server's turn script, the facts: turns, items, status
changes, token usage; deltas are dropped).

* **The writer** (a process of its own): the fake app-server's turn scripts
  (``fixtures.fake_appserver``, its threads staggered across a turn) played at that
  rate through the daemon's tap (``AppServerTap.receive``) and appended to a SQLite
  ledger as the daemon appends its rounds: one transaction per 5 ms tick of
  notifications. The recorder is driven directly, not the daemon following the fake
  server over its socket, because the latency starts at the commit: the writer takes
  the time right after ``append`` returns, beside the batch's last seq, and no daemon
  reports that.
* **The dashboard** (``tillerman dashboard --ledger L --port 0``, its own process),
  logged in with the token URL it prints.
* **The SSE client** (this process, a thread): connected to ``/events``; each message's
  ``id`` is the last seq the server folded, taken with the time it arrived.

Measured at the event stream, not in a browser (the page then fetches the fragments
that changed: a browser's own time, not the server's): for every commit in the window,
the first message whose seq reaches the commit's last seq, minus the commit time (one
clock: the same machine). Budget p99 ≤ 250 ms; the server coalesces messages every
``live.COALESCE`` seconds, which is part of the figure. The dashboard's CPU is its
process's utime + stime over the window ÷ the window (budget ≤ 0.2 core).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.bench_scale import _cpu_seconds, _lines, _stop
from bench.common import FAIL, PASS, Row, main, percentile, scratch_dir

THREADS, QUICK_THREADS = 200, 4
RATE = 50.0  # notifications per second per thread
TICK = 0.005  # seconds of notifications per commit
WINDOW, QUICK_WINDOW = 20.0, 2.0
WARMUP, QUICK_WARMUP = 3.0, 0.5
LATENCY_BUDGET_MS = 250.0
CPU_BUDGET_CORES = 0.2
ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = (sys.executable, "-m", "tillerman", "dashboard")
_URL = re.compile(r"(http://\S+\?token=\S+)")


def write(ledger: str, threads: int, rate: float, seconds: float, out: str) -> None:
    """The writer's process: ``seconds`` of the fake server's traffic through the tap into
    ``ledger``; ``out`` gets one JSON line per commit: [last seq, commit time, rows]."""
    from fixtures.fake_appserver import FakeAppServer
    from tillerman.ledger.sqlite import SQLiteRecorder
    from tillerman.monitor.appserver_tap import AppServerTap
    from tillerman.monitor.jsonrpc import Notification

    server = FakeAppServer(threads, rate)  # only its threads' scripts: nothing listens
    tap = AppServerTap("unix:///bench.sock")
    with SQLiteRecorder(Path(ledger)) as recorder, open(out, "w") as log:
        start = time.monotonic()
        while (now := time.monotonic()) - start < seconds:
            due = (now - start) * rate  # as FakeAppServer.flood paces its threads
            batch = []
            for thread in server.threads.values():
                for _ in range(int(due - thread.delay) - thread.sent):
                    thread.sent += 1
                    method, params = next(thread.script)
                    raw = {"method": method, "params": params, "emittedAtMs": int(time.time() * 1000)}
                    batch.extend(tap.receive(Notification(method, params, raw), time.time()).envelopes)
            if batch:
                seqs = recorder.append(batch).seqs
                committed = time.time()
                if seqs:
                    log.write(json.dumps([seqs[-1], committed, len(seqs)]) + "\n")
            time.sleep(max(0.0, TICK - (time.monotonic() - now)))


class _Stream:
    """``/events`` read in a thread: (seq, arrival time) of every message."""

    def __init__(self, login: str) -> None:
        import httpx2 as httpx

        self.client = httpx.Client(timeout=httpx.Timeout(30.0, read=None))
        self.client.get(login, follow_redirects=True).raise_for_status()  # the token becomes the cookie
        self.base = login.split("?", 1)[0].rstrip("/")
        self.received: list[tuple[int, float]] = []
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        if not self.connected.wait(30):
            raise RuntimeError("no first message from /events within 30 s")

    def _read(self) -> None:
        import httpx2 as httpx

        try:
            with self.client.stream("GET", f"{self.base}/events", headers={"Accept": "text/event-stream"}) as answer:
                answer.raise_for_status()
                for line in answer.iter_lines():
                    if line.startswith("id:"):
                        self.received.append((int(line[3:].strip()), time.time()))
                        self.connected.set()
        except httpx.HTTPError:
            pass  # closed at the end of the run

    def close(self) -> None:
        self.client.close()


@dataclass
class Result:
    latency_ms: list[float]
    undelivered: int  # commits in the window no message reached
    cores: float
    rows_per_s: float
    messages: int
    load: tuple[float, float]  # the 1-minute load average before the run and at the window's end


def _measure(threads: int, window: float, warmup: float, work: Path) -> Result:
    from tillerman.ledger.sqlite import SQLiteRecorder

    ledger, commits = work / "ledger.sqlite3", work / "commits.jsonl"
    SQLiteRecorder(ledger).close()  # the dashboard opens an existing ledger
    env = dict(os.environ, XDG_CONFIG_HOME=str(work / "config"), XDG_STATE_HOME=str(work / "state"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TILLERMAN_LEDGER", None)
    dashboard = subprocess.Popen([*DASHBOARD, "--ledger", str(ledger), "--port", "0"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    writer = stream = None
    load_before = os.getloadavg()[0]
    try:
        said = _lines(dashboard)
        deadline = time.monotonic() + 60
        while not (found := _URL.search(said.get(timeout=max(0.1, deadline - time.monotonic())) or "")):
            if time.monotonic() > deadline or dashboard.poll() is not None:
                raise RuntimeError("tillerman dashboard never printed its URL")
        stream = _Stream(found.group(1))
        writer = subprocess.Popen([sys.executable, "-c", "import sys; from bench.bench_dashboard import write; "
                                   "write(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), "
                                   "sys.argv[5])", str(ledger), str(threads), str(RATE),
                                   str(warmup + window + warmup), str(commits)], cwd=ROOT, env=env)
        time.sleep(warmup)
        start, cpu_start = time.time(), _cpu_seconds(dashboard.pid)
        time.sleep(window)
        end, cpu_end = time.time(), _cpu_seconds(dashboard.pid)
        load = (load_before, os.getloadavg()[0])
        if writer.wait(timeout=warmup + 60) != 0:
            raise RuntimeError(f"the writer failed (exit {writer.returncode})")
        time.sleep(1.0)  # the last messages
    finally:
        for proc in (writer, dashboard):
            if proc is not None:
                _stop(proc)
        if stream is not None:
            stream.close()
    made = [json.loads(line) for line in commits.read_text().splitlines()]
    in_window = [(seq, at) for seq, at, _ in made if start <= at <= end]
    received = sorted(stream.received)
    latency, undelivered, i = [], 0, 0
    for seq, at in sorted(in_window):  # seqs and arrivals both grow: one pass
        while i < len(received) and received[i][0] < seq:
            i += 1
        if i == len(received):
            undelivered += 1
        else:
            latency.append((received[i][1] - at) * 1000)
    rows = sum(n for _, at, n in made if start <= at <= end)
    return Result(latency, undelivered, (cpu_end - cpu_start) / (end - start), rows / (end - start),
                  sum(1 for _, at in received if start <= at <= end), load)


def run(quick: bool) -> list[Row]:
    threads, window, warmup = (QUICK_THREADS, QUICK_WINDOW, QUICK_WARMUP) if quick else (THREADS, WINDOW, WARMUP)
    work = Path(tempfile.mkdtemp(prefix="dashboard-", dir=scratch_dir()))
    try:
        result = _measure(threads, window, warmup, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = "→".join(f"{x:.1f}" for x in result.load)
    name = f"dashboard {threads} threads × {RATE:g} ev/s: commit → SSE message"
    if not result.latency_ms:
        return [Row(name, f"no message reached a commit ({result.undelivered} commits)", budget=f"p99 ≤ "
                    f"{LATENCY_BUDGET_MS:g} ms", verdict=FAIL,
                    detail={"commits": 0, "undelivered": result.undelivered})]
    p = {q: percentile(result.latency_ms, q) for q in (50, 99)}
    ok = p[99] <= LATENCY_BUDGET_MS and not result.undelivered
    return [
        Row(name, f"p99 {p[99]:.0f} ms, p50 {p[50]:.0f} ms ({len(result.latency_ms)} commits,"
                  f" {result.rows_per_s:.0f} rows/s, {result.messages} messages; load {load})",
            "", None, f"p99 ≤ {LATENCY_BUDGET_MS:g} ms", PASS if ok else FAIL,
            {"p50_ms": p[50], "p99_ms": p[99], "commits": len(result.latency_ms), "undelivered": result.undelivered,
             "rows_per_s": result.rows_per_s, "messages": result.messages, "load": result.load}),
        Row(f"dashboard {threads} threads × {RATE:g} ev/s: server CPU",
            f"{result.cores:.2f} core over {window:g} s", "", None, f"≤ {CPU_BUDGET_CORES:g} core",
            PASS if result.cores <= CPU_BUDGET_CORES else FAIL, {"cores": result.cores, "load": result.load}),
    ]


if __name__ == "__main__":
    main(run)
