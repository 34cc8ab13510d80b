"""Live scale: one daemon supervising many busy threads at once.

The real ``tillerman run`` process (dispatching for real, not a dry run) attached to a
fake app-server (``fixtures.fake_appserver``: the real one cannot run hundreds of model
turns here) whose N threads each send 50 notifications a second, for N = 10, 50 and
200, while another process (``bench.scale_proposer``) proposes a steer every 0.1–0.3 s.
Each size runs on a fresh ledger; once the daemon has subscribed every thread and a
warm-up has passed, a window of ``WINDOW`` seconds is measured:

* **notification → decision** (budget at 200 threads: p99 ≤ 10 ms): from the moment the
  server sent a notification to the commit of the decision it caused, over two kinds
  of cause: the ``turn/started`` of the turn a steer was waiting for (its decision
  moves from "turn not active" to "steer"; counted only when the steer was not already
  the first decision) and the echo of a steer the daemon sent (the decision that
  settles the acknowledged intent). Send times come from the server's log, commit
  times are the decisions' ``observed_at``; one clock, the same machine.
* **notification → recorded**: every ``turn/started`` from the server's send to the
  commit of its ledger row (how far behind the daemon's reading runs).
* **intent pickup**: from the proposer's commit returning to the daemon's first
  decision for the intent (as in ``bench_live``).
* **daemon CPU** (budget at 200 threads: ≤ 1 core): utime + stime of the daemon
  process over the window (``/proc/PID/stat``), and its peak RSS (``VmHWM``).

The notification rate the server actually achieved is reported with each size: the
fake server has no flow control, so a daemon that reads slowly slows the flood.

The server's threads are staggered across a turn, as independent sessions are (their
turns start at any moment). The largest size is run once more with every thread in
lockstep (``--lockstep``: all N turns start within one interval, every turn), and
reported beside the budget row, not against it: it is the worst burst the load can
make, about 4N facts at once every 44/R seconds, not what N sessions do.

``TILLERMAN_BENCH_PROFILE=DIR`` runs each daemon under ``python -m cProfile`` and leaves
``DIR/daemon-N.prof`` (the figures of such a run are not for quoting).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import FAIL, INFO, PASS, Row, main, percentile, scratch_dir
from fixtures.fake_appserver import TURN_NOTIFICATIONS
from tillerman.ledger import events as ev

RATE = 50.0  # notifications per second per thread
DECISION_BUDGET_MS = 10.0
CPU_BUDGET_CORES = 1.0
FULL_SIZES, QUICK_SIZES = (10, 50, 200), (2, 4)
WINDOW, QUICK_WINDOW = 20.0, 1.5
WARMUP, QUICK_WARMUP = 3.0, 0.5  # seconds after the last subscription before the window opens
PROFILE_ENV = "TILLERMAN_BENCH_PROFILE"
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class SizeResult:
    threads: int
    decision_ms: list[float]  # notification → decision, every cause
    turn_start_ms: list[float]  # of which turn/started → steer decision
    echo_ms: list[float]  # of which steer echo → settling decision
    recorded_ms: list[float]  # turn/started → its row committed
    pickup_ms: list[float]
    cpu_cores: float
    peak_rss_mb: float
    achieved_rate: float  # notifications per second per thread, during the window
    intents: int

    def p99(self, samples: list[float]) -> float:
        return percentile(samples, 99) if samples else float("nan")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _lines(proc: subprocess.Popen) -> queue.Queue:
    """The child's stdout lines as they come (None at its end), read by a thread: a
    blocking read cannot wait with a timeout."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for_line(lines: queue.Queue, expected: str, timeout: float) -> None:
    """Wait for the fake server to say ``expected``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"no {expected!r} from the fake app-server within {timeout:.0f}s") from None
        if line is None:
            raise RuntimeError(f"the fake app-server exited before saying {expected!r}")
        if line == expected:
            return


def _stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run_size(threads: int, window: float, warmup: float, work: Path, *, lockstep: bool = False) -> SizeResult:
    sock_dir = Path(tempfile.mkdtemp(prefix="tlscale-"))  # short: a socket path has ~100 bytes at most
    socket, ledger, log = sock_dir / "s.sock", work / "ledger.sqlite3", work / "fake.json"
    env = dict(os.environ, XDG_CONFIG_HOME=str(work / "config"), XDG_STATE_HOME=str(work / "state"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TILLERMAN_LEDGER", None)
    fake = subprocess.Popen([sys.executable, "-m", "fixtures.fake_appserver", "--socket", str(socket),
                             "--threads", str(threads), "--rate", str(RATE), "--log", str(log)]
                            + (["--lockstep"] if lockstep else []),
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    said = _lines(fake)
    profile = os.environ.get(PROFILE_ENV)
    runner = [sys.executable] + (["-m", "cProfile", "-o", str(Path(profile) / f"daemon-{threads}.prof")]
                                 if profile else [])
    # Everything starts at once: the daemon retries until the socket is there, and the
    # proposer connects, then waits for "go".
    with open(work / "daemon.log", "w") as daemon_log:
        daemon = subprocess.Popen(runner + ["-m", "tillerman", "run", "--codex", f"unix://{socket}",
                                            "--ledger", str(ledger)],
                                  cwd=ROOT, env=env, stdout=daemon_log, stderr=subprocess.STDOUT)
    proposer = subprocess.Popen([sys.executable, "-m", "bench.scale_proposer", str(ledger), str(socket),
                                 str(window), "11"], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        _wait_for_line(said, "listening", 30)
        _wait_for_line(said, f"subscribed {threads}", 120)
        time.sleep(warmup)
        start, cpu_start = time.time(), _cpu_seconds(daemon.pid)
        proposed_lines, _ = proposer.communicate("go\n", timeout=window + 60)
        end, cpu_end = time.time(), _cpu_seconds(daemon.pid)
        if proposer.returncode != 0:
            raise RuntimeError(f"the proposer failed (exit {proposer.returncode})")
        time.sleep(warmup)  # the last decisions
        peak_rss = _peak_rss_mb(daemon.pid)
    finally:
        for proc in (proposer, daemon, fake):
            if proc is not None:
                _stop(proc)
        shutil.rmtree(sock_dir, ignore_errors=True)
    if daemon.returncode not in (0, -signal.SIGTERM):
        raise RuntimeError(f"the daemon exited {daemon.returncode}: {(work / 'daemon.log').read_text()[-300:]}")
    sent = json.loads(log.read_text())
    proposed = [json.loads(line) for line in proposed_lines.splitlines()]
    return _measure(threads, proposed, sent, ledger, (start, end), (cpu_end - cpu_start) / (end - start), peak_rss)


def _measure(threads: int, proposed: list[dict], sent: dict, ledger: Path, window: tuple[float, float],
             cores: float, peak_rss: float) -> SizeResult:
    from tillerman.ledger.sqlite import SQLiteRecorder

    start, end = window
    turn_sent, echo_sent = sent["turn_started_at"], sent["echo_sent_at"]
    decisions: dict[str, list[tuple[str, float]]] = {}
    acknowledged: set[str] = set()
    recorded = []
    with SQLiteRecorder(ledger) as rec:
        for entry in rec.read():
            event, at = entry.envelope.event, entry.envelope.observed_at
            if isinstance(event, ev.DecisionRecorded):
                decisions.setdefault(event.intent_id, []).append((event.action, at))
            elif isinstance(event, ev.IntentTransition) and event.to_state == "acknowledged":
                acknowledged.add(event.intent_id)
            elif isinstance(event, ev.TurnStarted) and start <= turn_sent.get(event.turn_id, 0) <= end:
                recorded.append((at - turn_sent[event.turn_id]) * 1000)
    pickup, turn_start, echo = [], [], []
    for intent in proposed:
        made = decisions.get(intent["intent"], [])
        if not made:
            continue  # never picked up while the daemon ran: counted in ``intents`` - len(pickup)
        pickup.append((made[0][1] - intent["at"]) * 1000)
        steer_at = next((at for i, (action, at) in enumerate(made) if action == "steer" and i > 0), None)
        if intent["kind"] == "next" and steer_at is not None and intent["turn"] in turn_sent:
            turn_start.append((steer_at - turn_sent[intent["turn"]]) * 1000)
        echoed = echo_sent.get(intent["client_id"])
        if intent["intent"] in acknowledged and echoed is not None:
            after = [at for _, at in made if at >= echoed]
            if after:
                echo.append((after[0] - echoed) * 1000)
    turns_in_window = sum(1 for at in turn_sent.values() if start <= at <= end)
    return SizeResult(threads, turn_start + echo, turn_start, echo, recorded, pickup, cores, peak_rss,
                      turns_in_window * TURN_NOTIFICATIONS / (end - start) / threads, len(proposed))


def _in_scratch(threads: int, window: float, warmup: float, *, lockstep: bool = False) -> SizeResult:
    work = Path(tempfile.mkdtemp(prefix=f"scale-{threads}-", dir=scratch_dir()))
    try:
        return _run_size(threads, window, warmup, work, lockstep=lockstep)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _growth(results: list[SizeResult], what: str, value, unit: str, fmt: str = ".1f") -> Row:
    sizes = "→".join(str(r.threads) for r in results)
    values = [value(r) for r in results]
    ratio = values[-1] / values[0] if values[0] else None
    return Row(f"scale {sizes} threads × {RATE:g} ev/s: {what}", "→".join(f"{v:{fmt}}" for v in values) + f" {unit}",
               "", ratio, "report", INFO, {"threads": [r.threads for r in results], "values": values})


def run(quick: bool) -> list[Row]:
    sizes, window, warmup = (QUICK_SIZES, QUICK_WINDOW, QUICK_WARMUP) if quick else (FULL_SIZES, WINDOW, WARMUP)
    results = [_in_scratch(threads, window, warmup) for threads in sizes]
    lockstep = _in_scratch(sizes[-1], window, warmup, lockstep=True)
    top = results[-1]
    rows = []
    p = {q: percentile(top.decision_ms, q) if top.decision_ms else float("nan") for q in (50, 99)}
    decided = f"p99 {p[99]:.1f} ms, p50 {p[50]:.1f} ms" if top.decision_ms else "no decision caused in the window"
    rows.append(Row(f"scale {top.threads} threads × {RATE:g} ev/s: notification → decision",
                    f"{decided} ({len(top.decision_ms)} decisions, {len(top.pickup_ms)}/{top.intents} intents"
                    f" picked up; {top.achieved_rate:.0f} ev/s/thread sent)",
                    f"turn start p99 {top.p99(top.turn_start_ms):.1f}, echo p99 {top.p99(top.echo_ms):.1f} ms",
                    None, f"p99 ≤ {DECISION_BUDGET_MS:g} ms", PASS if p[99] <= DECISION_BUDGET_MS else FAIL,
                    {"p50_ms": p[50], "p99_ms": p[99], "samples": len(top.decision_ms),
                     "turn_start_p99_ms": top.p99(top.turn_start_ms), "echo_p99_ms": top.p99(top.echo_ms),
                     "achieved_rate": top.achieved_rate, "intents": top.intents, "picked_up": len(top.pickup_ms)}))
    rows.append(Row(f"scale {top.threads} threads × {RATE:g} ev/s: daemon CPU",
                    f"{top.cpu_cores:.2f} core over {window:g} s", "", None, f"≤ {CPU_BUDGET_CORES:g} core",
                    PASS if top.cpu_cores <= CPU_BUDGET_CORES else FAIL, {"cores": top.cpu_cores}))
    rows.append(Row(f"scale {lockstep.threads} threads × {RATE:g} ev/s in lockstep: notification → decision",
                    f"p99 {lockstep.p99(lockstep.decision_ms):.1f} ms, p50 {percentile(lockstep.decision_ms, 50):.1f} ms"
                    f" ({len(lockstep.decision_ms)} decisions; every turn starts at once)"
                    if lockstep.decision_ms else "no decision caused in the window",
                    f"staggered p99 {p[99]:.1f} ms", None, "report", INFO,
                    {"p99_ms": lockstep.p99(lockstep.decision_ms), "cores": lockstep.cpu_cores,
                     "samples": len(lockstep.decision_ms)}))
    rows.append(_growth(results, "notification → decision p99", lambda r: r.p99(r.decision_ms), "ms"))
    rows.append(_growth(results, "notification → recorded p99", lambda r: r.p99(r.recorded_ms), "ms"))
    rows.append(_growth(results, "intent pickup p99", lambda r: r.p99(r.pickup_ms), "ms"))
    rows.append(_growth(results, "daemon CPU", lambda r: r.cpu_cores, "core", ".2f"))
    rows.append(_growth(results, "daemon peak RSS", lambda r: r.peak_rss_mb, "MiB", ".0f"))
    rows.append(_growth(results, "notifications sent per thread", lambda r: r.achieved_rate, "ev/s", ".0f"))
    return rows


if __name__ == "__main__":
    main(run)
