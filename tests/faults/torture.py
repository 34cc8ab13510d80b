"""Fault injection against the REAL Codex app-server: shared helpers and the torture run.

The daemon runs as a real ``python -m tillerman.controller run`` process (``DaemonProcess``), so a
SIGKILL is a real crash: from outside at a random moment, or from inside at a named
point of the dispatch protocol (``TILLERMAN_KILL_AT``, ``tillerman.controller.dispatch.driver.CHECKPOINTS``).
The harness (the test) owns the threads, proposes intents into the ledger as another
process would, and judges every intent from three independent records:

* the server's history: ``thread/turns/list`` with ``itemsView: "full"`` — every
  ``userMessage`` whose ``clientId`` is the intent's;
* the rollout file the server wrote (``event_msg`` ``item_completed`` lines whose
  ``item.client_id`` is the intent's);
* the daemon's ``--trace`` (every request it sent, flushed line by line, so it survives
  a SIGKILL): how many times it sent the steer, queue add or interrupt, and a stop's
  goal pauses and queue deletes per thread.

A stop is judged by its effect: the server shows no turn running and the goal not
active; delivered twice means the goal paused twice or a turn interrupted twice.

``judge`` turns these into an ``Outcome``; ``Summary`` counts them: proposed, delivered
once, delivered twice (must be 0), lost without a report (must be 0: for a stop, not
settled past acknowledged), steers on a wrong turn (must be 0), a stop's writes on a
thread no stop was proposed for (must be 0), and ledger/server disagreements (must be 0).

Entry point (prints the summary table)::

    python -m tests.faults.torture --rounds 200 [--races 40] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from fixtures.codex_server import (
    AppServer,
    EventLog,
    HarnessClient,
    is_item,
    is_notification,
    make_codex_home,
    start_thread,
    start_turn,
    watched_connection,
)
from fixtures.rule_texts import ANN_DISPATCHES_AND_STOPS_ANYWHERE
from fixtures.scripted_model import ScriptedModel
from tests.faults.ledger_faults import ledger_faults_on_their_own
from tillerman.controller.core.intent_requests import intent_view, propose
from tillerman.controller.core.overdue import overdue
from tillerman.controller.dispatch.driver import CHECKPOINTS, KILL_AT_ENV
from tillerman.ledger import projections
from tillerman.ledger.events import Report
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.jsonrpc import RpcError

ROOT = Path(__file__).resolve().parents[2]
OWNER = "ann"
GRANTS = ANN_DISPATCHES_AND_STOPS_ANYWHERE
MODES = ("steer", "queue", "interrupt")
DEFINITE = frozenset({"acknowledged", "expired", "rejected", "effect_verified", "effect_failed"})
#: Where a stop settles: acknowledged is its steps carried out, its readback still to come.
STOP_FINAL = DEFINITE - {"acknowledged"}
STOP_ROUNDS = 0.2  # the share of random rounds that are stop rounds (on a release with goals)
#: What a steer that did not land may end as: each refusal reconciled, never retried.
STEER_REFUSALS = frozenset({("rejected", "stale_turn"), ("rejected", "no_active_turn"),
                            ("expired", "turn_ended"), ("expired", "not_delivered"),
                            ("expired", "lost_after_accept")})
QUEUE_ACK_DEADLINE = 3.0  # a queue add of unknown outcome that is absent settles after this
#: The requests only a stop sends (tillerman never sets a goal otherwise), counted per thread.
STOP_WRITES = ("thread/goal/set", "thread/queue/delete")


# -- the daemon as a real process ----------------------------------------------------------


class DaemonProcess:
    """``python -m tillerman.controller run`` on one ledger; restartable; killable for real."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        workdir.mkdir(parents=True, exist_ok=True)
        self.ledger = workdir / "ledger.sqlite3"
        self.config = workdir / "config.toml"
        self.trace = workdir / "daemon-trace.jsonl"
        self.stderr = workdir / "daemon.stderr.log"
        self.config.write_text(GRANTS)
        self.process: subprocess.Popen | None = None
        self.kill_at: str | None = None
        self.starts = 0
        self.kills = 0  # SIGKILLs from outside
        self.self_kills = 0  # deaths at a checkpoint, seen by ``ensure``

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, kill_at: str | None = None) -> None:
        assert not self.alive, "one daemon per ledger"
        env = dict(os.environ)
        env.pop(KILL_AT_ENV, None)
        if kill_at:
            env[KILL_AT_ENV] = kill_at
        with open(self.stderr, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tillerman.controller", "run", "--codex", self.url, "--ledger", str(self.ledger),
                 "--config", str(self.config), "--trace", str(self.trace)],
                env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        self.kill_at = kill_at
        self.starts += 1

    def sigkill(self) -> None:
        if self.alive:
            self.process.kill()
            self.process.wait()
            self.kills += 1
        self.process = None

    def ensure(self) -> None:
        """Restart (with no kill point) a daemon that died."""
        if self.process is not None and self.process.poll() is not None:
            if self.process.returncode == -signal.SIGKILL and self.kill_at:
                self.self_kills += 1
            self.process = None
        if self.process is None:
            self.start()

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            return self.stderr.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


# -- reading back what happened -------------------------------------------------------------


async def thread_turns(client: Any, thread_id: str) -> list[dict]:
    """Every turn of the thread the server holds, with every item (``itemsView: full``)."""
    turns: list[dict] = []
    cursor = None
    while True:
        params = {"threadId": thread_id, "limit": 50, "itemsView": "full"} | ({"cursor": cursor} if cursor else {})
        page = await client.request("thread/turns/list", params, timeout=20)
        turns += [t for t in page.get("data") or [] if isinstance(t, dict)]
        cursor = page.get("nextCursor")
        if not cursor:
            return turns


def server_copies(turns: list[dict]) -> dict[str, list[str]]:
    """clientId -> the turn ids its userMessage appears in (once per copy)."""
    found: dict[str, list[str]] = {}
    for turn in turns:
        for item in turn.get("items") or []:
            if isinstance(item, dict) and item.get("type") == "userMessage" and item.get("clientId"):
                found.setdefault(item["clientId"], []).append(turn.get("id"))
    return found


def rollout_copies(server: AppServer, thread_id: str) -> dict[str, list[str]]:
    """clientId -> turn ids, from the rollout file(s) of the thread (``item_completed`` lines)."""
    found: dict[str, list[str]] = {}
    for path in server.rollout_files():
        if not path.name.endswith(f"{thread_id}.jsonl"):
            continue
        for line in path.read_text(errors="replace").splitlines():
            if '"client_id"' not in line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            payload = record.get("payload") or {}
            item = payload.get("item") or {}
            if (record.get("type") == "event_msg" and payload.get("type") == "item_completed"
                    and item.get("type") == "UserMessage" and item.get("client_id")):
                found.setdefault(item["client_id"], []).append(payload.get("turn_id"))
    return found


class TraceReader:
    """Dispatch requests the daemon sent, read from its ``--trace`` (all its lives)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sends: Counter[tuple[str, str]] = Counter()  # (method, clientId, turn id or thread id)
        self._offset = 0

    def refresh(self) -> Counter[tuple[str, str]]:
        if not self.path.exists():
            return self.sends
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            msg = record.get("msg")
            if record.get("dir") != "out" or not isinstance(msg, dict):
                continue
            params = msg.get("params") or {}
            if msg.get("method") in ("turn/steer", "thread/queue/add"):
                self.sends[(msg["method"], str(params.get("clientUserMessageId")))] += 1
            elif msg.get("method") == "turn/interrupt":
                self.sends[(msg["method"], str(params.get("turnId")))] += 1
            elif msg.get("method") in STOP_WRITES:
                self.sends[(msg["method"], str(params.get("threadId")))] += 1
        return self.sends

    def stop_writes(self, thread_id: str, method: str | None = None) -> int:
        """A stop's writes to the thread (goal pauses, queue deletes), or those of ``method``."""
        self.refresh()
        return sum(self.sends[(m, thread_id)] for m in STOP_WRITES if method in (None, m))

    def count(self, mode: str, client_id: str, turn_id: str | None, thread_id: str | None = None) -> int:
        """The sends of one intent: its steer, queue add or interrupt; a stop's goal pauses."""
        self.refresh()
        if mode == "steer":
            return self.sends[("turn/steer", client_id)]
        if mode == "queue":
            return self.sends[("thread/queue/add", client_id)]
        if mode == "stop":
            return self.sends[("thread/goal/set", str(thread_id))]
        return self.sends[("turn/interrupt", str(turn_id))]


def ledger_health(ledger: Path) -> tuple[bool, list[str]]:
    """``ledger verify`` (hash chain, head anchor) and ``PRAGMA integrity_check``."""
    with SQLiteRecorder(ledger) as rec:
        report = rec.verify()
        integrity = rec._db.execute("PRAGMA integrity_check").fetchone()[0]
    problems = [str(p) for p in report.problems] + ([] if integrity == "ok" else [f"integrity_check: {integrity}"])
    return report.ok and integrity == "ok", problems


@dataclass
class Outcome:
    intent_id: str
    mode: str
    expected_turn: str | None
    state: str
    reason: str | None
    on_server: list[str]  # turns our clientId's userMessage appears in (server history)
    in_rollout: list[str]  # the same, from the rollout file
    sends: int  # dispatch requests in the daemon's trace
    reported: bool
    turn_status: str | None  # the expected turn's final status on the server
    label: str = ""
    # A stop's thread as the server shows it at the end: a turn running, the goal's status.
    still_running: bool = False
    goal_status: str | None = None
    stop_writes: int = 0  # goal pauses and queue deletes sent to the intent's thread
    interrupted_twice: int = 0  # turns of the intent's thread the trace shows interrupted more than once

    @property
    def copies(self) -> int:
        return max(len(self.on_server), len(self.in_rollout))

    @property
    def delivered(self) -> bool:
        if self.mode == "interrupt":
            return self.turn_status == "interrupted"
        if self.mode == "stop":  # its effect: the thread does no more work
            return not self.still_running and self.goal_status != "active"
        return self.copies >= 1

    @property
    def duplicated(self) -> bool:
        # an interrupt sent twice is a duplicate too, even if the second one found no turn;
        # a stop pauses the goal once, and interrupts no turn twice
        if self.mode == "stop":
            return self.sends > 1 or self.interrupted_twice > 0
        return self.copies > 1 or (self.mode == "interrupt" and self.sends > 1)

    @property
    def wrong_turn(self) -> bool:
        return self.mode in ("steer", "interrupt") and any(t != self.expected_turn
                                                           for t in self.on_server + self.in_rollout)

    @property
    def wrong_thread(self) -> bool:
        """A stop's write (goal pause, queue delete) on a thread no stop was proposed for."""
        return self.mode != "stop" and self.stop_writes > 0

    @property
    def settled(self) -> bool:
        return self.state in (STOP_FINAL if self.mode == "stop" else DEFINITE)

    @property
    def lost(self) -> bool:
        """Neither in a definite state nor reported to a person."""
        return not self.settled and not self.reported

    @property
    def disagrees(self) -> bool:
        """The ledger's verdict contradicts the server: acknowledged but not there, or
        settled as not delivered while it is there."""
        if not self.settled:
            return False
        return (self.state == ("effect_verified" if self.mode == "stop" else "acknowledged")) != self.delivered

    @property
    def problems(self) -> list[str]:
        return [name for name, bad in (("duplicated", self.duplicated), ("wrong_turn", self.wrong_turn),
                                       ("wrong_thread", self.wrong_thread), ("lost", self.lost),
                                       ("disagrees", self.disagrees)) if bad]

    def describe(self) -> str:
        return (f"{self.label} {self.intent_id} {self.mode} -> {self.state}/{self.reason} server={self.on_server} "
                f"rollout={self.in_rollout} expected={self.expected_turn} sends={self.sends} "
                f"turn_status={self.turn_status} reported={self.reported}"
                + (f" running={self.still_running} goal={self.goal_status} interrupted_twice={self.interrupted_twice}"
                   if self.mode == "stop" else ""))


def judge(ledger: Path, intent_ids: list[str], turns: list[dict], rollout: dict[str, list[str]],
          trace: TraceReader, label: str = "", goal_status: str | None = None) -> list[Outcome]:
    on_server = server_copies(turns)
    status = {t.get("id"): t.get("status") for t in turns}
    with SQLiteRecorder(ledger) as rec:
        projection = projections.load(rec)
        reports = {e.envelope.event.detail.get("intent_id") for e in rec.read()
                   if isinstance(e.envelope.event, Report)}
    late = {o.intent_id for o in overdue(projection, time.time())}
    outcomes = []
    for intent_id in intent_ids:
        view = projection.intents[intent_id]
        intent = view.intent
        last = next((h for h in reversed(view.history) if h.kind == "transition"), None)
        cid = intent.client_user_message_id
        outcomes.append(Outcome(
            intent_id=intent_id, mode=intent.mode, expected_turn=intent.expected_turn_id, state=view.state,
            reason=last.reason if last else None, on_server=on_server.get(cid, []),
            in_rollout=rollout.get(cid, []), sends=trace.count(intent.mode, cid, intent.expected_turn_id, intent.thread_id),
            reported=intent_id in reports or intent_id in late,
            turn_status=status.get(intent.expected_turn_id), label=label,
            still_running=any(s == "inProgress" for s in status.values()), goal_status=goal_status,
            stop_writes=trace.stop_writes(intent.thread_id),
            interrupted_twice=sum(1 for turn_id in status if trace.count("interrupt", cid, turn_id) > 1)))
    return outcomes


def states(ledger: Path, intent_ids: list[str]) -> dict[str, str]:
    with SQLiteRecorder(ledger) as rec:
        return {i: intent_view(rec, i).state for i in intent_ids}


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)
    ledger_failures: list[str] = field(default_factory=list)
    rounds: int = 0
    kills: int = 0
    self_kills: int = 0
    seed: int | None = None
    seconds: float = 0.0

    def add(self, outcomes: list[Outcome]) -> None:
        self.outcomes += outcomes

    def counts(self) -> dict[str, int]:
        o = self.outcomes
        return {
            "intents proposed": len(o),
            "delivered once": sum(1 for x in o if x.delivered and not x.duplicated),
            "not delivered, settled or reported": sum(1 for x in o if not x.delivered and not x.lost),
            "delivered twice": sum(1 for x in o if x.duplicated),
            "lost without a report": sum(1 for x in o if x.lost),
            "steers on a wrong turn": sum(1 for x in o if x.wrong_turn),
            "stop writes on a wrong thread": sum(1 for x in o if x.wrong_thread),
            "ledger/server disagreements": sum(1 for x in o if x.disagrees),
            "ledger checks failed": len(self.ledger_failures),
        }

    @property
    def clean(self) -> bool:
        c = self.counts()
        return not any(c[k] for k in ("delivered twice", "lost without a report", "steers on a wrong turn",
                                      "stop writes on a wrong thread", "ledger/server disagreements",
                                      "ledger checks failed"))

    def table(self, title: str = "random kills") -> str:
        lines = [f"tillerman torture: {title} — {self.rounds} rounds, seed {self.seed}, "
                 f"{self.kills} SIGKILLs from outside + {self.self_kills} at checkpoints, {self.seconds:.0f}s"]
        counts = self.counts()
        width = max(len(k) for k in counts)
        lines += [f"  {k:<{width}}  {v:>6}" for k, v in counts.items()]
        by_end = Counter(f"{x.mode}: {x.state}/{x.reason}" for x in self.outcomes)
        lines.append("  final states:")
        lines += [f"    {k:<44} {v:>5}" for k, v in sorted(by_end.items())]
        bad = [x.describe() for x in self.outcomes if x.problems] + self.ledger_failures
        if bad:
            lines.append("  PROBLEMS:")
            lines += [f"    {b}" for b in bad[:30]]
        return "\n".join(lines)


# -- a harness beside the daemon ---------------------------------------------------------------


class Harness:
    """The harness's connection (it owns the threads) plus the daemon process under test."""

    def __init__(self, server: AppServer, client: HarnessClient, log: EventLog, daemon: DaemonProcess) -> None:
        self.server = server
        self.client = client
        self.log = log
        self.daemon = daemon
        self.trace = TraceReader(daemon.trace)

    async def start_thread(self, workspace: Path) -> str:
        return await start_thread(self.client, workspace)

    async def start_turn(self, thread_id: str, prompt: str) -> str:
        return await start_turn(self.client, thread_id, prompt)

    async def command_started(self, thread_id: str, turn_id: str, timeout: float = 20.0) -> None:
        await self.log.wait_for(lambda m: is_item("item/started", "commandExecution")(m)
                                and m.params.get("threadId") == thread_id and m.params.get("turnId") == turn_id,
                                timeout=timeout)

    async def turn_completed(self, thread_id: str, turn_id: str, timeout: float = 30.0) -> str:
        message = await self.log.wait_for(
            lambda m: is_notification("turn/completed", threadId=thread_id)(m) and m.params["turn"]["id"] == turn_id,
            timeout=timeout)
        return message.params["turn"]["status"]

    def propose(self, **request) -> str:
        with SQLiteRecorder(self.daemon.ledger) as rec:
            return propose(rec, owner=OWNER, **request).id

    def _turn_counts(self, thread_id: str) -> tuple[int, int]:
        started = sum(1 for m in self.log.messages if is_notification("turn/started", threadId=thread_id)(m))
        done = sum(1 for m in self.log.messages if is_notification("turn/completed", threadId=thread_id)(m))
        return started, done

    async def idle(self, thread_id: str, timeout: float = 30.0, keep_alive: bool = True) -> None:
        """Wait until no turn runs and the server's queue is empty; a queue our interrupt
        paused is resumed, as a person answering the ``queue_paused`` report would."""
        stable = 0
        with anyio.fail_after(timeout):
            while stable < 3:
                if keep_alive:
                    self.daemon.ensure()
                await anyio.sleep(0.1)
                started, done = self._turn_counts(thread_id)
                queue = (await self.client.request("thread/queue/list", {"threadId": thread_id})).get("data") or []
                if started == done and queue:
                    stable = 0
                    try:
                        await self.client.request("thread/queue/start", {"threadId": thread_id})
                    except Exception:  # noqa: BLE001 - a turn started meanwhile: fine
                        pass
                    continue
                stable = stable + 1 if started == done and not queue else 0

    async def settle(self, intent_ids: list[str], timeout: float = 20.0, keep_alive: bool = True,
                     final: frozenset[str] = DEFINITE) -> None:
        """Wait (restarting a dead daemon) until every intent is in a definite state (one of
        ``final``), or timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if keep_alive:
                self.daemon.ensure()
            if all(s in final for s in states(self.daemon.ledger, intent_ids).values()):
                return
            await anyio.sleep(0.1)

    async def outcomes(self, thread_id: str, intent_ids: list[str], label: str = "") -> list[Outcome]:
        turns = await thread_turns(self.client, thread_id)
        await anyio.sleep(0.05)  # the rollout is written beside the notifications
        return judge(self.daemon.ledger, intent_ids, turns, rollout_copies(self.server, thread_id), self.trace,
                     label, goal_status=await self.goal_status(thread_id))

    async def set_goal(self, thread_id: str) -> None:
        """An active goal: after the running turn Codex starts the next, turn after turn."""
        await self.client.request("thread/goal/set", {"threadId": thread_id, "objective": "keep going",
                                                      "status": "active", "origin": "user"})

    async def goal_status(self, thread_id: str) -> str | None:
        try:
            goal = (await self.client.request("thread/goal/get", {"threadId": thread_id})).get("goal")
        except RpcError:  # a release without goals
            return None
        return goal.get("status") if isinstance(goal, dict) else None


# -- one random round -------------------------------------------------------------------------


async def random_round(h: Harness, rng: random.Random, number: int, workspace: Path) -> list[Outcome]:
    """A turn, 1–3 random intents at random moments, and (usually) a SIGKILL of the daemon.
    One round in five (on a release with goals) is a stop round instead: the thread gets an
    active goal during its turn, and a stop is the round's one intent (another intent
    beside it would be judged against a turn the stop may have ended)."""
    plan = rng.choices(["none", "outside", "checkpoint"], weights=[1, 2, 2])[0]
    point = rng.choice(CHECKPOINTS) if plan == "checkpoint" else None
    if point:
        h.daemon.sigkill()  # a kill at a random moment of its idle life, too
        h.daemon.start(kill_at=point)
    else:
        h.daemon.ensure()
    thread = await h.start_thread(workspace)
    sleep_for = rng.choice([0.4, 0.6, 0.8, 1.0, 1.3])
    turn = await h.start_turn(thread, f"RUN: sleep {sleep_for}")
    await h.command_started(thread, turn)
    t0 = time.monotonic()
    modes = rng.choices(MODES, weights=[4, 2, 2], k=rng.choice([1, 1, 2, 3]))
    if modes.count("interrupt") > 1:
        modes = [m for m in modes if m != "interrupt"] + ["interrupt"]
    if rng.random() < STOP_ROUNDS:
        modes = ["stop"]
        await h.set_goal(thread)
    events: list[tuple[float, str, str | None]] = sorted(
        (rng.uniform(0.0, sleep_for + 0.3), "propose", mode) for mode in modes)
    if plan == "outside":
        kill_at = rng.uniform(0.0, sleep_for + 0.8)
        events.append((kill_at, "kill", None))
        events.append((kill_at + rng.uniform(0.0, 1.0), "restart", None))
        events.sort(key=lambda e: e[0])
    intent_ids: list[str] = []
    for at, what, mode in events:
        await anyio.sleep(max(0.0, at - (time.monotonic() - t0)))
        if what == "propose":
            text = f"TORTURE round {number} {mode} {len(intent_ids)}: note this and carry on."
            if mode == "queue":
                intent_ids.append(h.propose(thread_id=thread, mode="queue", text=text,
                                            ack_deadline=QUEUE_ACK_DEADLINE))
            elif mode == "stop":
                intent_ids.append(h.propose(thread_id=thread, mode="stop", text=text))
            else:
                intent_ids.append(h.propose(thread_id=thread, mode=mode, text=text, expected_turn=turn))
        elif what == "kill":
            h.daemon.sigkill()
        else:
            h.daemon.ensure()
    if modes == ["stop"]:  # acknowledged is not its end: its readback is
        await h.settle(intent_ids, timeout=40, final=STOP_FINAL)
    await h.idle(thread)
    await h.settle(intent_ids)
    await h.idle(thread)  # a settled queue intent may have started a turn
    return await h.outcomes(thread, intent_ids, label=f"round {number} ({plan}{' at ' + point if point else ''})")


async def run_rounds(h: Harness, rounds: int, seed: int, workspace: Path,
                     progress: Callable[[str], None] | None = None) -> Summary:
    rng = random.Random(seed)
    summary = Summary(seed=seed)
    started = time.monotonic()
    for number in range(rounds):
        outcomes = await random_round(h, rng, number, workspace)
        summary.add(outcomes)
        summary.rounds += 1
        ok, problems = ledger_health(h.daemon.ledger)
        if not ok:
            summary.ledger_failures.append(f"round {number}: {problems}")
        if progress and (any(o.problems for o in outcomes) or not ok or (number + 1) % 20 == 0):
            progress(f"round {number + 1}/{rounds}: " + "; ".join(o.describe() for o in outcomes if o.problems))
    summary.kills, summary.self_kills = h.daemon.kills, h.daemon.self_kills
    summary.seconds = time.monotonic() - started
    return summary


# -- turn rollover races ------------------------------------------------------------------------


async def rollover_trial(h: Harness, rng: random.Random, number: int, workspace: Path,
                         thread: str | None = None) -> Outcome:
    """The expected turn ends at a varied moment around the steer; the next turn starts
    at once, so a steer that slipped past its turn would have somewhere wrong to land."""
    thread = thread or await h.start_thread(workspace)
    sleep_for = rng.choice([0.2, 0.3, 0.5, 0.7])
    turn = await h.start_turn(thread, f"RUN: sleep {sleep_for}")
    await h.command_started(thread, turn)
    await anyio.sleep(max(0.0, sleep_for + rng.uniform(-0.35, 0.25)))
    intent_id = h.propose(thread_id=thread, mode="steer", expected_turn=turn,
                          text=f"ROLLOVER trial {number}: use the other fixture.")
    await h.turn_completed(thread, turn)
    follow = await h.start_turn(thread, "RUN: sleep 0.2")
    await h.turn_completed(thread, follow)
    await h.settle([intent_id], keep_alive=False)
    await h.idle(thread, keep_alive=False)
    (outcome,) = await h.outcomes(thread, [intent_id], label=f"race {number} (sleep {sleep_for})")
    return outcome


def reconciled(outcome: Outcome) -> bool:
    """A steer either acknowledged in its own turn, or refused / expired for a known reason."""
    if outcome.state == "acknowledged":
        return outcome.on_server == [outcome.expected_turn]
    return (outcome.state, outcome.reason) in STEER_REFUSALS and outcome.copies == 0


# -- the entry point ------------------------------------------------------------------------


async def _main(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {seed}  (reproduce: python -m tests.faults.torture --rounds {args.rounds} --races {args.races} "
          f"--seed {seed})", flush=True)
    workdir = Path(args.workdir) if args.workdir else None
    with ScriptedModel() as model:
        home = make_codex_home(model.base_url)
        try:
            with AppServer(home) as server:
                work = workdir or home / "torture"
                daemon = DaemonProcess(server.url, work)
                workspace = home / "ws"
                workspace.mkdir()
                try:
                    async with watched_connection(server.url, client_name="harness",
                                                  client_class=HarnessClient) as (client, log):
                        h = Harness(server, client, log, daemon)
                        summary = await run_rounds(h, args.rounds, seed, workspace,
                                                   progress=lambda s: print(s, flush=True))
                        race_lines, races_ok = [], True
                        if args.races:
                            daemon.ensure()
                            rng = random.Random(seed + 1)
                            started = time.monotonic()
                            outcomes = []
                            for n in range(args.races):
                                outcomes.append(await rollover_trial(h, rng, n, workspace))
                                if (n + 1) % 10 == 0 or n + 1 == args.races:
                                    print(f"race {n + 1}/{args.races}", flush=True)
                            ends = Counter(f"{o.state}/{o.reason}" for o in outcomes)
                            wrong = sum(1 for o in outcomes if o.wrong_turn)
                            unreconciled = [o for o in outcomes if not reconciled(o)]
                            races_ok = not wrong and not unreconciled
                            race_lines = [f"tillerman torture: turn rollover races — {len(outcomes)} trials, "
                                          f"{time.monotonic() - started:.0f}s",
                                          f"  steers on a wrong turn  {wrong:>6}",
                                          f"  not reconciled          {len(unreconciled):>6}",
                                          *[f"    {k:<40} {v:>5}" for k, v in sorted(ends.items())],
                                          *[f"    PROBLEM {o.describe()}" for o in unreconciled]]
                finally:
                    daemon.stop()
        finally:
            shutil.rmtree(home, ignore_errors=True)
    ledger_ok, ledger_table = ledger_faults_on_their_own()
    print()
    print(summary.table())
    if race_lines:
        print("\n".join(race_lines))
    print(ledger_table)
    clean = summary.clean and races_ok and ledger_ok
    print("RESULT:", "PASS" if clean else "FAIL")
    return 0 if clean else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.torture", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="random-kill rounds (make torture: 200)")
    parser.add_argument("--races", type=int, default=0, help="turn rollover race trials after the rounds")
    parser.add_argument("--seed", type=int, help="RNG seed (printed; default: random)")
    parser.add_argument("--workdir", help="keep the ledger, trace and daemon log here")
    args = parser.parse_args(argv)
    return anyio.run(_main, args)


if __name__ == "__main__":
    sys.exit(main())
