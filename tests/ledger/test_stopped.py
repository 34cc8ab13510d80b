"""A stopped thread stays stopped, as the fold keeps it (``tillerman.ledger.stopped``):
which stop stopped a thread, what resumes it, and the queued messages a stop withdrew."""

from __future__ import annotations

from itertools import count

import msgspec
import pytest

from tillerman.ledger.events import (
    AgentMessage,
    Entry,
    Envelope,
    Event,
    GoalUpdated,
    IntentEvidence,
    IntentProposed,
    IntentTransition,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import Projection

THREAD = "t1"
LIVE, ROLLOUT = "appserver:ws", "rollout:/tmp/r.jsonl"
_seq = count(1)


def intent(intent_id: str, mode: str, producer: str = "owner:ann") -> Intent:
    return Intent(id=intent_id, thread_id=THREAD, mode=mode, text="x", text_digest="d", created_at=0.0,
                  ack_deadline=10.0, expires_at=100.0, producer=producer,
                  expected_turn_id="u1" if mode in ("steer", "interrupt") else None)


STOP = intent("in-stop", "stop")
RULE_QUEUE = intent("in-rule", "queue", "rule:nudge")


def apply(p: Projection, *events: Event, source: str = LIVE) -> Projection:
    for event in events:
        seq = next(_seq)
        p.apply(Entry(seq=seq, envelope=Envelope(event_id=f"e{seq}", event=event, source=source, at=float(seq)),
                      prev_hash="", hash=""))
    return p


def proposed(i: Intent) -> IntentProposed:
    return IntentProposed(thread_id=THREAD, intent=i)


def moved(i: Intent, *path: tuple[str, str, str]) -> list[IntentTransition]:
    return [IntentTransition(thread_id=THREAD, intent_id=i.id, from_state=a, to_state=b, reason=r) for a, b, r in path]


DISPATCHED = ("proposed", "dispatch_unknown", "dispatching")
APPLIED = ("dispatch_unknown", "acknowledged", "stop_applied")
VERIFIED = ("acknowledged", "effect_verified", "stop_verified")


def stopped_thread() -> Projection:
    """A thread whose turn u0 a stop ended and whose goal it paused, verified."""
    return apply(Projection(), TurnStarted(thread_id=THREAD, turn_id="u0"), proposed(STOP), proposed(RULE_QUEUE),
                 *moved(STOP, DISPATCHED),
                 GoalUpdated(thread_id=THREAD, status="paused", by="tillerman"),
                 TurnCompleted(thread_id=THREAD, turn_id="u0", status="interrupted"),
                 *moved(STOP, APPLIED, VERIFIED))


def user(turn: str, client_id: str | None) -> UserMessage:
    return UserMessage(thread_id=THREAD, turn_id=turn, digest="d", size=1, client_id=client_id, item_id=f"m-{turn}")


def test_a_stop_under_way_does_not_stop_the_thread_its_carried_out_steps_do() -> None:
    p = apply(Projection(), TurnStarted(thread_id=THREAD, turn_id="u0"), proposed(STOP), *moved(STOP, DISPATCHED))
    assert p.snapshot(THREAD).stopped_by is None
    apply(p, *moved(STOP, APPLIED))
    assert p.snapshot(THREAD).stopped_by == STOP.id
    apply(p, *moved(STOP, VERIFIED))
    assert p.snapshot(THREAD).stopped_by == STOP.id


def test_a_rejected_stop_stops_nothing() -> None:
    p = apply(Projection(), proposed(STOP), *moved(STOP, DISPATCHED, ("dispatch_unknown", "rejected", "thread_not_found")))
    assert p.snapshot(THREAD).stopped_by is None


@pytest.mark.parametrize(("what", "events", "source"), [
    ("tillerman's own queued message opens a turn",
     [TurnStarted(thread_id=THREAD, turn_id="u1"), user("u1", "tillerman-in-rule")], LIVE),
    ("a turn that opens with the model (a continuation)",
     [TurnStarted(thread_id=THREAD, turn_id="u1"),
      AgentMessage(thread_id=THREAD, turn_id="u1", digest="d", size=1, item_id="a1")], LIVE),
    ("a person's turn read from a rollout (it may be from before the stop)",
     [TurnStarted(thread_id=THREAD, turn_id="u1"), user("u1", None)], ROLLOUT),
    ("the goal set active, read from a rollout", [GoalUpdated(thread_id=THREAD, status="active")], ROLLOUT),
    ("a goal report that is not active", [GoalUpdated(thread_id=THREAD, status="complete")], LIVE),
    ("the goal reported active at the end of a turn (the stop's interrupted one: not a set)",
     [GoalUpdated(thread_id=THREAD, turn_id="t1", status="active")], LIVE),
])
def test_what_does_not_resume_a_stopped_thread(what: str, events: list[Event], source: str) -> None:
    p = apply(stopped_thread(), *events, source=source)
    assert p.snapshot(THREAD).stopped_by == STOP.id, what


def test_a_rules_queue_being_sent_does_not_resume_it_a_persons_does() -> None:
    p = apply(stopped_thread(), *moved(RULE_QUEUE, DISPATCHED))
    assert p.snapshot(THREAD).stopped_by == STOP.id
    interrupt = intent("in-int", "interrupt")
    apply(p, proposed(interrupt), *moved(interrupt, DISPATCHED))
    assert p.snapshot(THREAD).stopped_by == STOP.id  # ending a turn gives the agent no work
    queue = intent("in-ann", "queue")
    apply(p, proposed(queue))
    assert p.snapshot(THREAD).stopped_by == STOP.id  # proposed is not sent: it may be refused
    apply(p, *moved(queue, DISPATCHED))
    assert p.snapshot(THREAD).stopped_by is None


@pytest.mark.parametrize(("what", "events"), [
    ("a turn opened by another writer's message", [TurnStarted(thread_id=THREAD, turn_id="u1"), user("u1", None)]),
    ("another client's queued message opens a turn",
     [TurnStarted(thread_id=THREAD, turn_id="u1"), user("u1", "tui-message-7")]),
    ("the goal set active by another client", [GoalUpdated(thread_id=THREAD, status="active")]),
])
def test_a_person_resumes_a_stopped_thread(what: str, events: list[Event]) -> None:
    p = apply(stopped_thread(), *events)
    assert p.snapshot(THREAD).stopped_by is None, what


def test_a_goal_still_reported_active_is_no_resumption() -> None:
    """A stop that could not pause the goal (a release without goals): the goal reported
    active again at a turn's end is no change of status, so nobody resumed anything."""
    p = apply(Projection(), GoalUpdated(thread_id=THREAD, status="active"), proposed(STOP),
              *moved(STOP, DISPATCHED, APPLIED), GoalUpdated(thread_id=THREAD, status="active"))
    assert p.snapshot(THREAD).stopped_by == STOP.id


def test_a_stop_after_a_resumption_stops_the_thread_again() -> None:
    p = apply(stopped_thread(), GoalUpdated(thread_id=THREAD, status="active"))
    again = intent("in-stop-2", "stop", "rule:guard")
    apply(p, proposed(again), *moved(again, DISPATCHED, APPLIED))
    assert p.snapshot(THREAD).stopped_by == again.id


def withdrawn(deleted: bool, queue_intent: str = RULE_QUEUE.id) -> IntentEvidence:
    return IntentEvidence(thread_id=THREAD, intent_id=STOP.id, state="dispatch_unknown", reason="queue_withdrawn",
                          evidence={"intent_id": queue_intent, "submission_id": "q1", "deleted": deleted})


def test_a_queued_message_a_stop_deleted_is_withdrawn_until_its_intent_settles() -> None:
    p = apply(Projection(), proposed(STOP), proposed(RULE_QUEUE),
              *moved(RULE_QUEUE, DISPATCHED, ("dispatch_unknown", "queued", "accepted")),
              *moved(STOP, DISPATCHED), withdrawn(deleted=True))
    assert p.snapshot(THREAD).withdrawn == {RULE_QUEUE.id: STOP.id}
    apply(p, *moved(RULE_QUEUE, ("queued", "expired", "withdrawn")))
    assert p.snapshot(THREAD).withdrawn == {}


@pytest.mark.parametrize(("what", "evidence"), [
    ("the delete found the message gone (delivered, or deleted before)", withdrawn(deleted=False)),
    ("the queue intent is settled already", withdrawn(deleted=True, queue_intent="in-ack")),
    ("no intent of that id", withdrawn(deleted=True, queue_intent="in-unknown")),
])
def test_what_is_not_withdrawn(what: str, evidence: IntentEvidence) -> None:
    acknowledged = msgspec.structs.replace(RULE_QUEUE, id="in-ack")
    p = apply(Projection(), proposed(STOP), proposed(RULE_QUEUE), proposed(acknowledged),
              *moved(acknowledged, DISPATCHED, ("dispatch_unknown", "acknowledged", "echo")),
              *moved(STOP, DISPATCHED), evidence)
    assert p.snapshot(THREAD).withdrawn == {}, what
