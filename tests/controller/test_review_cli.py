"""``tillerman review try`` through the real command line: a reviewer script answers a
packet built from the ledger, and the exit code says whether the answer was accepted."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from fixtures.rule_texts import grant, reviewer
from tillerman.controller.cli.main import main
from tillerman.ledger.events import Envelope, TurnStarted
from tillerman.ledger.sqlite import SQLiteRecorder

GOOD = {"disposition": "ready_for_existing_gate", "reason": "the evidence supports the steer", "confidence": 0.6}


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("TILLERMAN_LEDGER", str(path))
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=TurnStarted(thread_id="T1", turn_id="U1"), source="appserver:x",
                             at=1.0)])
    return path


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def intent_id() -> str:
    code, out = run("intent", "propose", "--thread", "T1", "--expected-turn", "active", "--mode", "steer",
                    "--text", "Stop the grep; read src/ instead.", "--json")
    assert code == 0, out
    return json.loads(out)["id"]


def config(tmp_path, answer: str) -> str:
    script = tmp_path / "answer.py"
    script.write_text(f"import sys\nsys.stdin.read()\nsys.stdout.write({answer!r})\n")
    path = tmp_path / "config.toml"
    path.write_text(grant("reviewer:script", ["steer"]) + reviewer("script", [sys.executable, str(script)]))
    return str(path)


def test_an_accepted_answer_exits_0_and_says_what_would_happen(ledger, tmp_path):
    intent = intent_id()
    code, out = run("review", "try", "--reviewer", "script", "--checkpoint", "before_dispatch", "--intent", intent,
                    "--config", config(tmp_path, json.dumps(GOOD)), "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["accepted"] and data["called"]
    assert data["packet"]["checkpoint_id"] == f"before_dispatch:{intent}@U1"
    assert data["packet"]["interventions_allowed"] == ["steer"]
    assert data["packet"]["question"] == data["packet"]["question_again"]
    assert data["consequence"]["step"] == "hand_back"


def test_a_refused_answer_exits_1_and_records_nothing(ledger, tmp_path):
    intent = intent_id()
    with SQLiteRecorder(ledger) as rec:
        before = rec.max_seq()
    code, out = run("review", "try", "--reviewer", "script", "--checkpoint", "review", "--intent", intent,
                    "--config", config(tmp_path, json.dumps(GOOD | {"disposition": "merge"})))
    assert code == 1, out
    assert "failed closed: review_failed:verdict_not_disposition" in out
    assert "the controller would: hold" in out
    with SQLiteRecorder(ledger) as rec:
        assert rec.max_seq() == before


def test_an_unknown_reviewer_is_a_usage_error(ledger, tmp_path):
    code, out = run("review", "try", "--reviewer", "nobody", "--checkpoint", "rescue", "--intent", intent_id(),
                    "--config", config(tmp_path, "{}"))
    assert code == 2 and "no reviewer 'nobody' in the config file (script)" in out


def test_an_unknown_intent_is_a_usage_error(ledger, tmp_path):
    code, out = run("review", "try", "--reviewer", "script", "--checkpoint", "rescue", "--intent", "in-none",
                    "--config", config(tmp_path, "{}"))
    assert code == 2 and "no intent in-none" in out


def test_try_says_what_the_ledger_recorded_of_the_checkpoint(ledger, tmp_path):
    from tillerman.ledger.events import ReviewCommitted
    intent = intent_id()
    cfg = config(tmp_path, json.dumps(GOOD))
    args = ("review", "try", "--reviewer", "script", "--checkpoint", "before_dispatch", "--intent", intent,
            "--config", cfg)
    code, out = run(*args)
    assert code == 0 and "a daemon would call the reviewer" in out
    with SQLiteRecorder(ledger) as rec:
        rec.append([Envelope(event_id="c", source="test", at=2.0, event=ReviewCommitted(
            checkpoint_id=f"before_dispatch:{intent}@U1", checkpoint="before_dispatch", reviewer="script",
            intent_id=intent, thread_id="T1", outcome="accepted", disposition="hold"))])
    code, out = run(*args, "--json")
    assert code == 0 and "already committed (hold)" in json.loads(out)["ledger"]


def test_try_says_a_daemon_would_not_call_a_reviewer_whose_budget_is_spent(ledger, tmp_path):
    import time

    from tillerman.ledger.events import ReviewCommitted, ReviewPending
    intent = intent_id()
    script = tmp_path / "answer.py"
    script.write_text(f"import sys\nsys.stdin.read()\nsys.stdout.write({json.dumps(GOOD)!r})\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(reviewer("script", [sys.executable, str(script)], budget_usd_per_day=1.0))
    now, where = time.time(), {"checkpoint": "before_dispatch", "reviewer": "script", "thread_id": "T1"}
    with SQLiteRecorder(ledger) as rec:  # an earlier call today cost the whole budget
        rec.append([Envelope(event_id="p", source="test", at=now, event=ReviewPending(checkpoint_id="earlier",
                                                                                      **where)),
                    Envelope(event_id="c", source="test", at=now, event=ReviewCommitted(
                        checkpoint_id="earlier", outcome="accepted", disposition="hold", cost_usd=1.0, **where))])
    code, out = run("review", "try", "--reviewer", "script", "--checkpoint", "before_dispatch", "--intent", intent,
                    "--config", str(cfg), "--json")
    assert code == 0, out  # try itself calls: it is how a person tests the command
    assert json.loads(out)["ledger"].startswith("review_failed:budget: reviewer script spent 1.0000 USD today")


def labeled_config(tmp_path) -> str:
    """A reviewer that holds the intent whose text mentions tests and lets the others through."""
    script = tmp_path / "by_text.py"
    script.write_text("import json, sys\npacket = json.load(sys.stdin)\n"
                      "held = 'tests' in packet['intended_outcome']\n"
                      f"answer = {GOOD!r}\n"
                      "answer['disposition'] = 'hold' if held else 'ready_for_existing_gate'\n"
                      "sys.stdout.write(json.dumps(answer))\n")
    path = tmp_path / "config.toml"
    path.write_text(grant("reviewer:script", ["steer"]) + reviewer("script", [sys.executable, str(script)]))
    return str(path)


def test_try_labeled_measures_the_reviewers_agreement_with_the_owner(ledger, tmp_path):
    ids = {}
    for text in ("Read src/ instead.", "Run the tests first.", "Stop the grep."):
        code, out = run("intent", "propose", "--thread", "T1", "--expected-turn", "active", "--mode", "steer",
                        "--text", text, "--json")
        ids[text] = json.loads(out)["id"]
    # the owner: the first useful, the second harmful (the reviewer holds it: agrees), the third
    # not_useful (the reviewer lets it through: disagrees); relabeled, the latest label counts
    for text, verdict in (("Read src/ instead.", "useful"), ("Run the tests first.", "harmful"),
                          ("Stop the grep.", "useful"), ("Stop the grep.", "not_useful")):
        assert run("label", ids[text], verdict)[0] == 0
    with SQLiteRecorder(ledger) as rec:
        before = rec.max_seq()
    cfg = labeled_config(tmp_path)
    code, out = run("review", "try", "--reviewer", "script", "--checkpoint", "before_dispatch", "--labeled",
                    "--config", cfg, "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["compared"] == 3 and data["agreement"]["value"] == round(2 / 3, 4)
    assert {item["intent_id"]: (item["verdict"], item["disposition"], item["agrees"]) for item in data["items"]} == {
        ids["Read src/ instead."]: ("useful", "ready_for_existing_gate", True),
        ids["Run the tests first."]: ("harmful", "hold", True),
        ids["Stop the grep."]: ("not_useful", "ready_for_existing_gate", False)}
    code, out = run("review", "try", "--reviewer", "script", "--checkpoint", "before_dispatch", "--labeled",
                    "--config", cfg)
    assert code == 0 and "agreement: 0.6667 (2 of 3 compared; 0 failed closed)" in out
    assert f"{ids['Stop the grep.']}: owner not_useful, script ready_for_existing_gate  DISAGREES" in out
    with SQLiteRecorder(ledger) as rec:
        assert rec.max_seq() == before  # a try records nothing


def test_try_labeled_asks_about_the_newest_labels_up_to_its_limit(ledger, tmp_path):
    """Each answer is a reviewer call, which costs: --limit (25 unless given) caps them,
    the intents labeled last first; the output says how many were left out."""
    ids = []
    for text in ("Read src/ instead.", "Run the tests first.", "Stop the grep."):
        code, out = run("intent", "propose", "--thread", "T1", "--expected-turn", "active", "--mode", "steer",
                        "--text", text, "--json")
        ids.append(json.loads(out)["id"])
    for intent, verdict in ((ids[2], "useful"), (ids[0], "useful"), (ids[1], "harmful")):
        assert run("label", intent, verdict)[0] == 0
    cfg = labeled_config(tmp_path)
    args = ("review", "try", "--reviewer", "script", "--checkpoint", "before_dispatch", "--labeled", "--config", cfg)
    code, out = run(*args, "--limit", "2", "--json")
    data = json.loads(out)
    assert code == 0 and (data["asked"], data["labeled"]) == (2, 3)
    assert [item["intent_id"] for item in data["items"]] == [ids[0], ids[1]]  # labeled last
    code, out = run(*args, "--limit", "2")
    assert code == 0 and "asked about the newest 2 of 3 labeled intents; --limit 3 asks about all" in out
    assert json.loads(run(*args, "--json")[1])["asked"] == 3
    code, out = run(*args, "--limit", "0")
    assert code == 2 and "--limit" in out


def test_try_labeled_counts_a_failed_answer_apart_and_exits_1(ledger, tmp_path):
    assert run("label", intent_id(), "useful")[0] == 0
    code, out = run("review", "try", "--reviewer", "script", "--checkpoint", "before_dispatch", "--labeled",
                    "--config", config(tmp_path, json.dumps(GOOD | {"disposition": "merge"})), "--json")
    data = json.loads(out)
    assert code == 1 and data["compared"] == 0 and data["agreement"]["value"] is None
    assert data["items"][0]["failed"] == "review_failed:verdict_not_disposition"


@pytest.mark.parametrize(("args", "error"), [
    ((), "give --intent ID, or --labeled"),
    (("--intent", "in-x", "--labeled"), "give --intent ID, or --labeled"),
    (("--labeled",), "the owner labeled no intent in this ledger"),
    (("--intent", "in-x", "--limit", "3"), "--limit counts the labeled intents asked about"),
])
def test_try_needs_one_intent_or_the_labeled_ones(ledger, tmp_path, args, error):
    code, out = run("review", "try", "--reviewer", "script", "--checkpoint", "rescue", *args,
                    "--config", config(tmp_path, "{}"))
    assert code == 2 and error in out, out
