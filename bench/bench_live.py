"""Live latency, as percentiles over many samples.

1. **Notification → recorded decision** (budget p99 ≤ 10 ms). The daemon's brain
   driven in-process: each app-server notification goes through the tap
   (``AppServerTap.receive``) and one ``Daemon._think`` (append, fold, rules, policy,
   decisions appended), as the brain does for each inbox batch; the clock stops when
   ``_think`` returns, i.e. when every record it made is committed. The stream is
   turns of commands, failures and messages over several threads, with an intent
   proposed by "another process" every few notifications, so decisions (dispatch,
   then expiry when the turn ends) are recorded all along. Dry run: nothing is sent.
   The ledger is a file (WAL, synchronous NORMAL: decisions need no fsync of their
   own; dispatch records do, see ``bench_append``). p99 over every notification and
   over those that recorded a decision.
2. **Intent proposed by another process → picked up** (budget p99 ≤ 100 ms). The
   real daemon (``Daemon.run``, dry run) attached to the real Codex app-server
   (``fixtures.codex_server`` + ``fixtures.scripted_model``); a harness starts a thread;
   a separate process proposes intents for it (``tillerman.controller.core.intent_requests.propose``, a
   durable append) at random intervals. Latency: the daemon's decision record for the
   intent minus the moment the proposer's commit returned (one clock: the same machine).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from bench.common import FAIL, PASS, Row, main, percentile, scratch_dir
from tillerman.ledger import events as ev

DECISION_BUDGET_MS = 10.0
PICKUP_BUDGET_MS = 100.0
PICKUP_WAIT = 10.0  # seconds the last proposals may take to be picked up before they count as never
OWNER = "bench"


def _ruleset():
    from tillerman.rules.files import default_ruleset
    from tillerman.rules.ruleset import Grant, build_ruleset

    return build_ruleset(default_ruleset().rules, (Grant(subject=f"owner:{OWNER}", actions=frozenset({"steer", "queue"})),))


# -- 1. notification → decision, in process ----------------------------------------------


def _notifications(n: int, seed: int = 7):
    """(message, propose-before?) pairs: turns over 4 threads, an intent every ~8."""
    from tillerman.monitor.jsonrpc import Notification

    rnd = random.Random(seed)
    threads = [f"01a229c4-bbbb-7000-8000-{i:012x}" for i in range(4)]
    turn_no = {t: 0 for t in threads}
    phase = {t: "idle" for t in threads}
    made = 0
    while made < n:
        t = rnd.choice(threads)
        turn = f"{t}-turn-{turn_no[t]}"
        if phase[t] == "idle":
            method, params = "turn/started", {"threadId": t, "turn": {"id": turn, "status": "inProgress"}}
            phase[t] = "running"
        elif rnd.random() < 0.08:
            method, params = "turn/completed", {"threadId": t, "turn": {"id": turn, "status": "completed",
                                                                        "durationMs": rnd.randrange(10**5)}}
            phase[t] = "idle"
            turn_no[t] += 1
        else:
            item = f"item-{made}"
            kind = rnd.choice(("started", "completed", "message"))
            if kind == "message":
                method = "item/completed"
                body = {"type": "agentMessage", "id": item, "text": "working on it " * rnd.randrange(1, 20)}
            else:
                method = f"item/{kind}"
                body = {"type": "commandExecution", "id": item, "command": f"pytest -q tests/t{rnd.randrange(9)}.py",
                        "status": "completed" if kind == "completed" else "inProgress"}
                if kind == "completed":
                    body |= {"exitCode": rnd.choice((0, 0, 1)), "aggregatedOutput": "x" * rnd.randrange(2000)}
            params = {"threadId": t, "turnId": turn, "item": body}
        raw = {"jsonrpc": "2.0", "method": method, "params": params}
        propose = (t, turn) if phase[t] == "running" and method != "turn/started" and rnd.random() < 0.12 else None
        yield Notification(method, params, raw), propose
        made += 1


async def _brain_latency(n: int, ledger: Path) -> tuple[list[float], list[float]]:
    from tillerman.controller.core import intent_requests
    from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
    from tillerman.ledger import projections
    from tillerman.ledger.sqlite import SQLiteRecorder

    recorder = SQLiteRecorder(ledger)
    other = SQLiteRecorder(ledger)  # "another process": its own connection
    daemon = Daemon(recorder, _ruleset(), DaemonOptions(url="unix:///bench.sock", dry_run=True))
    daemon.projection = projections.load(recorder)
    every, with_decision = [], []
    try:
        async with anyio.create_task_group() as tg:  # what a round drives (nothing: a dry run) starts here
            for i, (message, propose) in enumerate(_notifications(n)):
                if i % 500 == 0:  # the daemon's heartbeat saves the fold, so a proposer folds only the tail
                    projections.save(recorder, daemon.projection)
                if propose is not None:
                    intent_requests.propose(other, thread_id=propose[0], expected_turn=propose[1], mode="steer",
                                    text="Stop re-running the tests; read the failure first.", owner=OWNER)
                before = daemon.projection.seq
                start = time.perf_counter()
                out = daemon.tap.receive(message, time.time())
                await daemon._think(tg, out.envelopes)  # the round, and its commit on the commit thread
                elapsed = time.perf_counter() - start
                every.append(elapsed)
                if any(isinstance(e.envelope.event, ev.DecisionRecorded) for e in recorder.read(after_seq=before)):
                    with_decision.append(elapsed)
            tg.cancel_scope.cancel()
    finally:
        recorder.close()
        other.close()
    return every, with_decision


# -- 2. intent pickup, against the real app-server ----------------------------------------------

_PROPOSER = """
import random, sys, time
from tillerman.controller.core import intent_requests
from tillerman.ledger.sqlite import SQLiteRecorder
ledger, thread, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(11)
with SQLiteRecorder(ledger) as rec:
    for i in range(n):
        time.sleep(rnd.uniform(0.02, 0.15))
        intent = intent_requests.propose(rec, thread_id=thread, mode="queue", text=f"bench note {i}: summarize progress",
                                 owner="%s")
        print(intent.id, time.time(), flush=True)  # committed (and fsynced): visible to the daemon from now
""" % OWNER


def _all_decided(recorder, intent_ids: list[str]) -> bool:
    decided = {entry.envelope.event.intent_id for entry in recorder.read()
               if isinstance(entry.envelope.event, ev.DecisionRecorded)}
    return decided.issuperset(intent_ids)


async def _pickup(n: int, workdir: Path) -> list[float]:
    from fixtures.codex_server import AppServer, make_codex_home, watched_connection
    from fixtures.scripted_model import ScriptedModel
    from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
    from tillerman.ledger.sqlite import SQLiteRecorder

    ledger = workdir / "ledger.sqlite3"
    with ScriptedModel() as model:
        # Codex wants its home outside the system temp dir (and the socket path short):
        # the fixtures' default place, removed afterwards.
        home = make_codex_home(model.base_url)
        (home / "ws").mkdir()
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(shutil.rmtree, home, True)
            server = cleanup.enter_context(AppServer(home))
            recorder = SQLiteRecorder(ledger)
            daemon = Daemon(recorder, _ruleset(), DaemonOptions(url=server.url, dry_run=True))
            async with watched_connection(server.url, client_name="bench-harness") as (harness, _log), \
                    anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                thread = (await harness.request("thread/start", {"cwd": str(home / "ws")}))["thread"]["id"]
                await harness.request("turn/start", {"threadId": thread, "input": [{"type": "text", "text": "hello"}]})
                done = await anyio.to_thread.run_sync(lambda: subprocess.run(
                    [sys.executable, "-c", _PROPOSER, str(ledger), thread, str(n)], check=True,
                    capture_output=True, text=True))
                proposed_ids = [line.split()[0] for line in done.stdout.splitlines()]
                # The last pickups: waited for (a slow one shows in the percentiles), up to a bound.
                with anyio.move_on_after(PICKUP_WAIT):
                    while not _all_decided(recorder, proposed_ids):
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
            recorder.close()
    # From the moment the proposer's transaction is committed (when propose() returns;
    # before that no other process can see the intent) to the daemon's first decision.
    proposed = {intent_id: float(at) for intent_id, at in (line.split() for line in done.stdout.splitlines())}
    decided = {}
    with SQLiteRecorder(ledger) as rec:
        for entry in rec.read():
            e, at = entry.envelope.event, entry.envelope.observed_at
            if isinstance(e, ev.DecisionRecorded) and e.intent_id not in decided:
                decided[e.intent_id] = at
    missing = [i for i in proposed if i not in decided]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(proposed)} intents were never picked up")
    return [decided[i] - proposed[i] for i in proposed]


def run(quick: bool) -> list[Row]:
    n_notes = 1_000 if quick else 20_000
    n_intents = 15 if quick else 300
    work = Path(tempfile.mkdtemp(prefix="live-", dir=scratch_dir()))
    rows = []
    try:
        every, decided = anyio.run(_brain_latency, n_notes, work / "brain.sqlite3")
        p = {q: percentile(every, q) * 1000 for q in (50, 99)}
        pd = {q: percentile(decided, q) * 1000 for q in (50, 99)} if decided else {50: float("nan"), 99: float("nan")}
        rows.append(Row("notification → decision recorded (in-process brain)",
                        f"p99 {pd[99]:.2f} ms, p50 {pd[50]:.2f} ms ({len(decided)} decisions)",
                        f"all {len(every)}: p99 {p[99]:.2f} ms", None, f"p99 ≤ {DECISION_BUDGET_MS:g} ms",
                        PASS if max(pd[99], p[99]) <= DECISION_BUDGET_MS else FAIL,
                        {"samples": len(every), "decision_samples": len(decided),
                         "p50_ms": p[50], "p99_ms": p[99], "decision_p50_ms": pd[50], "decision_p99_ms": pd[99],
                         "max_ms": max(every) * 1000}))
        pickup_dir = work / "pickup"
        pickup_dir.mkdir()
        try:
            lat = anyio.run(_pickup, n_intents, pickup_dir, backend="asyncio")
        except Exception as exc:  # e.g. no codex binary: report, don't hide the other rows
            rows.append(Row("intent proposed elsewhere → picked up (real app-server)", f"error: {exc}"[:160],
                            budget=f"p99 ≤ {PICKUP_BUDGET_MS:g} ms", verdict=FAIL))
        else:
            q = {k: percentile(lat, k) * 1000 for k in (50, 99)}
            rows.append(Row("intent proposed elsewhere → picked up (real app-server)",
                            f"p99 {q[99]:.1f} ms, p50 {q[50]:.1f} ms ({len(lat)} intents)", "", None,
                            f"p99 ≤ {PICKUP_BUDGET_MS:g} ms", PASS if q[99] <= PICKUP_BUDGET_MS else FAIL,
                            {"samples": len(lat), "p50_ms": q[50], "p99_ms": q[99], "max_ms": max(lat) * 1000}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main(run)
