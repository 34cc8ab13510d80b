"""``tillerman replay --check LEDGER``: every recorded decision decided again, with the
rule set the ledger recorded; the first that differs is named (exit 1), a ledger that
cannot be checked is refused (exit 2)."""

from __future__ import annotations

import contextlib
import json
import sqlite3

import msgspec
import pytest
from click.testing import CliRunner

from fixtures.rule_texts import ANN_STEERS, NO_OWNER_GRANT, rule
from tillerman.controller.cli.main import main
from tillerman.controller.core.intent_requests import build_intent, proposal_envelopes
from tillerman.controller.core.supervisor import Step
from tillerman.controller.replay import recheck
from tillerman.controller.replay.recheck import CannotCheck, check, check_ledger, recorded_rulesets
from tillerman.ledger import events as ev
from tillerman.ledger.events import Envelope
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.decision import Decision
from tillerman.rules.files import load_grants, load_rules
from tillerman.rules.ruleset import build_ruleset, ruleset_text

GRANTS = NO_OWNER_GRANT + "\n" + ANN_STEERS
SHADOW_RULE = rule("quick-steer", status="shadow", condition={"kind": "repeated_failure", "count": 2},
                   action="steer", text="Stop re-running {tool}.")


def rules(grants: str = GRANTS, rule_text: str = ""):
    return build_ruleset(load_rules(rule_text, "rules.toml"), load_grants(grants, "config.toml"))


def loaded(ruleset, *, text: bool = True, digest: str | None = None, at: float = 0.0) -> Envelope:
    event = ev.RulesetLoaded(digest=digest or ruleset.digest, rules=len(ruleset.rules),
                             ruleset_text=ruleset_text(ruleset) if text else None)
    return Envelope(event_id=f"ruleset_loaded:{at}:{digest}", event=event, source="tillerman", at=at)


def observe(recorder, at: float, *events) -> None:
    recorder.append([Envelope(event_id=f"obs:{at}:{i}", event=e, source="appserver:x", at=at)
                     for i, e in enumerate(events)])


def decide_round(recorder, step: Step, now: float) -> None:
    """What the daemon's round records: the policy's changed decisions, one batch."""
    projection = Projection().fold(recorder.read())
    envelopes, _ = step.decide_intents(projection, projection.open_intents(), now)
    if envelopes:
        recorder.append(envelopes)


def propose(recorder, owner: str, now: float, mode: str = "steer") -> str:
    projection = Projection().fold(recorder.read())
    intent = build_intent(projection, thread_id="T", mode=mode, text=f"{owner}'s note", now=now,
                          expected_turn="U", owner=owner, producer=f"owner:{owner}")
    recorder.append(proposal_envelopes(intent, projection))
    return intent.id


def supervised(recorder, *, first=None, decided_with=None, text: bool = True) -> dict[str, str]:
    """A daemon's history on a steerable thread: Ann's granted steer is authorized, Bob's
    is refused in the same round; the turn ends and Ann's expires. ``first`` replaces
    the rule set recorded at the start (the set deciding is ``decided_with``)."""
    ruleset = decided_with or rules()
    recorder.append([loaded(first or ruleset, text=text, digest=ruleset.digest)])
    step = Step(ruleset, replay=False)
    observe(recorder, 1.0, ev.ThreadStarted(thread_id="T"), ev.TurnStarted(thread_id="T", turn_id="U"))
    ids = {"ann": propose(recorder, "ann", 2.0), "bob": propose(recorder, "bob", 2.0)}
    decide_round(recorder, step, 3.0)
    observe(recorder, 4.0, ev.TurnCompleted(thread_id="T", turn_id="U"))
    decide_round(recorder, step, 5.0)
    return ids


def decisions(recorder) -> list[tuple[int, str, str, str]]:
    return [(e.seq, e.envelope.event.intent_id, e.envelope.event.action, e.envelope.event.reason)
            for e in recorder.read() if isinstance(e.envelope.event, ev.DecisionRecorded)]


def run_check(recorder):
    return check(recorder.read(), recorded_rulesets(recorder.read()))


def test_a_history_decided_by_this_policy_agrees_decision_by_decision():
    recorder = MemoryRecorder()
    ids = supervised(recorder)
    recorded = {(i, a, r) for _, i, a, r in decisions(recorder)}
    assert recorded == {(ids["ann"], "steer", "authorized"), (ids["bob"], "escalate", "no_grant"),
                        (ids["ann"], "expire", "turn_ended")}
    result = run_check(recorder)
    assert result.ok and result.first_difference is None
    assert (result.decisions, result.shadow_decisions, result.rulesets) == (3, 0, 1)
    assert result.entries == recorder.max_seq()


def test_a_changed_rule_set_is_caught_at_the_first_decision_it_changes():
    """The recorded text grants Ann nothing (as if the config had been changed): her
    authorized steer is the first decision that comes out differently."""
    recorder = MemoryRecorder()
    ids = supervised(recorder, first=rules(grants="[defaults]\nowner_grant = false\n"))
    result = run_check(recorder)
    ann_seq = next(seq for seq, i, a, _ in decisions(recorder) if i == ids["ann"] and a == "steer")
    assert not result.ok
    diff = result.first_difference
    assert (diff.seq, diff.intent, diff.thread) == (ann_seq, ids["ann"], "T")
    assert (diff.recorded, diff.redecided) == (recheck.Verdict("steer", "authorized"),
                                               recheck.Verdict("escalate", "no_grant"))
    assert diff.at == 3.0
    assert any("rebuilds as" in note for note in result.notes)  # the text does not match its digest


def test_a_changed_policy_is_caught_with_the_seq_of_the_decision(monkeypatch):
    recorder = MemoryRecorder()
    ids = supervised(recorder)
    real = recheck.decide

    def stricter(intent, state, snapshot, now, ruleset) -> Decision:
        decision = real(intent, state, snapshot, now, ruleset)
        return msgspec.structs.replace(decision, reason="stricter") if decision.reason == "turn_ended" else decision

    monkeypatch.setattr(recheck, "decide", stricter)
    result = run_check(recorder)
    (expired_seq,) = [seq for seq, _, _, r in decisions(recorder) if r == "turn_ended"]
    assert result.first_difference.seq == expired_seq and result.first_difference.intent == ids["ann"]
    assert result.decisions == 3  # the two before it agreed


def test_a_rule_set_recorded_without_its_text_cannot_be_checked():
    recorder = MemoryRecorder()
    supervised(recorder, text=False)
    with pytest.raises(CannotCheck, match="by its digest only"):
        run_check(recorder)


def test_a_decision_under_a_rule_set_no_entry_names_cannot_be_checked():
    """A replay into a ledger records decisions but no rule set."""
    recorder = MemoryRecorder()
    observe(recorder, 1.0, ev.ThreadStarted(thread_id="T"), ev.TurnStarted(thread_id="T", turn_id="U"))
    propose(recorder, "ann", 2.0)
    decide_round(recorder, Step(rules(), replay=False), 3.0)
    with pytest.raises(CannotCheck, match="which no ruleset_loaded in the ledger names"):
        run_check(recorder)


def test_a_decision_made_before_the_starts_ruleset_loaded_is_checked_with_the_set_it_names():
    """At a start the daemon may decide before its ruleset_loaded is written."""
    recorder = MemoryRecorder()
    ruleset = rules()
    observe(recorder, 1.0, ev.ThreadStarted(thread_id="T"), ev.TurnStarted(thread_id="T", turn_id="U"))
    propose(recorder, "ann", 2.0)
    decide_round(recorder, Step(ruleset, replay=False), 3.0)
    recorder.append([loaded(ruleset, at=3.5)])
    result = run_check(recorder)
    assert result.ok and result.decisions == 1


def test_shadow_decisions_are_counted_not_decided_again():
    recorder = MemoryRecorder()
    ruleset = rules(grants='[[grant]]\nsubject = "rule:quick-steer"\nactions = ["steer"]\n', rule_text=SHADOW_RULE)
    recorder.append([loaded(ruleset)])
    observe(recorder, 1.0, ev.ThreadStarted(thread_id="T"), ev.TurnStarted(thread_id="T", turn_id="U"))
    for i in range(2):
        observe(recorder, 2.0 + i,
                ev.ItemStarted(thread_id="T", turn_id="U", item_id=f"i{i}", item_type="command", tool="pytest",
                               args_digest="d1"),
                ev.ItemCompleted(thread_id="T", turn_id="U", item_id=f"i{i}", item_type="command", status="failed",
                                 exit_code=1, tool="pytest", args_digest="d1"))
    recorder.append(Step(ruleset, replay=False).step(Projection().fold(recorder.read()), ["T"], 10.0))
    result = run_check(recorder)
    assert result.ok and (result.decisions, result.shadow_decisions) == (0, 1)


# -- the command line -----------------------------------------------------------------


def sqlite_ledger(path, **kwargs):
    with SQLiteRecorder(path) as recorder:
        supervised(recorder, **kwargs)
    return path


def run(*args):
    result = CliRunner().invoke(main, ["replay", *map(str, args)])
    return result.exit_code, result.output


def test_cli_agrees_with_exit_0_and_says_how_many_decisions(tmp_path):
    path = sqlite_ledger(tmp_path / "ledger.sqlite3")
    code, out = run("--check", path)
    assert code == 0, out
    assert out.startswith("ok: 3 decisions decided again, all agree")
    code, out = run("--check", "--json", path)
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["decisions"] == 3 and data["ledger"] == str(path)
    assert check_ledger(path).decisions == 3


def test_cli_names_the_first_difference_with_exit_1(tmp_path):
    path = sqlite_ledger(tmp_path / "ledger.sqlite3", first=rules(grants="[defaults]\nowner_grant = false\n"))
    code, out = run("--check", path)
    assert code == 1, out
    assert "DIFFERS at seq " in out and "recorded steer (authorized), decided again escalate (no_grant)" in out
    code, out = run("--check", "--json", path)
    data = json.loads(out)
    assert code == 1 and not data["ok"]
    assert data["first_difference"]["redecided"] == {"action": "escalate", "reason": "no_grant"}


def test_cli_refuses_what_it_cannot_check_with_exit_2(tmp_path):
    no_text = sqlite_ledger(tmp_path / "old.sqlite3", text=False)
    code, out = run("--check", no_text)
    assert code == 2 and "by its digest only" in out
    session = tmp_path / "rollout.jsonl"
    session.write_text('{"type": "session_meta"}\n')
    code, out = run("--check", session)
    assert code == 2 and "not an SQLite file" in out
    code, out = run("--check", tmp_path / "missing.sqlite3")
    assert code == 2 and "not a ledger file" in out
    damaged = sqlite_ledger(tmp_path / "damaged.sqlite3")
    with contextlib.closing(sqlite3.connect(damaged)) as db, db:  # committed, then closed
        db.execute("UPDATE events SET payload = replace(payload, 'authorized', 'authorised') WHERE kind = 'decision'")
    code, out = run("--check", damaged)
    assert code == 2 and "the ledger is damaged" in out
    code, out = run("--check", "--rules", no_text, no_text)
    assert code == 2 and "drop --rules" in out
    code, out = run("--check", no_text, no_text)
    assert code == 2 and "one ledger" in out
