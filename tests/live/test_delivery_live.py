"""The delivery protocol against the REAL Codex app-server (0.171.0 by default).

The harness owns each thread; tillerman is the second connection. What tillerman's
connection receives is normalized into a SQLite ledger and fed to each delivery
machine, whose commands go through the guarded adapter — the daemon's loop, in small.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer, EventLog, HarnessClient, is_item
from fixtures.scripted_model import ScriptedModel
from tests.live.test_appserver_live import _harness_and_supervisor, _start_turn, _subscribe, _turn_completed
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch, Observed, Reconcile
from tillerman.controller.core.intent_requests import intent_view, propose
from tillerman.controller.core.overdue import overdue
from tillerman.controller.dispatch.adapter import GuardedAdapter
from tillerman.controller.dispatch.driver import StaleDelivery, carry_out
from tillerman.ledger import projections
from tillerman.ledger.events import Envelope, Report
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import HistoryItem, IntentView
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.appserver_client import AppServerClient
from tillerman.monitor.appserver_events import AppServerEvents, natural_key
from tillerman.monitor.jsonrpc import Notification, ServerRequest
from tillerman.rules.ruleset import Grant, build_ruleset

pytestmark = [pytest.mark.live, pytest.mark.anyio]

OWNER = "ann"
GRANTS = build_ruleset((), (Grant(subject=f"owner:{OWNER}", actions=frozenset({"steer", "queue", "interrupt"})),))


class LosesQueueAddReply:
    """Sends ``thread/queue/add`` for real, then acts as if its reply never came (a crash
    or a dropped connection right after the send)."""

    def __init__(self, client: AppServerClient):
        self.client = client

    async def request(self, method: str, params: dict | None = None, timeout: float = 10.0):
        result = await self.client.request(method, params, timeout)
        if method == "thread/queue/add":
            raise TimeoutError
        return result


class HoldsQueueAdd:
    """Acts as if ``thread/queue/add`` timed out, and holds it back: the test delivers it
    later (``land``), as a slow server that answers too late would process it."""

    def __init__(self, client: AppServerClient):
        self.client = client
        self.held: list[dict] = []

    async def request(self, method: str, params: dict | None = None, timeout: float = 10.0):
        if method == "thread/queue/add":
            self.held.append(params)
            raise TimeoutError
        return await self.client.request(method, params, timeout)

    async def land(self) -> None:
        for params in self.held:
            await self.client.request("thread/queue/add", params)


class Tillerman:
    """The daemon's loop, in small: notifications → ledger → machines → guarded adapter."""

    def __init__(self, client: AppServerClient, log: EventLog, tmp_path: Path):
        self.log = log
        self.recorder = SQLiteRecorder(tmp_path / "ledger.sqlite3")
        self.adapter = GuardedAdapter(client, self.recorder, GRANTS, timeout=5.0)
        self.machines: list[Delivery] = []
        self._mapping = AppServerEvents()
        self._read = 0

    def propose(self, **request) -> Delivery:
        intent = propose(self.recorder, owner=OWNER, **request)
        machine = Delivery(intent)
        self.machines.append(machine)
        return machine

    async def dispatch(self, machine: Delivery, active_turn: str | None = None) -> None:
        await carry_out(machine, Dispatch(time.time(), uuid.uuid4().hex, active_turn), self.recorder, self.adapter)

    async def pump(self) -> None:
        """Record what arrived and feed it to every machine."""
        while self._read < len(self.log.messages):
            message = self.log.messages[self._read]
            self._read += 1
            if not isinstance(message, Notification | ServerRequest):
                continue
            for event in self._mapping.normalize(message.raw):
                key = natural_key(event, message.raw.get("emittedAtMs"))
                self.recorder.append([Envelope(event_id=key, event=event, source="appserver", at=time.time())])
                for machine in self.machines:
                    await carry_out(machine, Observed(event, time.time()), self.recorder, self.adapter)

    async def until(self, done, timeout: float = 30.0) -> None:
        with anyio.fail_after(timeout):
            while True:
                await self.pump()
                if done():
                    return
                await self.log.wait_for(lambda _: True, start=self._read)

    async def until_a_command_runs(self) -> None:
        await self.until(lambda: any(is_item("item/started", "commandExecution")(m) for m in self.log.messages))

    def state(self, intent: Intent) -> str:
        return intent_view(self.recorder, intent.id).state

    def moves(self, intent: Intent) -> list[tuple[str, str]]:
        return [(h.state, h.reason) for h in intent_view(self.recorder, intent.id).history if h.kind != "evidence"]

    def evidence(self, intent: Intent) -> list[tuple[str, dict]]:
        return [(h.reason, h.evidence) for h in intent_view(self.recorder, intent.id).history if h.kind == "evidence"]

    def reports(self) -> list[Report]:
        return [e.envelope.event for e in self.recorder.read() if isinstance(e.envelope.event, Report)]


async def _tillerman_beside(harness: HarnessClient, supervisor: AppServerClient, log: EventLog,
                            workspace: Path, tmp_path: Path, prompt: str) -> tuple[dict, str, Tillerman]:
    """A harness thread whose first turn runs ``prompt``, subscribed to by tillerman's connection,
    and the daemon's loop in small on that connection: the thread, the turn's id, the loop."""
    thread, turn_id = await _start_turn(harness, workspace, prompt)
    await _subscribe(supervisor, log, thread["id"])
    return thread, turn_id, Tillerman(supervisor, log, tmp_path)


def _reached_model(model: ScriptedModel, text: str) -> int:
    return sum(1 for r in model.requests if r.last_user_text and text in r.last_user_text)


async def test_steer_is_queued_then_acknowledged_by_its_echo_in_the_expected_turn(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread, turn_id, tm = await _tillerman_beside(harness, supervisor, log, workspace, tmp_path, "RUN: sleep 1")
        await tm.until_a_command_runs()
        steer = tm.propose(thread_id=thread["id"], mode="steer", text="also run the linter", expected_turn=turn_id)

        await tm.dispatch(steer)
        assert tm.state(steer.intent) == "queued"  # accepted, not yet delivered
        await tm.until(lambda: steer.state is State.ACKNOWLEDGED)

        assert tm.moves(steer.intent) == [("proposed", "owner:ann"), ("dispatch_unknown", "dispatching"),
                                          ("queued", "accepted"), ("acknowledged", "echo")]
        acknowledged = intent_view(tm.recorder, steer.intent.id).history[-1]
        assert acknowledged.evidence["turn_id"] == turn_id
        await log.wait_for(_turn_completed(thread["id"], turn_id))
    assert _reached_model(scripted_model, "also run the linter") == 1


async def test_steer_at_a_stale_turn_is_rejected_and_reaches_no_model(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        gate = workspace / "release-first"
        thread, first_turn = await _start_turn(harness, workspace, f"WAIT: {gate}")  # running until subscribed
        await _subscribe(supervisor, log, thread["id"])
        gate.touch()
        await log.wait_for(_turn_completed(thread["id"], first_turn))
        second = await harness.request("turn/start", {"threadId": thread["id"], "input": [
            {"type": "text", "text": "RUN: sleep 1"}]})
        second_turn = second["turn"]["id"]
        tm = Tillerman(supervisor, log, tmp_path)
        await tm.until_a_command_runs()
        stale = tm.propose(thread_id=thread["id"], mode="steer", text="aimed at the old turn",
                           expected_turn=first_turn)

        await tm.dispatch(stale)
        history = intent_view(tm.recorder, stale.intent.id).history
        assert (history[-1].state, history[-1].reason) == ("rejected", "stale_turn")
        assert (history[-1].evidence["expected_turn_id"], history[-1].evidence["found_turn_id"]) == (
            first_turn, second_turn)
        await tm.dispatch(stale)  # the delivery step again: final, never retried against the new turn
        await tm.until(lambda: any(_turn_completed(thread["id"], second_turn)(m) for m in log.messages))
        assert tm.state(stale.intent) == "rejected"
    assert _reached_model(scripted_model, "aimed at the old turn") == 0


async def test_interrupt_ends_the_turn_and_terminates_only_its_command(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    marker = workspace / "side-effect"
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        # An earlier turn, interrupted by the harness, leaves its command running: not ours to end.
        thread, earlier_turn = await _start_turn(harness, workspace, "RUN: sleep 5")
        await _subscribe(supervisor, log, thread["id"])
        earlier_item = (await log.wait_for(is_item("item/started", "commandExecution"))).params["item"]["id"]
        await harness.request("turn/interrupt", {"threadId": thread["id"], "turnId": earlier_turn})
        await log.wait_for(_turn_completed(thread["id"], earlier_turn))
        started = await harness.request("turn/start", {"threadId": thread["id"], "input": [
            {"type": "text", "text": f"RUN: sleep 2; touch {marker.name}"}]})
        turn_id = started["turn"]["id"]
        tm = Tillerman(supervisor, log, tmp_path)
        stop = tm.propose(thread_id=thread["id"], mode="interrupt", text="stop: wrong approach",
                          expected_turn=turn_id)
        await tm.until(lambda: any(is_item("item/started", "commandExecution")(m) and m.params["turnId"] == turn_id
                                   for m in log.messages))
        command_started = time.monotonic()

        await tm.dispatch(stop)
        await tm.until(lambda: stop.finished)  # acknowledged, terminated, and the process reported its exit
        assert tm.moves(stop.intent)[1:] == [("dispatch_unknown", "dispatching"), ("queued", "accepted"),
                                             ("acknowledged", "turn_interrupted")]
        evidence = dict(tm.evidence(stop.intent))
        assert evidence["terminals_listed"] == {"listed": 2, "of_interrupted_turn": 1}
        assert evidence["terminate_requested"]["item_id"] != earlier_item
        assert evidence["terminated"]["terminated"] is True
        assert evidence["late_item_completed"]["status"] == "failed"
        await anyio.sleep(max(0.0, 2.5 - (time.monotonic() - command_started)))
        assert not marker.exists()
        # The earlier turn's terminal was left alone: the server still lists it.
        listed = await supervisor.request("thread/backgroundTerminals/list", {"threadId": thread["id"]})
        assert [t["itemId"] for t in listed["data"]] == [earlier_item]


def acknowledgment(view: IntentView) -> HistoryItem:
    """The move to ``acknowledged``: not the last record, when a readback settled the
    intent before the live echo, which then follows as evidence."""
    return next(h for h in view.history if h.kind == "transition" and h.state == State.ACKNOWLEDGED)


async def test_queue_intent_is_added_once_and_acknowledged_when_its_turn_starts(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread, first_turn, tm = await _tillerman_beside(harness, supervisor, log, workspace, tmp_path, "RUN: sleep 1")
        lost_reply = tm.propose(thread_id=thread["id"], mode="queue", text="then update the changelog")
        tm.adapter.client = LosesQueueAddReply(supervisor)
        await tm.dispatch(lost_reply)
        tm.adapter.client = supervisor
        assert tm.state(lost_reply.intent) == "dispatch_unknown"  # added, but tillerman cannot know

        # A restart rebuilds the machine from the ledger; reconciling finds the entry: no second add.
        later = Delivery.from_view(intent_view(tm.recorder, lost_reply.intent.id))
        tm.machines = [later]
        await carry_out(later, Reconcile(time.time()), tm.recorder, tm.adapter)
        assert tm.moves(later.intent)[-1] == ("queued", "accepted")
        assert intent_view(tm.recorder, later.intent.id).history[-1].evidence["found_in_queue"] is True
        # The delivery step runs again: from the live machine, from one rebuilt from the
        # ledger, and from a stale copy that still believes the intent is proposed.
        await tm.dispatch(later)
        await tm.dispatch(Delivery.from_view(intent_view(tm.recorder, later.intent.id)))
        with pytest.raises(StaleDelivery):
            await tm.dispatch(Delivery(later.intent))
        queue = await supervisor.request("thread/queue/list", {"threadId": thread["id"]})
        assert [e["clientUserMessageId"] for e in queue["data"]] == [later.intent.client_user_message_id]

        await tm.until(lambda: later.state is State.ACKNOWLEDGED)
        acknowledged = acknowledgment(intent_view(tm.recorder, later.intent.id))
        assert acknowledged.reason == "queue_turn_started"
        assert acknowledged.evidence["turn_id"] not in (None, first_turn)
        await log.wait_for(_turn_completed(thread["id"], acknowledged.evidence["turn_id"]))
    assert _reached_model(scripted_model, "then update the changelog") == 1


async def test_queue_add_of_unknown_outcome_outlives_its_ack_deadline_and_is_found_when_it_lands(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    """The add's reply never comes and the add itself is slow to land: past the ack
    deadline the queue and the turns show nothing, yet the intent stays unknown
    (overdue, not expired), and is acknowledged when the add lands and its turn starts."""
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread, turn_id, tm = await _tillerman_beside(harness, supervisor, log, workspace, tmp_path, "RUN: sleep 3")
        slow = HoldsQueueAdd(supervisor)
        tm.adapter.client = slow
        queued = tm.propose(thread_id=thread["id"], mode="queue", text="a late add: then tag the release", ack_deadline=1.0)
        await tm.dispatch(queued, active_turn=turn_id)
        tm.adapter.client = supervisor
        assert tm.state(queued.intent) == "dispatch_unknown"

        await anyio.sleep(1.5)  # past the ack deadline: absent everywhere, still unknown
        await carry_out(queued, Reconcile(time.time()), tm.recorder, tm.adapter)
        assert tm.state(queued.intent) == "dispatch_unknown"
        assert overdue(projections.load(tm.recorder), time.time())[0].intent_id == queued.intent.id

        await slow.land()  # the add lands late: it waits behind the running turn, then starts its own
        await tm.until(lambda: queued.state is State.ACKNOWLEDGED)
        acknowledged = acknowledgment(intent_view(tm.recorder, queued.intent.id))
        assert (acknowledged.reason, acknowledged.evidence["turn_id"] != turn_id) == ("echo", True)
        await log.wait_for(_turn_completed(thread["id"], acknowledged.evidence["turn_id"]))
    assert _reached_model(scripted_model, "a late add: then tag the release") == 1


async def test_queue_add_never_sent_is_not_delivered_once_the_turn_it_waits_behind_ends(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    """Recorded, never sent (its reply lost with it): when the turn it waited behind ends,
    the server has drained its queue, and the readback finding it nowhere settles it."""
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread, turn_id, tm = await _tillerman_beside(harness, supervisor, log, workspace, tmp_path, "RUN: sleep 2")
        tm.adapter.client = HoldsQueueAdd(supervisor)  # held for good: never sent
        lost = tm.propose(thread_id=thread["id"], mode="queue", text="never heard of", ack_deadline=60.0)
        await tm.dispatch(lost, active_turn=turn_id)
        tm.adapter.client = supervisor
        await carry_out(lost, Reconcile(time.time()), tm.recorder, tm.adapter)
        assert tm.state(lost.intent) == "dispatch_unknown"  # the turn it waits behind still runs

        await tm.until(lambda: any(_turn_completed(thread["id"], turn_id)(m) for m in log.messages))
        await carry_out(lost, Reconcile(time.time()), tm.recorder, tm.adapter)
        move = intent_view(tm.recorder, lost.intent.id).history[-1]
        assert (move.state, move.reason, move.evidence["behind_turn"]) == ("expired", "not_delivered", turn_id)
    assert _reached_model(scripted_model, "never heard of") == 0


async def test_steer_accepted_then_lost_to_an_interrupt_expires_lost_after_accept(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread, turn_id, tm = await _tillerman_beside(harness, supervisor, log, workspace, tmp_path, "RUN: sleep 1")
        await tm.until_a_command_runs()
        steer = tm.propose(thread_id=thread["id"], mode="steer", text="never heard", expected_turn=turn_id)

        await tm.dispatch(steer)
        assert tm.state(steer.intent) == "queued"
        # The harness interrupts before the next model call: the accepted steer is dropped.
        await harness.request("turn/interrupt", {"threadId": thread["id"], "turnId": turn_id})
        await tm.until(lambda: steer.state is State.EXPIRED)

        assert tm.moves(steer.intent)[-1] == ("expired", "lost_after_accept")
        assert [r.finding for r in tm.reports()] == ["lost_after_accept"]
    assert _reached_model(scripted_model, "never heard") == 0
