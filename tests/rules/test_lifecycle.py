"""Rule lifecycle: digests, TOML round trips, installing a promoted rule, the proposal
fold and its allowed moves, and review dates."""

from __future__ import annotations

import calendar
import datetime
from pathlib import Path

import msgspec
import pytest

from fixtures.rule_texts import rule
from tillerman.ledger.events import Entry, Envelope, RulePromoted, RuleProposed
from tillerman.rules import lifecycle
from tillerman.rules.files import default_ruleset, load_rules
from tillerman.rules.ruleset import build_ruleset

ROOT = Path(__file__).resolve().parents[2]
CANDIDATE = ROOT / "fixtures" / "disagreement" / "candidate.toml"

#: Every key a rule may have, and a text that needs escapes.
ODD = rule("odd", version=4, status="shadow", owner="ann", review_by="2027-01-02", expires="2027-02-03",
           threads=["t1", "t2"], condition={"kind": "repeated_failure", "count": 2}, action="steer",
           text='Stop "{tool}" now;\nread {args_digest}.', ack_deadline="90s", verify="test -f ok")


def day(text: str) -> float:
    return float(calendar.timegm(datetime.date.fromisoformat(text).timetuple()))


def test_rule_toml_reads_back_as_the_same_rule():
    for loaded in (*default_ruleset().rules, *load_rules(CANDIDATE.read_text(), "c"), *load_rules(ODD, "odd")):
        assert load_rules(lifecycle.rule_toml(loaded), "back") == (loaded,)
    (odd,) = load_rules(ODD, "odd")
    (active,) = load_rules(lifecycle.rule_toml(odd, status="active"), "back")
    assert active.status == "active" and msgspec.structs.replace(active, status="shadow") == odd


def test_rule_digest_binds_everything_but_the_status():
    (odd,) = load_rules(ODD, "odd")
    assert lifecycle.rule_digest(odd) == lifecycle.rule_digest(msgspec.structs.replace(odd, status="active"))
    assert lifecycle.rule_digest(odd) != lifecycle.rule_digest(msgspec.structs.replace(odd, version=5))
    assert lifecycle.rule_digest(odd).startswith("sha256:")


def test_install_replaces_the_rule_with_the_same_id_and_keeps_the_rest():
    text = CANDIDATE.read_text()
    (odd,) = load_rules(ODD, "odd")
    renamed = msgspec.structs.replace(odd, id="quiet-steer", status="active")
    installed = lifecycle.install(text, "quiet-steer", lifecycle.rule_toml(renamed))
    rules = {r.id: r for r in load_rules(installed, "x")}
    assert rules["quiet-steer"] == renamed
    assert len(rules) == 6 and rules["stall"] == default_ruleset().rule("stall")
    assert "# A candidate rule set" in installed  # comments elsewhere kept
    # a rule in the middle of the file: the next rule's leading comment stays with it
    middle = lifecycle.install(text, "repeated-failure", lifecycle.rule_toml(
        msgspec.structs.replace(default_ruleset().rule("repeated-failure"), status="shadow")))
    assert {r.id: r.status for r in load_rules(middle, "x")}["repeated-failure"] == "shadow"
    assert "# A pending approval needs a person" in middle


def test_install_appends_a_new_rule_and_starts_an_empty_file():
    (odd,) = load_rules(ODD, "odd")
    block = lifecycle.rule_toml(odd)
    assert load_rules(lifecycle.install("", "odd", block), "x") == (odd,)
    appended = lifecycle.install(CANDIDATE.read_text(), "odd", block)
    assert [r.id for r in load_rules(appended, "x")][-1] == "odd"


def _entries(*events):
    return [Entry(seq=i + 1, envelope=Envelope(event_id=f"e{i}", event=e, source="t", at=float(i)),
                  prev_hash="", hash="") for i, e in enumerate(events)]


def _proposed(digest="sha256:a", version=1):
    return RuleProposed(rule_id="quiet-steer", rule_version=version, rule_digest=digest, action="steer",
                        rule="...", evidence=("ledger:seq:7",), signature="quiet 5m", proposed_by="model")


def _promoted(frm, to, digest="sha256:a"):
    return RulePromoted(rule_id="quiet-steer", rule_version=1, rule_digest=digest, action="steer",
                        from_status=frm, to_status=to, by="ann", evaluation="diff", rollback_trigger="any false steer")


def test_fold_follows_promotions_of_the_proposed_digest_only():
    lives = lifecycle.fold(_entries(_proposed(), _promoted("proposed", "shadow"), _promoted("shadow", "active", "sha256:other")))
    life = lives["quiet-steer"]
    assert life.status == "shadow" and [p.to_status for p in life.promotions] == ["shadow"]
    assert life.evidence == ("ledger:seq:7",) and life.signature == "quiet 5m" and life.proposed_by == "model"
    lives = lifecycle.fold(_entries(_proposed(), _promoted("proposed", "shadow"), _promoted("shadow", "active"),
                                    _promoted("active", "shadow")))
    assert lives["quiet-steer"].status == "shadow" and len(lives["quiet-steer"].promotions) == 3
    # a new proposal of the same id starts over
    lives = lifecycle.fold(_entries(_proposed(), _promoted("proposed", "shadow"), _proposed("sha256:b", 2)))
    assert lives["quiet-steer"].status == "proposed" and lives["quiet-steer"].rule_version == 2


@pytest.mark.parametrize(("status", "to", "allowed"), [
    ("proposed", "shadow", True), ("proposed", "active", False), ("shadow", "active", True),
    ("shadow", "shadow", False), ("active", "shadow", True), ("active", "active", False),
])
def test_promotion_moves(status, to, allowed):
    life = lifecycle.fold(_entries(_proposed()))["quiet-steer"]
    life.status = status
    assert (lifecycle.promotion_problem(life, "quiet-steer", to) is None) == allowed


def test_promotion_problem_messages():
    assert lifecycle.promotion_problem(None, "x", "shadow") == (
        "no proposed rule x in the ledger; record it first with tillerman rules propose FILE")
    life = lifecycle.fold(_entries(_proposed()))["quiet-steer"]
    assert lifecycle.promotion_problem(life, "quiet-steer", "active") == (
        "rule quiet-steer is proposed: it cannot go to active (allowed: shadow); "
        "promote it to shadow first and judge it with tillerman rules diff")


def test_reviews_report_expired_and_unreviewed_rules_in_force_only():
    (odd,) = load_rules(ODD, "odd")  # shadow, review_by 2027-01-02, expires 2027-02-03
    retired = msgspec.structs.replace(odd, id="gone", status="retired")
    ruleset = build_ruleset((odd, retired), ())
    assert lifecycle.reviews(ruleset, day("2027-01-01")) == []
    (review,) = lifecycle.reviews(ruleset, day("2027-01-02"))
    assert (review.rule_id, review.why, review.due, review.due_at) == ("odd", "review_overdue", "2027-01-02", day("2027-01-02"))
    assert review.message == ("rule odd v4 was due for review on 2027-01-02 and is still shadow; "
                              "review it and set a new review_by, or retire it")
    (review,) = lifecycle.reviews(ruleset, day("2027-03-01"))
    assert (review.why, review.due) == ("expired", "2027-02-03")
    assert lifecycle.warning(odd, day("2027-03-01")) == "expired 2027-02-03"
    assert lifecycle.warning(odd, day("2026-03-01")) is None
