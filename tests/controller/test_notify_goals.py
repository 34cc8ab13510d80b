"""A Codex goal that Codex stopped by itself for a person to act on (budgetLimited,
usageLimited, blocked) is a notice without any rule: once per change of the goal,
grouped and resolved like the other notices (its goal moving to another status), also
across a restart; without a sink taking goals it is logged once, and its settling."""

import logging

import pytest

from tests.controller.test_notify import _append, _look, _sent
from tillerman.controller.notify.notices import Notifier
from tillerman.ledger import projections
from tillerman.ledger.events import GoalCleared, GoalUpdated, TurnCompleted, TurnStarted
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.notify import NotifySink

SINK = NotifySink(name="pager", command=("true",), group_window=10.0)


def _goal(rec, event_id, at, status="active", turn=None, used=0):
    _append(rec, GoalUpdated(thread_id="T", turn_id=turn, status=status, token_budget=20000, tokens_used=used,
                             origin="user"), event_id, at)


def _budget_limited(rec):
    """The 0.171 session: a goal set, a turn whose end reports it over budget."""
    _goal(rec, "set", 0.0)
    _append(rec, TurnStarted(thread_id="T", turn_id="g1"), "g1", 0.01)
    _goal(rec, "g1-limited", 5.0, "budgetLimited", "g1", 26000)
    _append(rec, TurnCompleted(thread_id="T", turn_id="g1"), "g1-end", 5.01)


def test_a_budget_limited_goal_is_sent_once_and_resolved_once_when_the_goal_moves_on():
    rec = MemoryRecorder()
    _budget_limited(rec)
    notifier = Notifier([SINK])
    assert _look(rec, notifier, 6.0) == []  # the window opened
    (first,) = _look(rec, notifier, 16.0)
    assert first.keys == ("goal:g1-limited@budgetLimited",) and first.thread_id == "T"
    body = first.payload()["notices"][0]
    assert {k: body[k] for k in ("kind", "step", "status", "tokens_used", "token_budget", "turn", "resolved")} == {
        "kind": "goal", "step": "budgetLimited", "status": "budgetLimited", "tokens_used": 26000,
        "token_budget": 20000, "turn": "g1", "resolved": False}
    assert body["changed_at"].startswith("1970-01-01T00:00:05")
    _sent(rec, [first], 16.0)
    _goal(rec, "get-reply", 20.0, "budgetLimited", used=26000)  # Codex reports it again: no change
    _append(rec, TurnStarted(thread_id="T", turn_id="u2"), "u2", 30.0)  # a person's turn leaves it so
    _goal(rec, "u2-end", 31.0, "budgetLimited", "u2", 27000)
    assert _look(rec, notifier, 40.0) == [] and _look(rec, notifier, 60.0) == []
    _append(rec, GoalCleared(thread_id="T"), "cleared", 70.0)
    _look(rec, notifier, 70.0)
    (resolved,) = _look(rec, notifier, 80.0)
    notice = resolved.payload()["notices"][0]
    assert resolved.keys == ("goal:g1-limited@resolved",) and notice["settled"] == "goal_cleared"
    _sent(rec, [resolved], 80.0)
    assert _look(rec, notifier, 200.0) == [] and notifier.state.alerts == {}


def test_the_same_goal_limited_again_after_a_change_is_a_new_notice():
    rec = MemoryRecorder()
    _budget_limited(rec)
    notifier = Notifier([NotifySink(name="n", command=("true",), group_window=0.0)])
    (first,) = _look(rec, notifier, 6.0)
    _sent(rec, [first], 6.0)
    _goal(rec, "raised", 10.0, "active", used=26000)  # a client raised the budget: the goal runs again
    _goal(rec, "limited-again", 20.0, "budgetLimited", used=41000)
    handovers = _look(rec, notifier, 21.0)
    assert sorted(key for h in handovers for key in h.keys) == [
        "goal:g1-limited@resolved", "goal:limited-again@budgetLimited"]


@pytest.mark.parametrize("status", ["usageLimited", "blocked"])
def test_the_other_statuses_codex_stops_a_goal_in_are_told_too(status):
    rec = MemoryRecorder()
    _goal(rec, "set", 0.0)
    _goal(rec, "halted", 5.0, status, used=100)
    notifier = Notifier([NotifySink(name="n", command=("true",), group_window=0.0)])
    (handover,) = _look(rec, notifier, 6.0)
    assert handover.keys == (f"goal:halted@{status}",)


@pytest.mark.parametrize("status", ["active", "paused", "complete"])
def test_a_goal_a_client_paused_or_the_model_completed_is_no_notice(status):
    rec = MemoryRecorder()
    _goal(rec, "set", 0.0)
    _goal(rec, "moved", 5.0, status)
    notifier = Notifier([NotifySink(name="n", command=("true",), group_window=0.0)])
    assert _look(rec, notifier, 6.0) == [] and notifier.state.alerts == {}


def test_a_sink_that_takes_other_kinds_gets_no_goal_notice():
    rec = MemoryRecorder()
    _budget_limited(rec)
    notifier = Notifier([NotifySink(name="n", command=("true",), group_window=0.0, kinds=("overdue",))])
    assert _look(rec, notifier, 6.0) == []


def test_a_goal_notice_is_sent_once_and_resolved_once_across_restarts(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        _budget_limited(rec)
        before = Notifier([SINK])
        _look(rec, before, 6.0)
        (first,) = _look(rec, before, 16.0)
        _sent(rec, [first], 16.0)
        _look(rec, before, 17.0)
        before.save(rec)
        _goal(rec, "get-reply", 20.0, "budgetLimited", used=26000)  # a re-attach's goal/get
        _goal(rec, "paused", 30.0, "paused", used=26000)
    for restart in range(2):
        with SQLiteRecorder(path) as rec:
            after = Notifier([SINK])
            after.load(rec)
            after.drop_settled(projections.load(rec))
            _look(rec, after, 100.0)
            handovers = _look(rec, after, 110.0)
            if restart == 0:
                assert [h.keys for h in handovers] == [("goal:g1-limited@resolved",)]
                _sent(rec, handovers, 110.0)
            else:
                assert handovers == []


def test_without_a_sink_a_goal_change_is_logged_once_and_its_settling_once(caplog):
    rec = MemoryRecorder()
    caplog.set_level(logging.INFO, logger="tillerman")
    _budget_limited(rec)
    notifier = Notifier([])
    _look(rec, notifier, 6.0)
    _goal(rec, "get-reply", 7.0, "budgetLimited", used=26000)
    _look(rec, notifier, 8.0)
    assert caplog.text.count("goal: thread T's Codex goal reached budgetLimited (26000 of 20000 tokens used)") == 1
    _goal(rec, "paused", 9.0, "paused", used=26000)
    _look(rec, notifier, 10.0)
    assert caplog.text.count("resolved: thread T's goal is no longer budgetLimited (goal_paused)") == 1
    assert notifier.state.alerts == {}


def test_a_clear_of_a_thread_that_never_had_a_goal_keeps_nothing():
    rec = MemoryRecorder()
    for n in range(3):  # Codex clears on every resume of a thread without a goal
        _append(rec, GoalCleared(thread_id=f"T{n}"), f"cleared-{n}", float(n))
    notifier = Notifier([SINK])
    assert _look(rec, notifier, 10.0) == [] and notifier.state.goals == {}
