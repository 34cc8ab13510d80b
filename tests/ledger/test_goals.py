"""A thread's Codex goal in the fold: ThreadSnapshot.goal, goal_status and goal_active."""

from tests.ledger.test_projections import env, fold
from tillerman.ledger import events as ev
from tillerman.ledger import projections
from tillerman.ledger.sqlite import SQLiteRecorder


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


def test_a_clear_on_a_thread_that_had_no_goal_leaves_it_without_one():
    # Codex 0.163 sends thread/goal/cleared on every thread/resume of a thread with no goal.
    assert fold(ev.GoalCleared(thread_id="t")).snapshot("t").goal is None


def live(*evs, times):
    """The events as the app-server connection records them, at the given times."""
    rec = SQLiteRecorder()
    rec.append([env(i, e, "appserver:x", at=at) for i, (e, at) in enumerate(zip(evs, times, strict=True))])
    return projections.load(rec)


def test_live_triggers_are_inferred_from_the_goal_the_gap_and_the_first_input():
    user = ev.UserMessage(thread_id="t", turn_id="a", digest="d", size=1)
    p = live(
        ev.TurnStarted(thread_id="t", turn_id="a"), user, ev.TurnCompleted(thread_id="t", turn_id="a"),
        ev.GoalUpdated(thread_id="t", status="active"),
        ev.TurnStarted(thread_id="t", turn_id="g1"),  # 10 ms after the goal was set
        ev.AgentMessage(thread_id="t", turn_id="g1", digest="d", size=1),
        ev.TurnCompleted(thread_id="t", turn_id="g1"),
        ev.TurnStarted(thread_id="t", turn_id="g2"),  # 8 ms after g1 ended
        ev.TurnCompleted(thread_id="t", turn_id="g2"),
        ev.TurnStarted(thread_id="t", turn_id="q"),  # a queued message, its client id seen queued
        ev.UserMessage(thread_id="t", turn_id="q", digest="d", size=1, client_id="tillerman-in-1"),
        times=[0.0, 0.1, 0.2, 5.0, 5.01, 5.1, 6.0, 6.008, 7.0, 7.005, 7.05],
    )
    t = p.threads["t"]
    assert [t.turn_trigger(x) for x in ("a", "g1", "g2")] == [("user", True), ("goal", True), ("goal", True)]
    assert t.turn_trigger("q") == ("user", True)  # no queue intent or entry has that client id


def test_a_queued_message_that_opens_a_turn_makes_it_a_queue_turn():
    p = live(
        ev.QueueChanged(thread_id="t", entries=(ev.QueueEntry(id="e1", client_id="cq"),)),
        ev.TurnStarted(thread_id="t", turn_id="q"),
        ev.UserMessage(thread_id="t", turn_id="q", digest="d", size=1, client_id="cq"),
        times=[0.0, 0.1, 0.2],
    )
    assert p.threads["t"].turn_trigger("q") == ("queue", True)


def test_a_turn_long_after_the_last_one_with_no_user_message_is_unknown_and_a_steer_changes_nothing():
    p = live(
        ev.GoalUpdated(thread_id="t", status="active"),
        ev.TurnStarted(thread_id="t", turn_id="g"),
        ev.AgentMessage(thread_id="t", turn_id="g", digest="d", size=1),
        ev.UserMessage(thread_id="t", turn_id="g", digest="d", size=1),  # a steer, after the turn's first output
        times=[0.0, 30.0, 30.1, 30.2],
    )
    assert p.threads["t"].turn_trigger("g") == ("unknown", True)


def test_a_rollouts_trigger_outranks_the_inference_either_way_round():
    start = ev.TurnStarted(thread_id="t", turn_id="g")
    told = ev.TurnStarted(thread_id="t", turn_id="g", trigger="goal")
    for first, second in (((start, "appserver:x"), (told, "file:r")), ((told, "file:r"), (start, "appserver:x"))):
        rec = SQLiteRecorder()
        rec.append([env(0, first[0], first[1], at=1.0), env(1, second[0], second[1], at=1.0)])
        assert projections.load(rec).threads["t"].turn_trigger("g") == ("goal", False)
