"""[[reviewer]] tables in the config file and a rule's ``review`` key: validation with
line-accurate errors, and digests that do not move for rules without a reviewer."""

from __future__ import annotations

import pytest

from fixtures.rule_texts import reviewer, rule
from tillerman.rules.config import load_effective
from tillerman.rules.errors import RuleSetError
from tillerman.rules.files import default_ruleset, load_config, load_rules
from tillerman.rules.lifecycle import rule_digest
from tillerman.rules.review import Reviewer
from tillerman.rules.ruleset import build_ruleset

STEER = {"condition": {"kind": "turn_quiet", "for": "10m"}, "action": "steer", "text": "Read src/ first."}


def config_error(text: str) -> str:
    with pytest.raises(RuleSetError) as caught:
        load_config(text, "config.toml")
    return str(caught.value)


def test_a_reviewer_table_becomes_a_reviewer():
    text = reviewer("codex", ["codex", "exec", "--json", "-"], timeout="45s", max_per_intent=1,
                    max_per_thread_per_hour=3, adapter="codex-exec-json", probe_every=20)
    assert load_config(text, "config.toml").reviewers() == (Reviewer(
        name="codex", command=("codex", "exec", "--json", "-"), timeout=45.0, max_per_intent=1,
        max_per_thread_per_hour=3, adapter="codex-exec-json", probe_every=20),)


def test_defaults_of_a_reviewer():
    (found,) = load_config(reviewer("script", ["./review.py"]), "config.toml").reviewers()
    assert (found.timeout, found.max_per_intent, found.max_per_thread_per_hour, found.adapter) == (60.0, 2, 6, None)
    assert found.producer == "reviewer:script"


@pytest.mark.parametrize(("keys", "message"), [
    ({"timeout": "soon"}, 'config.toml:4: reviewer "r" field timeout: invalid duration "soon"; write a number'),
    ({"adapter": "gpt"}, 'config.toml:4: reviewer "r" field adapter: unknown adapter "gpt"; expected one of'
                         " codex-exec-json"),
    ({"max_per_intent": 0}, 'config.toml:4: reviewer "r" field max_per_intent: input should be greater than'),
    ({"colour": "red"}, 'config.toml:4: reviewer "r" field colour: unknown field; expected one of name, command,'),
])
def test_a_wrong_key_is_named_with_its_line(keys, message):
    assert config_error(reviewer("r", ["x"], **keys)).startswith(message)


def test_a_daily_budget_in_usd():
    (found,) = load_config(reviewer("r", ["x"], budget_usd_per_day=2), "config.toml").reviewers()
    assert found.budget_usd_per_day == 2.0
    assert load_config(reviewer("r", ["x"]), "config.toml").reviewers()[0].budget_usd_per_day is None


@pytest.mark.parametrize(("value", "problem"), [
    ("2.0", 'input should be a valid number (got "2.0"); write it like budget_usd_per_day = 2.0'),
    (0, "input should be greater than 0 (got 0)"),
    (-1.5, "input should be greater than 0 (got -1.5)"),
    (True, "input should be a valid number (got True)"),
    (1e7, "input should be less than or equal to 1000000"),
])
def test_a_budget_that_is_no_amount_is_refused_on_its_line(value, problem):
    assert config_error(reviewer("r", ["x"], budget_usd_per_day=value)).startswith(
        f'config.toml:4: reviewer "r" field budget_usd_per_day: {problem}')


def test_a_budget_on_a_reviewer_that_reports_no_cost_is_refused():
    assert config_error(reviewer("r", ["codex"], adapter="codex-exec-json", budget_usd_per_day=1.0)).startswith(
        'config.toml:5: reviewer "r" field budget_usd_per_day: codex exec reports tokens, never a cost')


def test_an_empty_command_is_refused_on_its_line():
    assert config_error("\n" + reviewer("r", [])).startswith('config.toml:4: reviewer "r" field command:')


def test_a_reviewer_name_is_used_once():
    assert config_error(reviewer("r", ["x"]) + reviewer("r", ["y"])) == (
        'config.toml:5: reviewer "r" field name: duplicate name, already used at line 2; give each [[reviewer]]'
        " its own name")


def test_a_rule_naming_an_unknown_reviewer_is_refused_on_its_line(tmp_path):
    rules, config = tmp_path / "rules.toml", tmp_path / "config.toml"
    rules.write_text(rule("quiet", **STEER, review="codx"))
    config.write_text(reviewer("codex", ["codex"]))
    with pytest.raises(RuleSetError) as caught:
        load_effective(rules, config)
    assert str(caught.value) == (
        f'{rules}:10: rule "quiet" field review: unknown reviewer "codx" (defined: codex); add a [[reviewer]]'
        f" named so to the config file {config}, or remove the key")


def test_a_rule_naming_a_reviewer_without_a_config_file_is_refused(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(rule("quiet", **STEER, review="codex"))
    with pytest.raises(RuleSetError, match=r"rules.toml:10: .* unknown reviewer \"codex\"; .*there is none"):
        load_effective(rules, None)


def test_a_rule_naming_a_configured_reviewer_loads(tmp_path):
    rules, config = tmp_path / "rules.toml", tmp_path / "config.toml"
    rules.write_text(rule("quiet", **STEER, review="codex"))
    config.write_text(reviewer("codex", ["codex"]))
    effective = load_effective(rules, config)
    assert effective.ruleset.rules[0].review == "codex"
    assert effective.reviewer("codex").command == ("codex",)


def test_the_review_key_is_an_id():
    with pytest.raises(RuleSetError, match='field review: invalid review "a b"'):
        load_rules(rule("quiet", **STEER, review="a b"), "rules.toml")


def test_digests_change_only_when_a_review_is_set():
    plain = load_rules(rule("quiet", **STEER), "rules.toml")[0]
    reviewed = load_rules(rule("quiet", **STEER, review="codex"), "rules.toml")[0]
    assert plain.review is None
    assert rule_digest(plain) != rule_digest(reviewed)
    assert build_ruleset([plain], ()).digest != build_ruleset([reviewed], ()).digest
    # the built-in rules' pinned digest (tests/rules/test_files.py) does not move
    assert default_ruleset().digest == "sha256:71a7bcfcfcbb4fe12f9065e1f37cb777c55742c1af6b0e0f8e98447853c31620"


def test_a_rule_with_a_review_writes_back_as_toml():
    from tillerman.rules.lifecycle import rule_toml
    reviewed = load_rules(rule("quiet", **STEER, review="codex"), "rules.toml")[0]
    assert load_rules(rule_toml(reviewed), "rules.toml")[0] == reviewed
