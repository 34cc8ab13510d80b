"""A thread's Codex goal in the fold: ThreadSnapshot.goal, goal_status and goal_active."""

from tests.ledger.test_projections import fold

from tillerman.ledger import events as ev


def test_a_thread_with_no_goal_seen_has_none():
    snap = fold(ev.TurnStarted(thread_id="t", turn_id="a")).snapshot("t")
    assert snap.goal is None and snap.goal_status is None and not snap.goal_active


def test_the_goal_follows_its_last_report_and_its_status_changes():
    p = fold(
        ev.GoalUpdated(thread_id="t", status="active", objective_digest="d1", origin="user", token_budget=500),
        ev.TurnStarted(thread_id="t", turn_id="a"),
        ev.TurnCompleted(thread_id="t", turn_id="a"),
        ev.GoalUpdated(thread_id="t", turn_id="a", status="active", objective_digest="d1", origin="user",
                       token_budget=500, tokens_used=120, time_used_seconds=1.5),
    )
    snap = p.snapshot("t")
    assert snap.goal_active and snap.goal_status == "active"
    goal = snap.goal
    assert (goal.tokens_used, goal.token_budget, goal.time_used_seconds, goal.turn_id) == (120, 500, 1.5, "a")
    assert goal.changed_at == 0.0 and goal.updated_at == 3.0  # a report with the same status is no change
    p2 = fold(
        ev.GoalUpdated(thread_id="t", status="active"),
        ev.GoalUpdated(thread_id="t", status="paused", by="tillerman"),
    )
    goal = p2.snapshot("t").goal
    assert not p2.snapshot("t").goal_active and (goal.status, goal.changed_at, goal.changed_by) == ("paused", 1.0, "tillerman")


def test_a_cleared_goal_reads_cleared_and_starts_no_work():
    p = fold(ev.GoalUpdated(thread_id="t", status="active"), ev.GoalCleared(thread_id="t"))
    snap = p.snapshot("t")
    assert snap.goal_status == "cleared" and not snap.goal_active and snap.goal.changed_at == 1.0
