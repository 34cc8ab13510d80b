"""The owner's labels: the fold (latest stands, history kept), ``tillerman label`` and the
library it calls (unknown subjects refused), and precision against the labels in
``tillerman report`` (per rule, reviewer and mode; a reviewer's agreement)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.controller.core.labeling import LabelError, label
from tillerman.controller.report.account import account
from tillerman.controller.report.fold import fold_facts
from tillerman.ledger.events import Envelope, Report, ReviewCommitted, ReviewPending, TurnStarted
from tillerman.ledger.labels import ENDORSING, parse_subject, reviewer_agrees
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.review import DISPOSITIONS


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    """A thread, two findings of rule R1, a steer proposed, and a reviewer's answer on it."""
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("TILLERMAN_LEDGER", str(path))
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=TurnStarted(thread_id="T1", turn_id="U1"), source="appserver:x",
                             at=1.0)] + [
            Envelope(event_id=f"f{n}", source="rules", at=2.0 + n,
                     event=Report(thread_id="T1", turn_id="U1", rule_id="R1", rule_version=1, finding=f"stall {n}"))
            for n in (1, 2)])
    code, out = run("intent", "propose", "--thread", "T1", "--expected-turn", "active", "--mode", "steer",
                    "--text", "Read src/ instead.", "--json")
    assert code == 0, out
    intent = json.loads(out)["id"]
    where = {"checkpoint": "before_dispatch", "reviewer": "rv", "thread_id": "T1", "intent_id": intent}
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="p", source="test", at=5.0, event=ReviewPending(checkpoint_id="cp1", **where)),
                    Envelope(event_id="c", source="test", at=6.0, event=ReviewCommitted(
                        checkpoint_id="cp1", outcome="accepted", disposition="ready_for_existing_gate", **where))])
    return path, intent


@pytest.mark.parametrize(("subject", "parsed"), [
    ("intent:in-1", ("intent", "in-1")), ("in-abc", ("intent", "in-abc")), ("finding:f1", ("finding", "f1")),
    ("review:before_dispatch:in-1@U1", ("review", "before_dispatch:in-1@U1")),
])
def test_subjects_parse(subject, parsed):
    assert parse_subject(subject) == parsed


@pytest.mark.parametrize("subject", ["", "intent:", "turn:U1", "f1"])
def test_a_subject_that_names_nothing_is_refused(subject):
    with pytest.raises(ValueError, match="names nothing to label"):
        parse_subject(subject)


def test_the_endorsing_dispositions_are_dispositions():
    assert ENDORSING <= set(DISPOSITIONS)
    assert reviewer_agrees("ready_for_existing_gate", "useful") and reviewer_agrees("hold", "harmful")
    assert not reviewer_agrees("hold", "useful") and not reviewer_agrees("continue_with_directive", "not_useful")


def test_label_records_one_chained_event_and_the_latest_stands(ledger):
    path, intent = ledger
    code, out = run("label", intent, "useful", "--by", "ann", "--json")
    assert code == 0, out
    assert json.loads(out)["subject"] == f"intent:{intent}"
    code, out = run("label", f"intent:{intent}", "harmful", "--note", "<b>broke the build</b>", "--by", "bob")
    assert code == 0 and f"labeled intent:{intent} harmful (by bob)" in out
    with SQLiteRecorder(path) as rec:
        assert rec.verify().ok
        facts = fold_facts(rec.read())
    history = facts.labels.history(f"intent:{intent}")
    assert [(h.verdict, h.by) for h in history] == [("useful", "ann"), ("harmful", "bob")]
    assert facts.labels.current(f"intent:{intent}").note == "<b>broke the build</b>"  # stored raw
    assert history[0].thread == "T1"


def test_labels_lists_the_standing_label_of_each_subject_and_with_history_every_one(ledger):
    path, intent = ledger
    for args in ((intent, "useful", "--by", "ann", "--note", "good\x1b[2J call"), ("finding:f1", "not_useful"),
                 (intent, "harmful", "--by", "bob"), ("review:cp1", "useful", "--by", "ann")):
        assert run("label", *args)[0] == 0
    code, out = run("labels", "--json")
    assert code == 0, out
    assert [(r["subject"], r["verdict"], r["by"]) for r in json.loads(out)] == [  # the latest first
        ("review:cp1", "useful", "ann"), (f"intent:{intent}", "harmful", "bob"),
        ("finding:f1", "not_useful", json.loads(run("labels", "--kind", "finding", "--json")[1])[0]["by"])]
    code, out = run("labels", "--history", "--kind", "intent", "--json")
    assert [(r["verdict"], r["standing"]) for r in json.loads(out)] == [("useful", False), ("harmful", True)]
    code, out = run("labels", "--history", "--by", "ann")
    assert code == 0 and "replaced" in out and "yes" in out and "\x1b" not in out  # a note cannot act on the terminal
    assert [r["subject"] for r in json.loads(run("labels", "--verdict", "useful", "--json")[1])] == ["review:cp1"]
    code, out = run("labels", "--verdict", "not_useful", "--by", "nobody")
    assert code == 0 and "no labels match" in out


def test_labels_on_a_ledger_without_labels_says_how_to_give_one(ledger):
    code, out = run("labels")
    assert code == 0 and "no labels; give one with: tillerman label SUBJECT VERDICT" in out
    code, out = run("labels", "--ledger", str(ledger[0].parent / "missing.sqlite3"))
    assert code == 2 and "no ledger at" in out


def test_by_defaults_to_the_local_login(ledger):
    from tillerman.rules.owner import local_login
    code, out = run("label", "finding:f1", "not_useful", "--json")
    assert code == 0, out
    assert json.loads(out)["by"] == local_login()


@pytest.mark.parametrize(("subject", "verdict", "error"), [
    ("in-none", "useful", "no intent in-none"),
    ("finding:nope", "useful", "no finding nope"),
    ("review:nope", "useful", "no reviewer answer nope"),
    ("thread:T1", "useful", "names nothing to label"),
])
def test_an_unknown_subject_is_refused_and_nothing_is_written(ledger, subject, verdict, error):
    path, _ = ledger
    with SQLiteRecorder(path) as rec:
        before = rec.max_seq()
    code, out = run("label", subject, verdict)
    assert code == 2 and error in out, out
    with SQLiteRecorder(path) as rec:
        assert rec.max_seq() == before


def test_the_library_refuses_a_bad_verdict_an_empty_note_or_no_one(ledger):
    path, intent = ledger
    with SQLiteRecorder(path) as rec:
        for kwargs, error in (({"verdict": "great", "by": "ann"}, "verdict must be one of"),
                              ({"verdict": "useful", "by": " "}, "--by is empty"),
                              ({"verdict": "useful", "by": "ann", "note": " "}, "--note is empty")):
            with pytest.raises(LabelError, match=error):
                label(rec, intent, **kwargs)


def test_the_cli_refuses_a_verdict_outside_the_three(ledger):
    code, out = run("label", "finding:f1", "great")
    assert code == 2 and "useful" in out


def test_report_measures_rules_reviewers_and_modes_against_the_labels(ledger, tmp_path):
    path, intent = ledger
    for args in (("finding:f1", "useful"), ("finding:f2", "useful"), ("finding:f2", "not_useful"),
                 (intent, "harmful", "--note", "wrong file"), ("review:cp1", "not_useful")):
        assert run("label", *args)[0] == 0
    code, out = run("report", "--json", "--db", str(tmp_path / "account.db"))
    assert code == 0, out
    labels = json.loads(out)["owner_labels"]
    assert labels["labels"]["value"] == 4 and labels["labels"]["events"] == 5
    assert labels["by_rule"]["R1"]["precision"]["value"] == 0.5  # f1 useful, f2 relabeled not_useful
    assert labels["by_rule"]["R1"]["labeled"] == 2 and labels["by_rule"]["R1"]["unlabeled"] == 0
    assert labels["by_mode"]["steer"]["precision"]["value"] == 0.0
    assert labels["by_mode"]["steer"]["verdicts"] == {"harmful": 1}
    assert labels["by_reviewer"]["rv"]["precision"]["value"] == 0.0
    agreement = labels["reviewer_agreement"]["rv"]
    assert agreement["compared"] == 1 and agreement["agreement"]["value"] == 0.0
    assert agreement["disagreements"] == [{"checkpoint_id": "cp1", "intent_id": intent,
                                           "disposition": "ready_for_existing_gate", "verdict": "harmful",
                                           "note": "wrong file"}]
    code, text = run("report")
    assert "rule R1" in text and "1/2" in text and "disagrees: cp1: ready_for_existing_gate, owner says harmful" in text
    db = sqlite3.connect(tmp_path / "account.db")
    assert db.execute("select count(*), sum(standing) from labels").fetchone() == (5, 4)
    assert db.execute("select value from account where section='owner_labels' and group_key='rule=R1'"
                      " and name='precision'").fetchone() == (0.5,)
    assert db.execute("select event_id from notifications order by seq").fetchall() == [("f1",), ("f2",)]


def test_with_no_labels_precision_says_why_not_zero(ledger):
    path, _ = ledger
    with SQLiteRecorder(path) as rec:
        result = account(fold_facts(rec.read()))
    rule = result.owner_labels.by_rule["R1"]
    assert rule.precision.value is None and "unlabeled" in rule.precision.why and rule.unlabeled == 2
    assert result.owner_labels.reviewer_agreement["rv"].agreement.value is None


def labeled_history(with_labels: bool, first=None):
    """``test_recheck.supervised``'s daemon history, with the owner labeling both intents
    between the rounds (and a finding-less relabel) when ``with_labels``."""
    from tests.controller.test_recheck import decide_round, loaded, observe, propose, rules
    from tillerman.controller.core.supervisor import Step
    from tillerman.ledger import events as ev
    from tillerman.ledger.memory import MemoryRecorder

    recorder, ruleset = MemoryRecorder(), rules()
    recorder.append([loaded(first or ruleset, digest=ruleset.digest)])
    step = Step(ruleset, replay=False)
    observe(recorder, 1.0, ev.ThreadStarted(thread_id="T"), ev.TurnStarted(thread_id="T", turn_id="U"))
    ids = [propose(recorder, "ann", 2.0), propose(recorder, "bob", 2.0)]
    if with_labels:
        label(recorder, ids[0], "useful", by="ann", now=2.5)
        label(recorder, ids[1], "harmful", by="ann", now=2.5)
    decide_round(recorder, step, 3.0)
    observe(recorder, 4.0, ev.TurnCompleted(thread_id="T", turn_id="U"))
    if with_labels:
        label(recorder, ids[1], "not_useful", note="second thoughts", by="ann", now=4.5)
    decide_round(recorder, step, 5.0)
    return recorder


@pytest.mark.parametrize("changed", [False, True])
def test_replay_check_is_unaffected_by_labels(changed):
    from tests.controller.test_recheck import rules, run_check

    first = rules(grants="[defaults]\nowner_grant = false\n") if changed else None
    plain, labeled = run_check(labeled_history(False, first)), run_check(labeled_history(True, first))
    if not changed:
        assert labeled.entries == plain.entries + 3
        assert (labeled.ok, labeled.decisions, labeled.shadow_decisions, labeled.rulesets) == \
               (plain.ok, plain.decisions, plain.shadow_decisions, plain.rulesets) == (True, 3, 0, 1)
        return
    # the check stops at the difference: the same decision, found again (its seq moved by the labels before it)
    assert not labeled.ok and not plain.ok
    differs = [(d.at, d.recorded, d.redecided) for d in (labeled.first_difference, plain.first_difference)]
    assert differs[0] == differs[1]


def test_ledger_export_carries_the_labels(ledger):
    path, intent = ledger
    assert run("label", intent, "useful", "--note", "kept\nas written")[0] == 0
    code, out = run("ledger", "export")
    assert code == 0
    (row,) = [json.loads(line) for line in out.splitlines() if '"owner_labeled"' in line]
    assert row["envelope"]["event"] | {"by": None} == {"kind": "owner_labeled", "thread_id": None, "turn_id": None, "subject": f"intent:{intent}",
                                                      "verdict": "useful", "note": "kept\nas written", "by": None,
                                                      "thread": "T1"}
