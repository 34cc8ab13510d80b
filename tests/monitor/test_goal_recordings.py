"""A real Codex 0.171.0 goal session (fixtures/record_goal_session.py), read from its rollout
and from its app-server trace: the goal's events and what started each turn."""

import msgspec

from tests.monitor.support import SESSIONS, parse
from tillerman.ledger import projections
from tillerman.ledger.events import Envelope, GoalCleared, GoalUpdated, TurnStarted
from tillerman.ledger.sqlite import SQLiteRecorder

ROLLOUT = "codex-rollout/live-0.171-goal.jsonl"
TRACE = "appserver-trace/live-goal.jsonl"


def read(fmt: str, name: str):
    parsed, parser = parse(fmt, (SESSIONS / name).read_bytes(), source=name)
    return [p.event for p in parsed], parser


def test_the_rollout_labels_each_turns_trigger_and_records_the_goal_as_set():
    events, parser = read("codex-rollout", ROLLOUT)
    assert [e.trigger for e in events if isinstance(e, TurnStarted)] == ["user", "goal", "goal", "queue"]
    goals = [e for e in events if isinstance(e, GoalUpdated)]
    # 0.171 writes the goal as set; its budget accounting's updates and the clear only go on the wire
    assert [(g.status, g.token_budget, g.tokens_used) for g in goals] == [("active", 20000, 0)]
    assert goals[0].objective_digest and goals[0].objective is None
    assert not parser.unknown_types  # thread_goal_updated was counted unknown


def test_the_trace_has_the_goal_from_set_to_budget_limited_to_cleared():
    events, _ = read("appserver-trace", TRACE)
    goal_events = [e for e in events if isinstance(e, (GoalUpdated, GoalCleared))]
    turns = [e.turn_id for e in events if isinstance(e, TurnStarted)]
    assert [(type(e).__name__, getattr(e, "status", None)) for e in goal_events] == [
        ("GoalUpdated", "active"),  # the thread/goal/set reply (ours)
        ("GoalUpdated", "active"),  # its notification
        ("GoalUpdated", "active"),  # the first goal turn's end
        ("GoalUpdated", "budgetLimited"),  # the second's: over its budget
        ("GoalUpdated", "budgetLimited"),  # the thread/goal/get reply
        ("GoalCleared", None),
    ]
    assert goal_events[0].by == "tillerman" and goal_events[1].by is None
    assert [e.turn_id for e in goal_events[2:4]] == turns[1:3]  # each end names its turn
    assert goal_events[3].tokens_used > goal_events[3].token_budget == 20000
    assert all(e.trigger is msgspec.UNSET for e in events if isinstance(e, TurnStarted))  # the wire says none


def test_the_live_inference_over_the_trace_agrees_with_the_rollout():
    parsed, _ = parse("appserver-trace", (SESSIONS / TRACE).read_bytes(), source=TRACE)
    events = [p.event for p in parsed]
    recorder = SQLiteRecorder()  # as the live connection records them: an appserver source, at their times
    recorder.append([Envelope(event_id=f"appserver:x:{i}", event=p.event, source="appserver:x", at=p.at)
                     for i, p in enumerate(parsed)])
    thread = projections.load(recorder).threads[events[0].thread_id]
    inferred = [thread.turn_trigger(e.turn_id) for e in events if isinstance(e, TurnStarted)]
    truth = [e.trigger for e in read("codex-rollout", ROLLOUT)[0] if isinstance(e, TurnStarted)]
    assert [trigger for trigger, _ in inferred[:3]] == truth[:3] == ["user", "goal", "goal"]
    assert all(was_inferred for _, was_inferred in inferred)
    # The queued message was sent with a client id of no tillerman queue intent, and the
    # app-server never says what its queue holds: a queued turn is known only as ours.
    assert (inferred[3][0], truth[3]) == ("user", "queue")
