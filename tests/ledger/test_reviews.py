"""The review fold: a checkpoint is asked at most once, an interrupted one is not asked
again, an id is not reused for another checkpoint, caps escalate, and a reviewer's daily
budget, spent or unknown, fails the checkpoint closed."""

from __future__ import annotations

import pytest

from tillerman.ledger.events import Envelope, ReviewCommitted, ReviewPending
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.reviews import (
    DAY,
    Call,
    DaySpend,
    Escalate,
    OverBudget,
    Recorded,
    Refused,
    fold_reviews,
    plan_checkpoint,
)

CAPS = {"max_per_intent": 2, "max_per_thread_per_hour": 6}


def ledger_with(*events_at) -> MemoryRecorder:
    ledger = MemoryRecorder()
    ledger.append([Envelope(event_id=f"e{n}", event=event, source="test", at=at)
                   for n, (event, at) in enumerate(events_at)])
    return ledger


def pending(cid: str, *, kind: str = "before_dispatch", intent: str | None = "in-1", thread: str = "th-1"):
    return ReviewPending(checkpoint_id=cid, checkpoint=kind, reviewer="r", intent_id=intent, thread_id=thread,
                         packet_digest="sha256:p")


def committed(cid: str, *, kind: str = "before_dispatch", disposition: str = "hold", intent: str | None = "in-1"):
    return ReviewCommitted(checkpoint_id=cid, checkpoint=kind, reviewer="r", intent_id=intent, thread_id="th-1",
                           outcome="accepted", disposition=disposition)


def plan(ledger, cid: str, *, kind: str = "before_dispatch", intent: str | None = "in-1", now: float = 1000.0,
         **caps):
    return plan_checkpoint(fold_reviews(ledger.read()), checkpoint_id=cid, checkpoint=kind, intent_id=intent,
                           thread_id="th-1", now=now, **(CAPS | caps))


def test_a_new_checkpoint_is_called():
    assert plan(ledger_with(), "c1") == Call()


def test_a_committed_checkpoint_returns_its_record_and_spends_nothing():
    ledger = ledger_with((pending("c1"), 10.0), (committed("c1"), 11.0))
    found = plan(ledger, "c1", max_per_intent=1)
    assert isinstance(found, Recorded) and found.committed.disposition == "hold"


def test_pending_without_committed_is_interrupted_and_not_called_again():
    found = plan(ledger_with((pending("c1"), 10.0)), "c1")
    assert isinstance(found, Refused) and found.reason == "review_interrupted"


def test_an_id_reused_for_another_checkpoint_is_refused():
    ledger = ledger_with((pending("c1"), 10.0), (committed("c1"), 11.0))
    found = plan(ledger, "c1", kind="review")
    assert isinstance(found, Refused) and found.reason == "review_failed:checkpoint_id_reused"


def test_reaching_the_per_intent_cap_escalates():
    ledger = ledger_with((pending("c1"), 10.0), (committed("c1"), 11.0))
    assert plan(ledger, "c2") == Call()
    ledger.append([Envelope(event_id="more", event=pending("c2"), source="test", at=20.0)])
    found = plan(ledger, "c3")
    assert isinstance(found, Escalate) and "max_per_intent 2" in found.detail


def test_the_per_thread_cap_counts_the_last_hour_only():
    ledger = ledger_with(*[(pending(f"c{n}", intent=f"in-{n}"), 100.0 + n) for n in range(3)])
    assert isinstance(plan(ledger, "new", intent="in-new", max_per_thread_per_hour=3, now=200.0), Escalate)
    assert plan(ledger, "new", intent="in-new", max_per_thread_per_hour=3, now=100.0 + 3600 + 5) == Call()


def test_a_repeated_pending_record_is_one_call():
    ledger = ledger_with((pending("c1"), 10.0), (pending("c1"), 12.0))
    assert fold_reviews(ledger.read()).spent(intent_id="in-1", thread_id="th-1", now=20.0) == (1, 1)


def test_return_to_executor_answers_are_counted_per_intent():
    ledger = ledger_with((pending("c1", kind="review"), 1.0),
                         (committed("c1", kind="review", disposition="return_to_executor"), 2.0),
                         (pending("c2", kind="review", intent="in-2"), 3.0),
                         (committed("c2", kind="review", disposition="return_to_executor", intent="in-2"), 4.0))
    reviews = fold_reviews(ledger.read())
    assert (reviews.returns("in-1"), reviews.returns("in-9")) == (1, 0)


def test_review_events_round_trip_and_older_readers_tolerate_them():
    from tillerman.ledger.events import decode, decode_stored, encode
    event = committed("c1")
    assert decode(encode(event)) == event
    assert decode(b'{"kind": "review_committed"}') == ReviewCommitted()  # every field has a default
    assert decode_stored(b'{"kind": "review_future"}', "review_future").stored_kind == "review_future"


def answered(cid: str, disposition: str, *, probe: bool = False, reviewer: str = "r", kind: str = "before_dispatch"):
    return [(ReviewPending(checkpoint_id=cid, checkpoint=kind, reviewer=reviewer, probe=probe, thread_id="th-1"),
             1.0),
            (ReviewCommitted(checkpoint_id=cid, checkpoint=kind, reviewer=reviewer, outcome="accepted",
                             disposition=disposition), 2.0)]


def test_a_probe_is_due_after_probe_every_gate_answers_in_a_row():
    from tillerman.ledger.reviews import probe_due
    gate = "ready_for_existing_gate"
    events = answered("a", "hold") + answered("b", gate) + answered("c", gate, reviewer="other") \
        + answered("d", gate, kind="review") + answered("e", gate)
    reviews = fold_reviews(ledger_with(*events).read())
    assert reviews.gate_streak("r") == 2  # b and e: "hold" breaks it, others' answers and other checkpoints do not
    assert probe_due(reviews, "r", 2) and not probe_due(reviews, "r", 3) and not probe_due(reviews, "r", None)
    after_probe = fold_reviews(ledger_with(*events, *answered("p", "hold", probe=True)).read())
    assert after_probe.gate_streak("r") == 0


def test_a_probe_let_through_is_remembered():
    events = answered("p1", "hold", probe=True) + answered("p2", "ready_for_existing_gate", probe=True)
    assert fold_reviews(ledger_with(*events).read()).probes_let_through("r") == ["p2"]


# -- the daily budget ----------------------------------------------------------------------------------

NOON = 20 * DAY + DAY / 2  # a moment in the middle of a UTC day


def call(cid: str, at: float, *, cost: float | None, outcome: str = "accepted", reviewer: str = "r"):
    return [(ReviewPending(checkpoint_id=cid, checkpoint="before_dispatch", reviewer=reviewer, intent_id=cid,
                           thread_id=cid), at),
            (ReviewCommitted(checkpoint_id=cid, checkpoint="before_dispatch", reviewer=reviewer, intent_id=cid,
                             thread_id=cid, outcome=outcome, disposition="hold", cost_usd=cost), at + 5)]


def budget_plan(*calls, budget: float = 2.0, now: float = NOON):
    return plan(ledger_with(*calls), "next", intent="in-next", now=now, reviewer="r", budget_usd_per_day=budget)


def test_the_days_spend_sums_the_costs_of_the_reviewers_calls_in_the_utc_day():
    events = call("a", NOON - 60, cost=0.5) + call("b", NOON, cost=0.25) + call("other", NOON, cost=9.0,
                                                                               reviewer="s") \
        + call("yesterday", NOON - DAY, cost=9.0) + call("tomorrow", NOON + DAY, cost=9.0)
    reviews = fold_reviews(ledger_with(*events).read())
    assert reviews.spent_today("r", NOON) == DaySpend(usd=0.75, unknown=0)
    assert reviews.spent_today("r", NOON - NOON % DAY) == DaySpend(usd=0.75, unknown=0)  # the day's first second


def test_under_the_budget_the_reviewer_is_called():
    assert budget_plan(*call("a", NOON - 60, cost=1.99)) == Call()


def test_a_spent_budget_fails_the_checkpoint_closed():
    found = budget_plan(*call("a", NOON - 60, cost=1.5), *call("b", NOON - 30, cost=0.5))
    assert isinstance(found, OverBudget) and found.reason == "review_failed:budget"
    assert "spent 2.0000 USD today (UTC), budget_usd_per_day 2" in found.detail


def test_yesterdays_spend_does_not_hold_todays_reviews():
    assert budget_plan(*call("a", NOON - DAY, cost=5.0), now=NOON) == Call()


def test_without_a_budget_nothing_is_counted():
    assert plan(ledger_with(*call("a", NOON, cost=50.0)), "next", intent="in-next", now=NOON, reviewer="r") == Call()


@pytest.mark.parametrize("cost", [None, -1.0, float("nan"), float("inf")])
def test_a_call_that_ran_without_a_cost_holds_the_days_reviews(cost):
    found = budget_plan(*call("a", NOON - 60, cost=cost, outcome="review_failed:timeout"))
    assert isinstance(found, OverBudget)
    assert "1 call(s) of reviewer r today (UTC) reported no cost" in found.detail


@pytest.mark.parametrize("outcome", ["review_failed:not_started", "review_failed:packet_refused"])
def test_a_call_whose_command_never_ran_cost_nothing(outcome):
    assert budget_plan(*call("a", NOON - 60, cost=None, outcome=outcome)) == Call()


def test_an_interrupted_call_counts_as_unknown_once_committed_and_a_running_one_not_yet():
    running = ledger_with((pending("a"), NOON - 60))
    assert fold_reviews(running.read()).spent_today("r", NOON) == DaySpend(usd=0.0, unknown=0)
    running.append([Envelope(event_id="x", source="test", at=NOON, event=ReviewCommitted(
        checkpoint_id="a", checkpoint="before_dispatch", reviewer="r", outcome="review_interrupted"))])
    assert fold_reviews(running.read()).spent_today("r", NOON) == DaySpend(usd=0.0, unknown=1)


def test_a_record_without_a_call_spends_nothing():
    capped = (ReviewCommitted(checkpoint_id="a", checkpoint="before_dispatch", reviewer="r",
                              outcome="review_failed:budget"), NOON)
    assert budget_plan(capped) == Call()
