"""Restart planning as functions of the projection: what to read back, what it shows, what to reconcile."""

from __future__ import annotations

from tests.controller.test_adapter import NEXT_TURN, NOW, THREAD, TURN, ledger_with, make_intent, mark_dispatching
from tillerman.controller.core.facts import Reconcile
from tillerman.controller.core.intent_requests import proposal_envelopes, transition_envelope
from tillerman.controller.core.reconcile import (
    read_back,
    reconcile_fact,
    seen,
    turn_items,
    turns_to_read_back,
    under_way,
    verify_due,
)
from tillerman.ledger import projections
from tillerman.ledger.events import Envelope, ItemStarted, ThreadStarted, TurnCompleted, TurnStarted, UserMessage
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import IntentView, Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.codex_wire import parse_turn_page

SOURCE = "appserver:test"


def observe(recorder: SQLiteRecorder, *events) -> Projection:
    recorder.append([Envelope(event_id=f"later-{recorder.max_seq()}-{i}", event=e, source="appserver", at=NOW)
                     for i, e in enumerate(events)])
    return projections.load(recorder)


def move(recorder: SQLiteRecorder, intent: Intent, states: list[tuple[State, State, str, dict]]) -> IntentView:
    recorder.append([transition_envelope(intent, old, new, reason, evidence, NOW) for old, new, reason, evidence
                     in states])
    return projections.load(recorder).intents[intent.id]


# -- what to read back ------------------------------------------------------------------


def test_a_thread_never_seen_is_read_back_to_record_it_seen() -> None:
    recorder = SQLiteRecorder()
    recorder.append(proposal_envelopes(make_intent("queue"), Projection()))  # nothing of the thread observed
    assert turns_to_read_back(projections.load(recorder)) == {THREAD: set()}


def test_an_expected_turn_still_running_is_read_back_and_an_ended_one_is_not() -> None:
    recorder = ledger_with(make_intent())  # the expected turn started, never ended
    assert turns_to_read_back(projections.load(recorder)) == {THREAD: {TURN}}
    assert turns_to_read_back(observe(recorder, TurnCompleted(thread_id=THREAD, turn_id=TURN))) == {}


# -- what a readback shows --------------------------------------------------------------


def test_a_readback_records_the_end_of_the_turns_asked_about_once() -> None:
    recorder = ledger_with(make_intent())
    projection = projections.load(recorder)
    listed = parse_turn_page({"data": [{"id": TURN, "status": "interrupted"}, {"id": NEXT_TURN, "status": "completed"},
                                       {"id": "turn-3", "status": "weird"}, "not a turn"]}).turns
    envelopes = read_back(projection, THREAD, listed, {TURN}, SOURCE)
    assert [(e.event_id, e.event, e.source, e.at) for e in envelopes] == [(
        f"rb-turn-ended:{THREAD}:{TURN}:interrupted", TurnCompleted(thread_id=THREAD, turn_id=TURN,
                                                                    status="interrupted"), SOURCE, None)]
    recorder.append(envelopes)
    assert read_back(projections.load(recorder), THREAD, listed, {TURN}, SOURCE) == []


def test_seen_records_an_unknown_thread_and_only_turns_with_a_known_status() -> None:
    listed = parse_turn_page({"data": [{"id": "x", "status": "completed"}, {"id": "y", "status": "inProgress"},
                                       {"id": 3, "status": "failed"}]}).turns
    envelopes = seen(Projection(), "t-9", listed, SOURCE)
    assert [e.event for e in envelopes] == [
        ThreadStarted(thread_id="t-9", source_format="appserver"),
        TurnCompleted(thread_id="t-9", turn_id="x", status="completed")]
    assert seen(Projection(), "t-9", parse_turn_page(None).turns, SOURCE)[1:] == []



# -- what to reconcile ------------------------------------------------------------------


def test_only_deliveries_under_way_are_reconciled() -> None:
    proposed, unknown, queued = make_intent(), make_intent(), make_intent("queue")
    recorder = ledger_with(proposed)
    recorder.append([*proposal_envelopes(unknown, Projection()), *proposal_envelopes(queued, Projection())])
    mark_dispatching(recorder, unknown)
    mark_dispatching(recorder, queued)
    move(recorder, queued, [(State.DISPATCH_UNKNOWN, State.QUEUED, "accepted", {})])
    assert {v.intent.id for v in under_way(projections.load(recorder))} == {unknown.id, queued.id}


def test_the_reconcile_fact_names_the_expected_turn_the_echo_and_the_turn_waited_behind() -> None:
    intent = make_intent("queue")
    recorder = ledger_with(intent, ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="call-1",
                                               item_type="commandExecution"))
    recorder.append([transition_envelope(intent, State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching",
                                         {"attempt": "a1", "mode": "queue", "behind_turn": TURN}, NOW)])
    projection = observe(recorder, TurnCompleted(thread_id=THREAD, turn_id=TURN),
                         TurnStarted(thread_id=THREAD, turn_id=NEXT_TURN),
                         UserMessage(thread_id=THREAD, turn_id=NEXT_TURN, digest="d", size=1,
                                     client_id=intent.client_user_message_id))
    view = projection.intents[intent.id]
    assert reconcile_fact(projection, view, NOW + 5) == Reconcile(
        NOW + 5, None, NEXT_TURN, frozenset(), echo_turn_state="active", behind_turn_state="completed")


def test_turn_items_are_the_running_items_of_the_expected_turn() -> None:
    intent = make_intent("interrupt")
    recorder = ledger_with(intent, ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="call-1",
                                               item_type="commandExecution"),
                           ItemStarted(thread_id=THREAD, turn_id="turn-0", item_id="call-0",
                                       item_type="commandExecution"))
    projection = projections.load(recorder)
    assert turn_items(projection, projection.intents[intent.id]) == frozenset({"call-1"})


def test_verify_is_due_once_the_acknowledging_turn_has_ended() -> None:
    intent = make_intent(verify="true")
    recorder = ledger_with(intent)
    mark_dispatching(recorder, intent)
    view = move(recorder, intent, [(State.DISPATCH_UNKNOWN, State.ACKNOWLEDGED, "echo", {"turn_id": TURN})])
    assert not verify_due(projections.load(recorder), view)
    assert verify_due(observe(recorder, TurnCompleted(thread_id=THREAD, turn_id=TURN)), view)
