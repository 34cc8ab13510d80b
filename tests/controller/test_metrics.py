"""What ``--metrics`` counts from the rows the daemon folds, and which addresses it serves on."""

from __future__ import annotations

import pytest

from tillerman.controller.core import intent_requests
from tillerman.controller.daemon.metrics import Metrics, parse_address
from tillerman.ledger import projections
from tillerman.ledger.events import Entry, Envelope, IntentTransition, NotificationFailed, ReviewCommitted
from tillerman.ledger.intent_states import State
from tillerman.ledger.memory import MemoryRecorder


def _entry(seq: int, event, source: str = "tillerman") -> Entry:
    return Entry(seq=seq, envelope=Envelope(event_id=str(seq), event=event, source=source), prev_hash="", hash="")


def test_reviewer_calls_notification_failures_and_intent_moves_are_counted():
    metrics = Metrics()
    for seq, event in enumerate([
        ReviewCommitted(checkpoint_id="c1", outcome="accepted"), ReviewCommitted(checkpoint_id="c2",
                                                                                 outcome="review_failed:timeout"),
        NotificationFailed(sink="pager", keys=("overdue:i@ack",), error="exited 1", retry_in=2.0),
        IntentTransition(intent_id="i", from_state="proposed", to_state="rejected", reason="no_grant"),
    ], start=1):
        metrics.fold(_entry(seq, event))
    value = metrics.registry.get_sample_value
    assert value("tillerman_reviewer_calls_total", {"outcome": "accepted"}) == 1
    assert value("tillerman_reviewer_calls_total", {"outcome": "review_failed:timeout"}) == 1
    assert value("tillerman_notification_failures_total", {"sink": "pager"}) == 1
    assert (value("tillerman_intents", {"state": "proposed"}), value("tillerman_intents", {"state": "rejected"})) == (
        -1, 1)  # a move out of a state the start did not count: the gauges follow the moves
    assert value("tillerman_events_ingested_total", {"source": "tillerman"}) == 4


def test_the_start_sets_every_state_from_the_fold_whatever_was_folded_before():
    rec = MemoryRecorder()
    intent = intent_requests.propose(rec, thread_id="T", mode="queue", text="x", owner="bob")
    intent_requests.transition(rec, intent.id, State.REJECTED, "no_grant")
    metrics = Metrics()
    for entry in rec.read():  # the daemon's first fold, before it counts from its start
        metrics.fold(entry)
    metrics.start(projections.load(rec))
    value = metrics.registry.get_sample_value
    assert [value("tillerman_intents", {"state": s.value}) for s in State] == [
        1 if s is State.REJECTED else 0 for s in State]


@pytest.mark.parametrize(("text", "address"), [("127.0.0.1:9464", ("127.0.0.1", 9464)),
                                               ("localhost:1", ("localhost", 1)), ("[::1]:9464", ("::1", 9464))])
def test_loopback_addresses_are_served(text, address):
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["9464", ":9464", "127.0.0.1:", "127.0.0.1:70000", "192.168.1.5:9464",
                                  "example.com:9464"])
def test_other_addresses_are_refused(text):
    with pytest.raises(ValueError, match="--metrics"):
        parse_address(text)
