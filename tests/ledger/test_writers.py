"""Several writers on one thread, as the fold keeps them (``tillerman.ledger.writers``)."""

from __future__ import annotations

from itertools import count

from tillerman.ledger.events import (
    AgentMessage,
    Entry,
    Envelope,
    Event,
    ItemStarted,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)
from tillerman.ledger.projections import Projection
from tillerman.ledger.writers import OTHER, TILLERMAN, WRITER_FACTS

THREAD = "t1"
OURS = "tillerman-in-00000000000000000001"
_seq = count(1)


def fold(*events: Event, source: str = "appserver:ws") -> Projection:
    projection = Projection()
    for at, event in enumerate(events, start=100):
        seq = next(_seq)
        projection.apply(Entry(seq=seq, envelope=Envelope(event_id=f"e{seq}", event=event, source=source, at=float(at)),
                               prev_hash="", hash=""))
    return projection


def started(turn: str) -> TurnStarted:
    return TurnStarted(thread_id=THREAD, turn_id=turn)


def ended(turn: str) -> TurnCompleted:
    return TurnCompleted(thread_id=THREAD, turn_id=turn, status="completed")


def user(turn: str, item: str, client_id: str | None = None) -> UserMessage:
    return UserMessage(thread_id=THREAD, turn_id=turn, digest="d", size=1, client_id=client_id, item_id=item)


def answer(turn: str) -> AgentMessage:
    return AgentMessage(thread_id=THREAD, turn_id=turn, digest="d", size=1, item_id=f"reply-{turn}")


def test_the_first_user_message_names_who_opened_the_turn():
    p = fold(started("u1"), user("u1", "m1"), ended("u1"), started("u2"), user("u2", "m2", OURS), ended("u2"),
             started("u3"), answer("u3"))  # a continuation opens with the model
    assert p.threads[THREAD].turn_writers == {"u1": OTHER, "u2": TILLERMAN}


def test_another_writers_message_folded_into_a_running_turn_holds_until_the_agent_answers():
    p = fold(started("u1"), user("u1", "m1"), answer("u1"), user("u1", "m2"))
    assert p.snapshot(THREAD).other_writer_input
    [fact] = p.threads[THREAD].writer_facts
    assert (fact.kind, fact.turn_id, fact.item_id) == ("input_folded", "u1", "m2")
    p.apply(Entry(seq=next(_seq), envelope=Envelope(event_id="x", event=answer("u1"), source="appserver:ws", at=200.0),
                  prev_hash="", hash=""))
    assert not p.snapshot(THREAD).other_writer_input


def test_input_folded_into_a_continuation_turn_and_cleared_when_the_turn_ends():
    p = fold(started("g1"), ItemStarted(thread_id=THREAD, turn_id="g1", item_id="r1", item_type="reasoning"),
             user("g1", "m1"), user("g1", "m1"))  # the same message twice (started, completed)
    assert p.snapshot(THREAD).other_writer_input and len(p.threads[THREAD].writer_facts) == 1
    p2 = fold(started("g1"), answer("g1"), user("g1", "m1"), ended("g1"))
    assert not p2.snapshot(THREAD).other_writer_input and len(p2.threads[THREAD].writer_facts) == 1


def test_our_own_steer_and_the_openers_own_message_hold_nothing():
    p = fold(started("u1"), user("u1", "m1"), user("u1", "m1"), user("u1", "s1", OURS))
    assert not p.snapshot(THREAD).other_writer_input and p.threads[THREAD].writer_facts == ()


def test_a_turn_that_starts_while_another_runs_is_a_fact():
    p = fold(started("u1"), started("u2"))
    [fact] = p.threads[THREAD].writer_facts
    assert (fact.kind, fact.turn_id, fact.other_turn_id) == ("overlapping_turn", "u2", "u1")


def test_only_an_app_server_connection_names_writers():
    p = fold(started("u1"), user("u1", "m1"), answer("u1"), user("u1", "m2"), started("u2"), source="rollout:f")
    assert p.threads[THREAD].turn_writers == {} and p.threads[THREAD].writer_facts == ()
    assert not p.snapshot(THREAD).other_writer_input


def test_the_thread_keeps_only_the_latest_facts():
    events = [started("u0")] + [started(f"u{n}") for n in range(1, WRITER_FACTS + 5)]
    facts = fold(*events).threads[THREAD].writer_facts
    assert len(facts) == WRITER_FACTS and facts[-1].turn_id == f"u{WRITER_FACTS + 4}"
