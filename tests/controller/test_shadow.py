"""Shadow rules: evaluated on the same observations, recorded as shadow reports and
shadow decisions, never proposed as intents and never dispatched, even with a grant."""

from __future__ import annotations

from pathlib import Path

from fixtures.rule_texts import grant, rule
from tillerman.controller.core.supervisor import Step
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger import events as ev
from tillerman.ledger.events import Envelope
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.files import load_grants, load_rules
from tillerman.rules.ruleset import build_ruleset

ROOT = Path(__file__).resolve().parents[2]
STUCK = ROOT / "fixtures" / "disagreement" / "stuck"

SHADOW = rule("quick-steer", version=2, status="shadow", condition={"kind": "repeated_failure", "count": 2},
              action="steer", text="Stop re-running {tool}.")
GRANT = grant("rule:quick-steer", ["steer"])


def ruleset():
    return build_ruleset(load_rules(SHADOW, "shadow.toml"), load_grants(GRANT, "config.toml"))


def live_projection(recorder) -> Projection:
    events = [ev.TurnStarted(thread_id="T", turn_id="U")]
    for i in range(2):
        events += [ev.ItemStarted(thread_id="T", turn_id="U", item_id=f"i{i}", item_type="command", tool="pytest",
                                  args_digest="d1"),
                   ev.ItemCompleted(thread_id="T", turn_id="U", item_id=f"i{i}", item_type="command", status="failed",
                                    exit_code=1, tool="pytest", args_digest="d1")]
    recorder.append([Envelope(event_id=f"e{i}", event=e, source="appserver:x", at=float(i))
                     for i, e in enumerate(events)])
    return Projection().fold(recorder.read())


def test_a_granted_shadow_rule_is_recorded_as_a_shadow_decision_and_never_proposed():
    rules = ruleset()
    step = Step(rules, replay=False)
    with SQLiteRecorder(":memory:") as recorder:
        projection = live_projection(recorder)
        out = step.step(projection, ["T"], 100.0)
        assert [ev.kind_of(e.event) for e in out] == ["report", "decision"]
        report, decision = (e.event for e in out)
        assert report.rule_id == "quick-steer" and report.rule_version == 2 and report.ruleset_digest == rules.digest
        assert report.detail["shadow"] is True and report.detail["status"] == "shadow"
        assert report.detail["action"] == "steer"
        # what the policy would have done were the rule active: dispatch it (a grant exists)
        assert (decision.shadow, decision.action, decision.reason) == (True, "steer", "authorized")
        assert (decision.rule_id, decision.rule_version, decision.ruleset_digest) == ("quick-steer", 2, rules.digest)
        assert decision.intent_id == report.detail["would_be_intent"]
        recorder.append(out)
        projection.fold(recorder.read(after_seq=projection.seq))
        assert projection.intents == {} and projection.open_intents() == []
        assert step.decide_intents(projection, projection.open_intents(), 101.0) == ([], [])
        assert step.step(projection, ["T"], 200.0) == []  # recorded once


def test_replay_records_shadow_findings_and_proposes_nothing():
    with SQLiteRecorder(":memory:") as recorder:
        summary = Replayer(recorder, ruleset()).run([str(STUCK)])
        entries = [e.envelope.event for e in recorder.read()]
    assert summary.intents == {}
    assert not [e for e in entries if isinstance(e, ev.IntentProposed)]
    (decision,) = [e for e in entries if isinstance(e, ev.DecisionRecorded)]
    assert decision.shadow and decision.action == "observe" and decision.reason == "replayed_would_steer"
    (report,) = [e for e in entries if isinstance(e, ev.Report)]
    assert report.detail["shadow"] is True and report.finding.startswith("shell failed 2 times")
