"""A thread's Codex goal and its turns' triggers where a person reads them: ``status``,
``intent show`` and ``replay``, over the recorded Codex 0.171.0 goal session
(fixtures/record_goal_session.py: a user turn, two goal turns whose second ends over the
token budget, a queued message's turn, the goal cleared)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tests.monitor.support import SESSIONS, parse
from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests
from tillerman.ledger import events as ev
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder

TRACE = "appserver-trace/live-goal.jsonl"
ROLLOUT = "codex-rollout/live-0.171-goal.jsonl"


def trace_envelopes() -> list[ev.Envelope]:
    """The trace as the live connection records it: an app-server source, at its times."""
    parsed, _ = parse("appserver-trace", (SESSIONS / TRACE).read_bytes(), source=TRACE)
    return [ev.Envelope(event_id=f"appserver:x:{i}", event=p.event, source="appserver:x", at=p.at)
            for i, p in enumerate(parsed)]


def index_of(envelopes, wanted) -> int:
    return next(i for i, e in enumerate(envelopes) if wanted(e.event))


def budget_limited_ledger(path: Path, *, settle: bool = True) -> tuple[str, str]:
    """The session up to its goal's clear, a queue intent proposed while the goal was
    active and (with ``settle``) expired once it was budget-limited: (thread, intent)."""
    envelopes = trace_envelopes()
    cleared = index_of(envelopes, lambda e: isinstance(e, ev.GoalCleared))
    running = index_of(envelopes, lambda e: isinstance(e, ev.GoalUpdated) and e.by is None)
    thread = envelopes[0].event.thread_id
    with SQLiteRecorder(path) as rec:
        rec.append(envelopes[:running + 1])
        intent = intent_requests.propose(rec, now=envelopes[running].at + 0.001, thread_id=thread, mode="queue",
                                         text="Say where you are.", ack_deadline=60.0, owner="ann")
        rec.append(envelopes[running + 1:cleared])
        if settle:
            intent_requests.transition(rec, intent.id, State.EXPIRED, "cancelled", at=envelopes[cleared - 1].at)
    return thread, intent.id


def run(*args: str) -> str:
    out = CliRunner().invoke(main, list(args))
    assert out.exit_code == 0, out.output
    return out.output


def test_status_shows_each_threads_goal_and_what_started_its_turns(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    thread, _ = budget_limited_ledger(ledger)
    (row,) = json.loads(run("status", "--json", "--ledger", str(ledger)))["threads"]
    goal = row["goal"]
    assert (row["thread"], goal["status"], goal["token_budget"]) == (thread, "budgetLimited", 20000)
    assert goal["tokens_used"] > 20000 and goal["changed_by"] is None and goal["objective_digest"]
    # user, goal, goal, then the queued message (sent with no tillerman client id: "user")
    assert row["recent_turn_triggers"] == {"goal": 2, "user": 2}
    text = run("status", "--ledger", str(ledger))
    assert f"budgetLimited {goal['tokens_used']}/20000 tokens" in text and " GOAL " in text.upper()


def test_intent_show_gives_the_goal_at_the_proposal_and_at_the_end(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    _, intent_id = budget_limited_ledger(ledger)
    data = json.loads(run("intent", "show", intent_id, "--json", "--ledger", str(ledger)))
    assert (data["goal_at_proposal"]["status"], data["goal_at_proposal"]["tokens_used"]) == ("active", 0)
    assert data["goal_at_end"]["status"] == "budgetLimited" and "goal_now" not in data
    text = run("intent", "show", intent_id, "--ledger", str(ledger))
    assert "goal_at_proposal: active 0/20000 tokens" in text
    assert f"     goal_at_end: budgetLimited {data['goal_at_end']['tokens_used']}/20000 tokens" in text


def test_intent_show_of_an_open_intent_gives_the_goal_now(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    _, intent_id = budget_limited_ledger(ledger, settle=False)
    data = json.loads(run("intent", "show", intent_id, "--json", "--ledger", str(ledger)))
    assert data["goal_now"]["status"] == "budgetLimited" and "goal_at_end" not in data


def test_intent_show_on_a_thread_without_a_goal_says_nothing_of_goals(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(ledger) as rec:
        rec.append(trace_envelopes()[:3])
        intent = intent_requests.propose(rec, now=1.0, thread_id="other", mode="queue", text="x", ack_deadline=60.0,
                                         owner="ann")
    data = json.loads(run("intent", "show", intent.id, "--json", "--ledger", str(ledger)))
    assert not {"goal_at_proposal", "goal_at_end", "goal_now"} & set(data)


def test_replay_shows_each_goal_thread_with_its_turns_triggers():
    data = json.loads(run("replay", "--json", "--jobs", "1", str(SESSIONS / ROLLOUT), str(SESSIONS / TRACE)))
    by_source = {g["goal"]["status"]: g for g in data["goals"]}
    # the rollout: the goal as set (0.171 writes no budget update there) and its four turns' triggers
    assert by_source["active"]["recent_turn_triggers"] == {"goal": 2, "queue": 1, "user": 1}
    assert by_source["cleared"]["recent_turn_triggers"] == {}  # a replayed trace is not inferred
    assert by_source["cleared"]["goal_statuses"] == ["active", "budgetLimited", "cleared"]  # the wire has them all
    text = run("replay", "--jobs", "1", str(SESSIONS / ROLLOUT))
    thread = by_source["active"]["thread"]
    assert f"goal: thread {thread}: active (now active 0/20000 tokens); recent turns by trigger: goal 2, queue 1," \
           " user 1" in text


def test_replay_of_sessions_without_goals_shows_none():
    data = json.loads(run("replay", "--json", str(SESSIONS / "codex-rollout" / "live-0.163-supervised.jsonl")))
    assert "goals" not in data
