"""A goal_budget_limited rule over the recorded Codex 0.171.0 goal session
(fixtures/record_goal_session.py): replay reports the goal's budget once, for the
change to budgetLimited, however often Codex reports the goal again afterwards, and
with a queue action proposes one message for the thread."""

from __future__ import annotations

from pathlib import Path

from fixtures.rule_texts import grant, rule
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger import events as ev
from tillerman.ledger.memory import MemoryRecorder
from tillerman.rules.config import load_effective

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"
TRACE = SESSIONS / "appserver-trace" / "live-goal.jsonl"


def replay(tmp_path: Path, rules: str, config: str = "") -> list[ev.Event]:
    (tmp_path / "rules.toml").write_text(rules)
    (tmp_path / "config.toml").write_text(config)
    effective = load_effective(tmp_path / "rules.toml", tmp_path / "config.toml")
    recorder = MemoryRecorder()
    Replayer(recorder, effective.ruleset).run([str(TRACE)])
    return [entry.envelope.event for entry in recorder.read()]


def test_a_budget_limited_goal_is_reported_once(tmp_path):
    events = replay(tmp_path, rule("budget", condition={"kind": "goal_budget_limited"}, action="report_overdue"))
    reports = [e for e in events if isinstance(e, ev.Report) and e.rule_id == "budget"]
    limited = [e for e in events if isinstance(e, ev.GoalUpdated) and e.status == "budgetLimited"]
    assert len(limited) == 2 and len(reports) == 1  # the turn's end and the goal/get reply: one change
    (report,) = reports
    assert report.finding.startswith(f"goal reached its token budget ({limited[0].tokens_used} of 20000 tokens)")
    assert report.detail["goal_status"] == "budgetLimited" and report.detail["action"] == "report_overdue"


def test_a_queue_rule_proposes_one_message_for_the_thread(tmp_path):
    events = replay(tmp_path, rule("budget", condition={"kind": "goal_budget_limited"}, action="queue",
                                   text="Budget spent ({tokens_used} of {token_budget}): summarise and stop."),
                    grant("rule:budget", ["queue"]))
    proposed = [e for e in events if isinstance(e, ev.IntentProposed)]
    assert [p.intent.rule_id for p in proposed] == ["budget"]
    assert proposed[0].intent.mode == "queue" and proposed[0].intent.text.endswith("of 20000): summarise and stop.")
