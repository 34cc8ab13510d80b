"""A stopped thread stays stopped, from the stop's record to the decisions it leads to:
a queued message the stop withdrew settles ``expired withdrawn`` naming the stop, and a
rule's later intent is held ``thread_stopped`` until a person resumes the thread."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.controller.test_delivery import NOW, THREAD, make_intent
from tests.controller.test_stop import Stop, Thread
from tillerman.controller.cli.main import main
from tillerman.controller.core.commands import QueueAdd, QueueList
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch, Replied
from tillerman.controller.core.intent_requests import proposal_envelopes
from tillerman.controller.core.reconcile import reconcile_fact
from tillerman.controller.core.stop import machine_from_view
from tillerman.controller.core.supervisor import Step
from tillerman.ledger.events import Envelope, GoalUpdated, TurnStarted, UserMessage
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.codex_wire import QueuedSubmission, QueuePage
from tillerman.rules.decision import Action, Decision
from tillerman.rules.policy import decide
from tillerman.rules.ruleset import Grant, build_ruleset

GRANTS = build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"queue", "stop"})),
                            Grant(subject="reviewer:rex", actions=frozenset({"queue"}))))


def queued_behind_the_turn(stop: Stop) -> Delivery:
    """A queue intent of ours, accepted into the server's queue behind turn-9 (in the
    stop's record, on the stop's thread)."""
    queue = Delivery(make_intent("queue", producer="owner:ann"))
    stop.record.append(proposal_envelopes(queue.intent, Projection()))
    listed = queue.handle(Dispatch(NOW, "q-a", "turn-9"))
    added = queue.handle(Replied(listed.commands[0], QueuePage(()), NOW + 0.1))
    assert isinstance(listed.commands[0], QueueList) and isinstance(added.commands[0], QueueAdd)
    accepted = queue.handle(Replied(added.commands[0], QueuedSubmission("q1"), NOW + 0.2))
    stop.record.append(listed.envelopes + accepted.envelopes)
    assert stop.record.view(queue.intent.id).state is State.QUEUED
    return queue


def test_a_queued_message_the_stop_deleted_settles_expired_withdrawn_naming_the_stop() -> None:
    stop = Stop(Thread(queue=[]))
    queue = queued_behind_the_turn(stop)
    stop.thread.queue = [("q1", queue.intent.client_user_message_id)]
    stop.run(Dispatch(NOW + 1, "a1", "turn-9"))
    assert stop.thread.queue == [] and stop.moves()[-1] == ("effect_verified", "stop_verified")

    projection = stop.record.projection
    view = projection.intents[queue.intent.id]
    later = NOW + 200  # past its ack deadline: it was reported overdue, waiting for an echo that cannot come
    decision = decide(view.intent, view.state, projection.snapshot(THREAD), later, GRANTS)
    assert (decision.action, decision.reason) == (Action.RECONCILE, "withdrawn")

    machine = machine_from_view(view)  # as after a restart: the ledger's record is enough
    stop.record.append(machine.handle(reconcile_fact(projection, view, later)).envelopes)
    settled = [h for h in stop.record.view(queue.intent.id).history if h.kind == "transition"][-1]
    assert (settled.state, settled.reason, settled.evidence) == ("expired", "withdrawn",
                                                                 {"stop_intent_id": stop.intent.id})
    assert machine.finished and projection.snapshot(THREAD).withdrawn == {}


def test_a_message_of_another_writer_the_stop_left_settles_nothing() -> None:
    stop = Stop(Thread(queue=[("q2", "tui-message-7")]))
    queue = queued_behind_the_turn(stop)  # ours is not in the server's queue any more (delivered)
    stop.run(Dispatch(NOW + 1, "a1", "turn-9"))
    view = stop.record.view(queue.intent.id)
    assert stop.record.projection.snapshot(THREAD).withdrawn == {}
    assert reconcile_fact(stop.record.projection, view, NOW + 2).withdrawn_by is None


def test_a_reviewers_queue_on_the_stopped_thread_is_held_and_recorded_until_a_persons_turn() -> None:
    stop = Stop(Thread(queue=[]))
    stop.run(Dispatch(NOW, "a1", "turn-9"))
    projection = stop.record.projection
    assert projection.snapshot(THREAD).stopped_by == stop.intent.id
    later = make_intent("queue", producer="reviewer:rex")
    stop.record.append(proposal_envelopes(later, projection))
    step = Step(GRANTS, replay=False)

    envelopes, decided = step.decide_intents(projection, [projection.intents[later.id]], NOW + 10)
    assert [d for _, d in decided] == [Decision(action=Action.OBSERVE, reason="thread_stopped")]
    assert [(e.event.action, e.event.reason) for e in envelopes] == [("observe", "thread_stopped")]  # recorded
    stop.record.append(envelopes)

    # A person opens a turn on the thread (another client's message): the thread is resumed.
    stop.record.append([Envelope(event_id=f"person:{i}", event=event, source="appserver:ws", at=NOW + 20)
                        for i, event in enumerate((TurnStarted(thread_id=THREAD, turn_id="turn-10"),
                                                   UserMessage(thread_id=THREAD, turn_id="turn-10", digest="d",
                                                               size=1, client_id=None, item_id="m1")))])
    _, decided = step.decide_intents(projection, [projection.intents[later.id]], NOW + 21)
    assert [d for _, d in decided] == [Decision(action=Action.QUEUE, reason="authorized")]
    assert projection.snapshot(THREAD).stopped_by is None


def test_status_shows_a_stopped_thread_until_a_person_resumes_it(tmp_path) -> None:
    stop = Stop(Thread(queue=[]))
    stop.run(Dispatch(NOW, "a1", "turn-9"))
    ledger = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(ledger) as rec:
        rec.append(list(stop.record.stored.values()))
    (row,) = json.loads(run("status", "--json", "--ledger", str(ledger)))["threads"]
    assert row["stopped_by"] == stop.intent.id
    text = run("status", "--ledger", str(ledger))
    assert "-, stopped" in text and f"thread {THREAD}: stopped by intent {stop.intent.id};" in text

    with SQLiteRecorder(ledger) as rec:  # the person sets the goal active again in their TUI
        rec.append([Envelope(event_id="goal-again", event=GoalUpdated(thread_id=THREAD, status="active"),
                             source="appserver:ws", at=NOW + 30)])
    (row,) = json.loads(run("status", "--json", "--ledger", str(ledger)))["threads"]
    assert row["stopped_by"] is None
    assert "stopped" not in run("status", "--ledger", str(ledger))


def run(*args: str) -> str:
    out = CliRunner().invoke(main, list(args))
    assert out.exit_code == 0, out.output
    return out.output
