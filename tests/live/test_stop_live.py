"""A stop against the REAL Codex app-server (thread goals: every checked release has them): the thread does no more
work, and a plain interrupt on a goal thread says the work goes on. A stopped thread stays
stopped: our queued message the stop deleted settles ``expired withdrawn``, never delivered,
and a rule's later queued message waits (``thread_stopped``) until a person's turn.

As in ``test_delivery_live``, the harness owns each thread and tillerman is the second
connection: what it receives is recorded into a SQLite ledger and fed to the delivery
machines, whose commands go through the guarded adapter. Here the ledger is also folded
as it grows, so each observation carries the thread's goal as the projection knows it
(``tillerman.controller.core.reconcile.observed``), as the daemon's do.
"""

from __future__ import annotations

import datetime
import time
import uuid
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer, EventLog, is_notification, text_input
from tests.live.test_appserver_live import _harness_and_supervisor, _turn_completed
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch
from tillerman.controller.core.intent_requests import intent_view, propose
from tillerman.controller.core.reconcile import observed, reconcile_fact
from tillerman.controller.core.stop import StopDelivery
from tillerman.controller.core.supervisor import Step
from tillerman.controller.dispatch.adapter import GuardedAdapter
from tillerman.controller.dispatch.driver import carry_out
from tillerman.ledger.events import Envelope, GoalUpdated
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import Projection
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.appserver_client import AppServerClient
from tillerman.monitor.appserver_events import AppServerEvents, natural_key
from tillerman.monitor.jsonrpc import Notification, ServerRequest
from tillerman.rules.decision import DISPATCH_ACTIONS, Action
from tillerman.rules.ruleset import Grant, RepeatedFailure, Rule, build_ruleset

pytestmark = [pytest.mark.live, pytest.mark.anyio]

OWNER = "ann"
RULE = "nudge"  # a rule that queues a message (its condition is never evaluated here)
GRANTS = build_ruleset(
    (Rule(id=RULE, version=1, status="active", condition=RepeatedFailure(count=3), action=Action.QUEUE,
          owner=OWNER, review_by=datetime.date(2099, 1, 1)),),
    (Grant(subject=f"owner:{OWNER}", actions=frozenset({"queue", "interrupt", "stop"})),
     Grant(subject=f"rule:{RULE}", actions=frozenset({"queue"}))))
#: How long a stopped thread is watched for a turn that should not start.
QUIET = 10.0


class Tillerman:
    """The daemon's loop, in small, with its projection folded as the ledger grows."""

    def __init__(self, client: AppServerClient, log: EventLog, tmp_path: Path):
        self.log = log
        self.recorder = SQLiteRecorder(tmp_path / "ledger.sqlite3")
        self.adapter = GuardedAdapter(client, self.recorder, GRANTS, timeout=5.0,
                                      snapshot=lambda thread_id: self.projection.snapshot(thread_id))
        self.projection = Projection()
        self.machines: list[Delivery] = []
        self._mapping = AppServerEvents()
        self._read = 0

    def propose(self, **request) -> Delivery:
        intent = propose(self.recorder, owner=OWNER, **request)
        machine = StopDelivery(intent) if intent.mode == "stop" else Delivery(intent)
        self.machines.append(machine)
        self._fold()
        return machine

    async def subscribe(self, client: AppServerClient, thread_id: str) -> None:
        """``thread/resume``, its running turn recorded as the daemon's tap records it."""
        result = await client.request("thread/resume", {"threadId": thread_id, "excludeTurns": True,
                                                        "initialTurnsPage": {"limit": 1}})
        self.recorder.append([Envelope(event_id=natural_key(event), event=event, source="appserver", at=time.time())
                              for event in self._mapping.response("thread/resume", result)])

    def _fold(self) -> None:
        self.projection.fold(self.recorder.read(after_seq=self.projection.seq))

    async def dispatch(self, machine: Delivery) -> None:
        self._fold()
        active = self.projection.snapshot(machine.intent.thread_id).active_turn_id
        await carry_out(machine, Dispatch(time.time(), uuid.uuid4().hex, active), self.recorder, self.adapter)

    def snapshot(self, thread_id: str) -> ThreadSnapshot:
        """The thread as the ledger holds it now (folded first)."""
        self._fold()
        return self.projection.snapshot(thread_id)

    async def decide(self) -> dict[str, tuple[str, str]]:
        """One decision round for every open intent, as the daemon's: the policy's decisions
        recorded, a dispatch or a reconcile carried out; each intent's (action, reason)."""
        self._fold()
        now = time.time()
        envelopes, decided = Step(GRANTS, replay=False).decide_intents(self.projection,
                                                                       self.projection.open_intents(), now)
        self.recorder.append(envelopes)
        self._fold()
        for view, decision in decided:
            machine = next(m for m in self.machines if m.intent.id == view.intent.id)
            if decision.action in DISPATCH_ACTIONS:
                await self.dispatch(machine)
            elif decision.action is Action.RECONCILE:
                fact = reconcile_fact(self.projection, self.projection.intents[view.intent.id], now)
                await carry_out(machine, fact, self.recorder, self.adapter)
        return {view.intent.id: (decision.action.value, decision.reason) for view, decision in decided}

    async def pump(self) -> None:
        while self._read < len(self.log.messages):
            message = self.log.messages[self._read]
            self._read += 1
            if not isinstance(message, Notification | ServerRequest):
                continue
            for event in self._mapping.normalize(message.raw):
                key = natural_key(event, message.raw.get("emittedAtMs"))
                self.recorder.append([Envelope(event_id=key, event=event, source="appserver", at=time.time())])
                self._fold()
                for machine in self.machines:
                    snapshot = self.projection.snapshot(machine.intent.thread_id)
                    await carry_out(machine, observed(snapshot, machine.intent, event, time.time()),
                                    self.recorder, self.adapter)

    async def until(self, done, timeout: float = 60.0) -> None:
        with anyio.fail_after(timeout):
            while True:
                await self.pump()
                if done():
                    return
                with anyio.move_on_after(0.5):
                    await self.log.wait_for(lambda _: True, start=self._read)

    def moves(self, intent: Intent) -> list[tuple[str, str]]:
        return [(h.state, h.reason) for h in intent_view(self.recorder, intent.id).history if h.kind == "transition"]

    def history(self, intent: Intent):
        return intent_view(self.recorder, intent.id).history

    def goal_reports(self) -> list[tuple[str, str | None, str | None]]:
        """Each recorded goal change: (status, the turn it names, by)."""
        return [(e.envelope.event.status, e.envelope.event.turn_id, e.envelope.event.by) for e in self.recorder.read()
                if isinstance(e.envelope.event, GoalUpdated)]


def _turns_started(log: EventLog, thread_id: str, start: int = 0) -> list[str]:
    return [m.params["turn"]["id"] for m in log.messages[start:]
            if is_notification("turn/started", threadId=thread_id)(m)]


async def _goal_thread(harness, supervisor: AppServerClient, log: EventLog, workspace: Path) -> str:
    """An idle thread given an active goal: Codex runs its continuation turns back to back.
    tillerman's connection subscribes once they run (a resume of a busy thread wakes nothing)."""
    thread_id = (await harness.request("thread/start", {"cwd": str(workspace)}))["thread"]["id"]
    await harness.request("thread/goal/set", {"threadId": thread_id, "objective": "keep improving the docs",
                                              "status": "active", "origin": "user"})
    await supervisor.request("thread/resume", {"threadId": thread_id, "excludeTurns": True,
                                               "initialTurnsPage": {"limit": 1}})
    await log.wait_for(is_notification("turn/started", threadId=thread_id), timeout=30)
    return thread_id


async def test_a_stop_on_a_busy_goal_thread_ends_all_work_and_is_verified(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread_id = await _goal_thread(harness, supervisor, log, workspace)
        # It is busy: several continuation turns follow one another.
        await log.wait_for(lambda _: len(_turns_started(log, thread_id)) >= 3, timeout=30)
        tm = Tillerman(supervisor, log, tmp_path)
        await tm.pump()
        stop = tm.propose(thread_id=thread_id, mode="stop", text="wrong direction: stop until I look")

        await tm.dispatch(stop)
        await tm.until(lambda: stop.finished)
        verified_at = len(log.messages)

        assert tm.moves(stop.intent) == [("dispatch_unknown", "dispatching"), ("acknowledged", "stop_applied"),
                                         ("effect_verified", "stop_verified")]
        assert tm.history(stop.intent)[-1].evidence == {"goal_status": "paused", "running_turn": None}
        paused = [e.envelope.event for e in tm.recorder.read() if isinstance(e.envelope.event, GoalUpdated)
                  and e.envelope.event.by == "tillerman"]
        assert [(g.status, g.origin) for g in paused] == [("paused", "user")]
        await anyio.sleep(QUIET)
        assert _turns_started(log, thread_id, start=verified_at) == []  # no work for QUIET seconds
        goal = await supervisor.request("thread/goal/get", {"threadId": thread_id})
        assert goal["goal"]["status"] == "paused"
        turns = await supervisor.request("thread/turns/list", {"threadId": thread_id, "limit": 3})
        assert not [t for t in turns["data"] if t["status"] == "inProgress"]


async def test_a_stop_on_a_thread_without_a_goal_interrupts_its_turn_and_says_there_was_no_goal(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    hold = workspace / "release"
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread_id = (await harness.request("thread/start", {"cwd": str(workspace)}))["thread"]["id"]
        turn_id = (await harness.request("turn/start", {"threadId": thread_id,
                                                        "input": text_input(f"WAIT: {hold}")}))["turn"]["id"]
        await supervisor.request("thread/resume", {"threadId": thread_id, "excludeTurns": True,
                                                   "initialTurnsPage": {"limit": 1}})
        tm = Tillerman(supervisor, log, tmp_path)
        stop = tm.propose(thread_id=thread_id, mode="stop", text="stop")

        await tm.dispatch(stop)
        await tm.until(lambda: stop.finished)

        assert tm.moves(stop.intent)[-1] == ("effect_verified", "stop_verified")
        evidence = {h.reason: h.evidence for h in tm.history(stop.intent) if h.kind == "evidence"}
        assert evidence["goal_read"] == {"goal_status": None}
        assert evidence["turn_ended"] == {"turn_id": turn_id, "turn_status": "interrupted"}
        assert "goal_paused" not in evidence
        await log.wait_for(_turn_completed(thread_id, turn_id))


async def test_a_plain_interrupt_on_a_goal_thread_says_the_goal_is_still_active(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    hold = workspace / "release"
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread_id = (await harness.request("thread/start", {"cwd": str(workspace)}))["thread"]["id"]
        turn_id = (await harness.request("turn/start", {"threadId": thread_id,
                                                        "input": text_input(f"WAIT: {hold}")}))["turn"]["id"]
        tm = Tillerman(supervisor, log, tmp_path)
        await tm.subscribe(supervisor, thread_id)
        # The goal is set while the turn runs: its continuations would follow this turn.
        await harness.request("thread/goal/set", {"threadId": thread_id, "objective": "keep going",
                                                  "status": "active", "origin": "user"})
        await tm.until(lambda: tm.projection.snapshot(thread_id).goal_active
                       and tm.projection.snapshot(thread_id).active_turn_id == turn_id)
        interrupt = tm.propose(thread_id=thread_id, mode="interrupt", text="not this turn",
                               expected_turn=turn_id)

        await tm.dispatch(interrupt)
        await tm.until(lambda: interrupt.state is State.ACKNOWLEDGED)

        acknowledged = [h for h in tm.history(interrupt.intent) if h.kind == "transition"][-1]
        assert (acknowledged.reason, acknowledged.evidence) == (
            "turn_interrupted", {"turn_id": turn_id, "turn_status": "interrupted", "goal_active": True})
        goal = await supervisor.request("thread/goal/get", {"threadId": thread_id})
        assert goal["goal"]["status"] == "active"  # the one turn ended; the goal did not


def _client_ids_seen(log: EventLog, thread_id: str, start: int = 0) -> list[str | None]:
    """The clientId of every user message the thread started (``item/started``), in order."""
    return [m.params["item"].get("clientId") for m in log.messages[start:]
            if is_notification("item/started", threadId=thread_id)(m) and m.params["item"]["type"] == "userMessage"]


async def test_our_queued_message_a_stop_deleted_settles_expired_withdrawn_and_never_arrives(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    hold = workspace / "release"
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread_id = await _goal_thread(harness, supervisor, log, workspace)
        tm = Tillerman(supervisor, log, tmp_path)
        await tm.pump()
        # The person's message holds the turn it lands in (a new one, or folded into the
        # running goal turn): our queued message waits behind it, the goal's turns after.
        turn_id = (await harness.request("turn/start", {"threadId": thread_id,
                                                        "input": text_input(f"WAIT: {hold}")}))["turn"]["id"]
        queue = tm.propose(thread_id=thread_id, mode="queue", text="then summarize what you did")
        await tm.dispatch(queue)
        await tm.until(lambda: queue.state is State.QUEUED)
        await anyio.sleep(1.0)
        await tm.pump()
        assert queue.state is State.QUEUED and tm.projection.snapshot(thread_id).goal_active
        stop = tm.propose(thread_id=thread_id, mode="stop", text="stop until I look")

        await tm.dispatch(stop)
        await tm.until(lambda: stop.finished)
        assert tm.moves(stop.intent)[-1] == ("effect_verified", "stop_verified")
        [withdrawn] = [h.evidence for h in tm.history(stop.intent) if h.reason == "queue_withdrawn"]
        assert withdrawn["intent_id"] == queue.intent.id and withdrawn["deleted"] is True
        stopped_at = len(log.messages)

        assert (await tm.decide())[queue.intent.id] == ("reconcile", "withdrawn")
        settled = [h for h in tm.history(queue.intent) if h.kind == "transition"][-1]
        assert (settled.state, settled.reason, settled.evidence) == ("expired", "withdrawn",
                                                                     {"stop_intent_id": stop.intent.id})
        assert (await tm.decide()).get(queue.intent.id) is None  # settled: no longer decided
        await anyio.sleep(QUIET)
        await tm.pump()
        assert _turns_started(log, thread_id, start=stopped_at) == []
        assert queue.intent.client_user_message_id not in _client_ids_seen(log, thread_id)  # never delivered
        listed = await supervisor.request("thread/queue/list", {"threadId": thread_id})
        assert listed["data"] == []
        await log.wait_for(_turn_completed(thread_id, turn_id))


async def test_a_rules_queued_message_waits_on_a_stopped_thread_until_a_persons_turn(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread_id = await _goal_thread(harness, supervisor, log, workspace)
        tm = Tillerman(supervisor, log, tmp_path)
        await tm.pump()
        stop = tm.propose(thread_id=thread_id, mode="stop", text="stop until I look")
        await tm.dispatch(stop)
        await tm.until(lambda: stop.finished)
        assert tm.moves(stop.intent)[-1] == ("effect_verified", "stop_verified")
        assert tm.snapshot(thread_id).stopped_by == stop.intent.id, tm.goal_reports()

        nudge = tm.propose(thread_id=thread_id, mode="queue", text="carry on with the docs",
                           producer=f"rule:{RULE}", rule_id=RULE, rule_version=1)
        assert (await tm.decide())[nudge.intent.id] == ("observe", "thread_stopped")
        await anyio.sleep(3.0)  # held, round after round: nothing is sent, no turn starts
        await tm.pump()
        assert (await tm.decide())[nudge.intent.id] == ("observe", "thread_stopped")
        assert nudge.state is State.PROPOSED
        decisions = [(h.state, h.reason) for h in tm.history(nudge.intent) if h.kind == "decision"]
        assert decisions == [("observe", "thread_stopped")]  # recorded once, while it did not change

        # The person writes to the thread (another client's turn): it is resumed.
        person = (await harness.request("turn/start", {"threadId": thread_id,
                                                       "input": text_input("what is left to do?")}))["turn"]["id"]
        await tm.until(lambda: tm.snapshot(thread_id).stopped_by is None)
        assert (await tm.decide())[nudge.intent.id] == ("queue", "authorized")
        await tm.until(lambda: nudge.state is State.ACKNOWLEDGED)
        assert tm.snapshot(thread_id).turn_state(person) in ("completed", "unclosed")
        assert nudge.intent.client_user_message_id in _client_ids_seen(log, thread_id)
