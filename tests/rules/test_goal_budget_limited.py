"""The goal_budget_limited trigger (fixtures/policy/goal_budget_limited.toml): detect()'s
findings for each row, the triggers kept for the thread agreeing with them, and the
rule file's schema for the condition."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tillerman.ledger.snapshot import GOAL_BUDGET_LIMITED, ThreadGoal, ThreadSnapshot, Watched
from tillerman.rules.detect import detect, render, triggers, triggers_may_find
from tillerman.rules.errors import RuleSetError
from tillerman.rules.files import load_rules
from tillerman.rules.ruleset import GoalBudgetLimited, Rule, build_ruleset

TABLE = Path(__file__).resolve().parents[2] / "fixtures" / "policy" / "goal_budget_limited.toml"
DOCUMENT = tomllib.loads(TABLE.read_text(encoding="utf-8"))
DEFAULTS = DOCUMENT["defaults"]
CASES = DOCUMENT["case"]


def _inputs(case: dict[str, Any]) -> tuple[ThreadSnapshot, Rule]:
    goal = None
    if case.get("goal", {}) is not False:
        fields = DEFAULTS["goal"] | case.get("goal", {})
        for cleared in case.get("clear", []):
            del fields[cleared.removeprefix("goal.")]
        goal = msgspec.convert(fields, ThreadGoal)
    snapshot = msgspec.convert(DEFAULTS["snapshot"] | case.get("snapshot", {}), ThreadSnapshot)
    rule = msgspec.convert({**DEFAULTS["rule"], **case.get("rule", {}), "condition": {"kind": "goal_budget_limited"}},
                           Rule)
    return msgspec.structs.replace(snapshot, goal=goal), rule


def _watched(snapshot: ThreadSnapshot) -> Watched:
    """What the fold's ``watched`` says of such a thread (tests/ledger covers that one)."""
    goal = snapshot.goal
    return Watched(thread_id=snapshot.thread_id, supervised=snapshot.supervised, active_turn_id=snapshot.active_turn_id,
                   goal_budget_limited_at=goal.changed_at if goal and goal.status == GOAL_BUDGET_LIMITED else None)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_goal_budget_limited(case: dict[str, Any]) -> None:
    snapshot, rule = _inputs(case)
    ruleset = build_ruleset((rule,), ())
    now = float(case.get("now", DEFAULTS["now"]))
    found = detect(snapshot, now, ruleset)
    assert [{"key": f.key, "turn": f.turn_id or "", "status": f.status, "finding": f.finding} for f in found] \
        == case["expect"]
    # the daemon and replay run detect only where the triggers say a finding may be
    assert triggers_may_find(triggers(_watched(snapshot), ruleset), now) == bool(found)


def test_the_table_covers_each_goal_status_codex_has() -> None:
    statuses = {(DEFAULTS["goal"] | case.get("goal", {}))["status"] for case in CASES if case.get("goal") is not False}
    assert statuses >= {"active", "paused", "complete", "budgetLimited", "usageLimited", "cleared"}


def test_the_rule_text_names_the_budget_and_the_use() -> None:
    snapshot, rule = _inputs({})
    rule = msgspec.structs.replace(rule, action="queue", text="Budget {token_budget} spent ({tokens_used}); wrap up.")
    (finding,) = detect(snapshot, 130.0, build_ruleset((rule,), ()))
    assert finding.text == "Budget 20000 spent (26000); wrap up." == render(rule.text, {
        "token_budget": "20000", "tokens_used": "26000"})
    assert finding.detail == {"goal_status": "budgetLimited", "token_budget": 20000, "tokens_used": 26000,
                              "time_used_seconds": None, "goal_turn": "g2", "since": 100.0}


RULE = '''[[rule]]
id = "budget"
version = 1
status = "active"
owner = "ann"
review_by = "2027-06-01"
condition = {{ kind = "goal_budget_limited"{extra} }}
action = "report_overdue"
{tail}'''


def test_a_rules_file_names_the_condition() -> None:
    (rule,) = load_rules(RULE.format(extra="", tail='text = "{tokens_used} of {token_budget}"\n'), "rules.toml")
    assert rule.condition == GoalBudgetLimited()


@pytest.mark.parametrize(("extra", "tail", "message"), [
    pytest.param(', for = "10m"', "", 'rules.toml:7: rule "budget" field condition.for: unknown field; expected one'
                 " of kind", id="it takes no parameter"),
    pytest.param("", 'text = "{quiet_for}"\n', 'rules.toml:9: rule "budget" field text: unknown placeholder'
                 ' "{quiet_for}" for kind goal_budget_limited; available: {thread_id}, {turn_id}, {token_budget},'
                 " {tokens_used}", id="a placeholder of another kind"),
])
def test_a_rules_file_error_names_its_line(extra: str, tail: str, message: str) -> None:
    with pytest.raises(RuleSetError) as raised:
        load_rules(RULE.format(extra=extra, tail=tail), "rules.toml")
    assert str(raised.value) == message
