"""The policy decision table (fixtures/policy/cases.toml): one test per row, each
asserting the exact Decision."""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.rules.decision import Action, Decision
from tillerman.rules.policy import decide
from tillerman.rules.ruleset import Grant, RepeatedFailure, Rule, RuleSet, build_ruleset

TABLE = Path(__file__).resolve().parents[2] / "fixtures" / "policy" / "cases.toml"
DOCUMENT = tomllib.loads(TABLE.read_text(encoding="utf-8"))
DEFAULTS = DOCUMENT["defaults"]
CASES = DOCUMENT["case"]

#: The families docs/design.md "Policy: `rules.decide`" names, and the ones the policy grew.
REQUIRED_FAMILIES = {
    "allowed", "stale_turn", "no_active_turn", "expiry", "unknown_delivery", "queued", "approval",
    "critical_tool", "external_effect", "authority", "replayed", "terminal", "effect", "file_only",
}


def _layered(name: str, case: dict[str, Any]) -> dict[str, Any]:
    fields = DEFAULTS[name] | case.get(name, {})
    for cleared in case.get("clear", []):
        table, _, key = cleared.partition(".")
        if table == name:
            del fields[key]
    return fields


def _ruleset(case: dict[str, Any]) -> RuleSet:
    rules = [
        Rule(
            condition=RepeatedFailure(count=3),
            action=Action.STEER,
            owner="test",
            review_by=datetime.date(2027, 1, 1),
            text="Stop re-running {tool}.",
            **rule,
        )
        for rule in case.get("rules", DEFAULTS["rules"])
    ]
    grants = [msgspec.convert(grant, Grant) for grant in case.get("grants", DEFAULTS["grants"])]
    return build_ruleset(rules, grants)


def case_inputs(case: dict[str, Any]) -> tuple[Intent, State, ThreadSnapshot, float, RuleSet]:
    return (
        msgspec.convert(_layered("intent", case), Intent),
        State(case["state"]),
        msgspec.convert(_layered("snapshot", case), ThreadSnapshot),
        float(case["now"]),
        _ruleset(case),
    )


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_decision(case: dict[str, Any]) -> None:
    assert decide(*case_inputs(case)) == msgspec.convert(case["expect"], Decision)


def test_table_covers_the_families_and_the_seed_count() -> None:
    assert len(CASES) >= 45
    assert {case["family"] for case in CASES} >= REQUIRED_FAMILIES
    assert len({case["name"] for case in CASES}) == len(CASES), "case names must be unique"


def test_table_reaches_every_dispatch_action_and_every_state() -> None:
    assert {case["expect"]["action"] for case in CASES} >= {"steer", "queue", "interrupt"}
    assert {case["state"] for case in CASES} == set(State)
