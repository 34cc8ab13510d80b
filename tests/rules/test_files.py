"""Rule and config files: what loads, and the exact, line-accurate error for what does not."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures.rule_texts import NO_OWNER_GRANT, grant, rule
from tillerman.rules.config import load_effective
from tillerman.rules.decision import Action
from tillerman.rules.errors import RuleSetError
from tillerman.rules.files import default_ruleset, load_rules
from tillerman.rules.owner import owner_grant
from tillerman.rules.ruleset import EMPTY, Grant, RepeatedFailure, Rule, TurnQuiet, build_ruleset

ROOT = Path(__file__).resolve().parents[2]

STALL = "# the stall rule\n" + rule(
    "stall", review_by="2027-03-01", condition={"kind": "turn_quiet", "for": "10m"}, action="report_overdue")

# The condition as a table of its own, the other way a person writes it.
REPEATED_FAILURE = rule(
    "repeated-failure", version=3, status="shadow", review_by="2027-03-01", expires="2027-06-01",
    threads=["t1", "t2"], action="steer", text="Stop re-running {tool}: it failed {count} times (exit {exit_code}).",
    ack_deadline="2m") + """
[rule.condition]
kind = "repeated_failure"
count = 3
within = "turn"
"""

GRANTS = """\
[client]
name = "tillerman"   # other sections belong to other loaders

""" + grant("rule:repeated-failure", ["steer"], threads="*") + "\n" + grant(
    "owner:ann", ["interrupt", "interrupt_critical"], threads=["t1"])


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def rules_error(tmp_path: Path, text: str) -> str:
    """The message for a rules file, with its path shortened to ``rules.toml``."""
    path = write(tmp_path, "rules.toml", text)
    with pytest.raises(RuleSetError) as caught:
        load_effective(path, None)
    return str(caught.value).replace(str(path), "rules.toml")


def config_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, "config.toml", text)
    with pytest.raises(RuleSetError) as caught:
        load_effective(None, path)
    return str(caught.value).replace(str(path), "config.toml")


# -- valid files ------------------------------------------------------------------------


def test_rules_file_loads_into_frozen_rules(tmp_path: Path) -> None:
    ruleset = load_effective(write(tmp_path, "rules.toml", STALL + "\n" + REPEATED_FAILURE), None).ruleset
    assert ruleset.rules == (
        Rule(
            id="stall",
            version=1,
            status="active",
            condition=TurnQuiet(for_seconds=600.0),
            action=Action.REPORT_OVERDUE,
            owner="platform-team",
            review_by=datetime.date(2027, 3, 1),
        ),
        Rule(
            id="repeated-failure",
            version=3,
            status="shadow",
            condition=RepeatedFailure(count=3, within="turn"),
            action=Action.STEER,
            owner="platform-team",
            review_by=datetime.date(2027, 3, 1),
            expires=datetime.date(2027, 6, 1),
            threads=("t1", "t2"),
            text="Stop re-running {tool}: it failed {count} times (exit {exit_code}).",
            ack_deadline=120.0,
        ),
    )
    assert ruleset.grants == (owner_grant(),)  # no config file: the owner's built-in grant only


def test_config_file_loads_grants_and_leaves_other_sections_alone(tmp_path: Path) -> None:
    ruleset = load_effective(None, write(tmp_path, "config.toml", GRANTS)).ruleset
    assert ruleset.grants == (
        owner_grant(),
        Grant(subject="rule:repeated-failure", actions=frozenset({"steer"}), threads="*"),
        Grant(subject="owner:ann", actions=frozenset({"interrupt", "interrupt_critical"}), threads=("t1",)),
    )
    assert ruleset.allows("owner:ann", "interrupt_critical", "t1")
    assert not ruleset.allows("owner:ann", "interrupt_critical", "t2")
    assert not ruleset.allows("owner:ann", "steer", "t1")


def test_no_files_give_the_builtin_rules_and_only_the_owner_grant() -> None:
    ruleset = load_effective(None, None).ruleset
    assert ruleset.rules == default_ruleset().rules
    assert ruleset.grants == (owner_grant(),)
    assert [rule.id for rule in ruleset.rules] == [
        "stall", "repeated-failure", "approval-wait", "overdue-intent", "quiet-critical-tool",
    ]
    assert all(rule.status == "active" for rule in ruleset.rules)


def test_builtin_approval_rule_only_reports() -> None:
    approval = next(rule for rule in default_ruleset().rules if rule.id == "approval-wait")
    assert approval.action is Action.REPORT_OVERDUE


def test_builtin_defaults_ship_as_package_data() -> None:
    assert (ROOT / "rules" / "defaults.toml").is_file() and (ROOT / "rules" / "defaults.compiled.json").is_file()
    assert '"tillerman.rules" = ["*.toml", "defaults.compiled.json", "prices.json"]' in (ROOT / "pyproject.toml").read_text(
        encoding="utf-8")


def test_an_empty_rules_file_without_the_owner_grant_is_an_empty_rule_set(tmp_path: Path) -> None:
    rules, config = write(tmp_path, "rules.toml", "# nothing yet\n"), write(tmp_path, "config.toml", NO_OWNER_GRANT)
    assert load_effective(rules, config).ruleset == EMPTY


# -- the owner's built-in grant and [defaults] -------------------------------------------

def test_the_builtin_grant_lets_the_local_owner_steer_and_queue_anywhere_and_nothing_else() -> None:
    ruleset = load_effective(None, None).ruleset
    owner = owner_grant().subject
    assert owner.startswith("owner:") and owner_grant().builtin
    for thread in ("t1", "019a-any-thread"):
        assert ruleset.allows(owner, "steer", thread) and ruleset.allows(owner, "queue", thread)
        assert not ruleset.allows(owner, "interrupt", thread)
        assert not ruleset.allows(owner, "interrupt_critical", thread)
        for other in ("owner:someone-else", "rule:repeated-failure", "rule:stall", "reviewer:rex"):
            assert not any(ruleset.allows(other, action, thread) for action in ("steer", "queue", "interrupt"))


def test_owner_grant_false_removes_the_builtin_grant_and_keeps_the_files(tmp_path: Path) -> None:
    ruleset = load_effective(None, write(tmp_path, "config.toml", GRANTS + "\n" + NO_OWNER_GRANT)).ruleset
    assert [grant.subject for grant in ruleset.grants] == ["rule:repeated-failure", "owner:ann"]
    assert not ruleset.allows(owner_grant().subject, "steer", "t1")
    assert load_effective(None, write(tmp_path, "only.toml", NO_OWNER_GRANT)).ruleset.grants == ()


def test_owner_grant_true_is_the_same_as_leaving_it_out(tmp_path: Path) -> None:
    explicit = load_effective(None, write(tmp_path, "config.toml", GRANTS + "\n[defaults]\nowner_grant = true\n"))
    assert explicit.ruleset == load_effective(None, write(tmp_path, "plain.toml", GRANTS)).ruleset


# -- rules file errors: file, line, rule, field, and what to write -----------------------

RULE_HEAD = rule("stall", owner="me", review_by="2027-03-01")


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        pytest.param(
            'condition = { kind = "turn_slow", for = "10m" }\naction = "report_overdue"\n',
            'rules.toml:7: rule "stall" field condition.kind: unknown kind "turn_slow"; expected one of turn_quiet, '
            "repeated_failure, approval_waiting, critical_tool_running, intent_overdue, turn_long, goal_budget_limited, budget",
            id="unknown condition kind",
        ),
        pytest.param(
            'condition = { kind = "turn_quiet", for = "10m" }\naction = "nudge"\n',
            'rules.toml:8: rule "stall" field action: unknown action "nudge"; expected one of observe, '
            "observe_critical, reconcile, reconcile_turn, report_overdue, steer, queue, interrupt, stop, "
            "verify_effect, expire, escalate",
            id="unknown action",
        ),
        pytest.param(
            'condition = { kind = "turn_quiet", for = "10m" }\naction = "observe"\ncolour = "red"\n',
            'rules.toml:9: rule "stall" field colour: unknown field; expected one of id, version, status, owner, '
            "review_by, expires, threads, condition, action, text, ack_deadline, verify, review, task_class",
            id="unknown rule field",
        ),
        pytest.param(
            'condition = { kind = "turn_quiet", for = "10m", op = ">=" }\naction = "observe"\n',
            'rules.toml:7: rule "stall" field condition.op: unknown field; expected one of kind, for',
            id="unknown condition field (an operator)",
        ),
        pytest.param(
            'condition = "quiet > 10m"\naction = "observe"\n',
            'rules.toml:7: rule "stall" field condition: must be a table of a kind and its parameters, '
            'e.g. condition = { kind = "turn_quiet", for = "10m" }',
            id="condition written as an expression",
        ),
        pytest.param(
            'condition = { for = "10m" }\naction = "observe"\n',
            'rules.toml:7: rule "stall" field condition.kind: missing; add kind = "turn_quiet" (one of turn_quiet, '
            "repeated_failure, approval_waiting, critical_tool_running, intent_overdue, turn_long, goal_budget_limited, budget)",
            id="missing kind",
        ),
        pytest.param(
            'condition = { kind = "approval_waiting" }\naction = "report_overdue"\n',
            'rules.toml:7: rule "stall" field condition.for: missing; add for = "10m"',
            id="missing condition parameter",
        ),
        pytest.param(
            'condition = { kind = "turn_quiet", for = "10 minutes" }\naction = "observe"\n',
            'rules.toml:7: rule "stall" field condition.for: invalid duration "10 minutes"; '
            "write a number and a unit, like 90s, 5m, 1.5h, 1h30m or 250ms",
            id="invalid duration",
        ),
        pytest.param(
            'condition = { kind = "turn_quiet", for = 600 }\naction = "observe"\n',
            'rules.toml:7: rule "stall" field condition.for: invalid duration 600; '
            "write a number and a unit, like 90s, 5m, 1.5h, 1h30m or 250ms",
            id="duration without a unit",
        ),
        pytest.param(
            'condition = { kind = "repeated_failure", count = 1 }\naction = "observe"\n',
            'rules.toml:7: rule "stall" field condition.count: input should be greater than or equal to 2 (got 1); '
            "write it like count = 3",
            id="count too small",
        ),
        pytest.param(
            'condition = { kind = "repeated_failure", count = 3, within = "session" }\naction = "observe"\n',
            'rules.toml:7: rule "stall" field condition.within: unknown within "session"; expected one of turn',
            id="unknown within",
        ),
        pytest.param(
            'condition = { kind = "repeated_failure", count = 3 }\naction = "steer"\n',
            'rules.toml:1: rule "stall" field text: missing; a steer rule needs the text to send, '
            'e.g. text = "Stop …; read … first."',
            id="steer rule without text",
        ),
        pytest.param(
            'condition = { kind = "repeated_failure", count = 3 }\naction = "steer"\n'
            'text = "Stop {command_name}"\n',
            'rules.toml:9: rule "stall" field text: unknown placeholder "{command_name}" for kind repeated_failure; '
            "available: {thread_id}, {turn_id}, {count}, {tool}, {exit_code}, {args_digest}",
            id="unknown placeholder",
        ),
        pytest.param(
            'condition = { kind = "turn_quiet", for = "10m" }\naction = "observe"\ntext = "quiet {quiet_for!r}"\n',
            'rules.toml:9: rule "stall" field text: placeholder {quiet_for} takes no format spec or conversion; '
            "write {quiet_for}",
            id="placeholder with a conversion",
        ),
        pytest.param(
            'action = "observe"\n[rule.condition]\nkind = "turn_quiet"\nfor = "soon"\n',
            'rules.toml:10: rule "stall" field condition.for: invalid duration "soon"; '
            "write a number and a unit, like 90s, 5m, 1.5h, 1h30m or 250ms",
            id="error inside a [rule.condition] sub-table",
        ),
        pytest.param(
            'action = "observe"\ncondition.kind = "turn_quiet"\ncondition.fr = "10m"\n',
            'rules.toml:8: rule "stall" field condition.for: missing; add for = "10m"\n'
            'rules.toml:9: rule "stall" field condition.fr: unknown field; expected one of kind, for',
            id="errors in dotted keys",
        ),
    ],
)
def test_rule_error(tmp_path: Path, tail: str, message: str) -> None:
    assert rules_error(tmp_path, RULE_HEAD + tail) == message


def test_error_names_the_right_rule_among_several(tmp_path: Path) -> None:
    text = STALL + "\n" + STALL.replace('"stall"', '"stall-2"').replace('"active"', '"live"')
    assert rules_error(tmp_path, text) == (
        'rules.toml:15: rule "stall-2" field status: unknown status "live"; '
        "expected one of proposed, shadow, active, retired"
    )


def test_rule_without_id_is_named_by_position(tmp_path: Path) -> None:
    text = STALL + "\n" + STALL.replace('id = "stall"\n', "")
    assert rules_error(tmp_path, text) == 'rules.toml:12: rule #2 field id: missing; add id = "stall"'


def test_every_error_is_reported_in_line_order(tmp_path: Path) -> None:
    text = STALL.replace("version = 1", 'version = "1"').replace('"10m"', '"10 m"')
    assert rules_error(tmp_path, text).splitlines() == [
        'rules.toml:4: rule "stall" field version: input should be a valid integer (got "1"); write it like version = 1',
        'rules.toml:8: rule "stall" field condition.for: invalid duration "10 m"; '
        "write a number and a unit, like 90s, 5m, 1.5h, 1h30m or 250ms",
    ]


def test_duplicate_rule_id(tmp_path: Path) -> None:
    assert rules_error(tmp_path, STALL + "\n" + STALL) == (
        'rules.toml:13: rule "stall" field id: duplicate id, already used at line 3; '
        "give each rule its own id (raise version to change a rule)"
    )


def test_invalid_rule_id(tmp_path: Path) -> None:
    assert rules_error(tmp_path, STALL.replace('"stall"', '"rule: stall"')) == (
        'rules.toml:3: rule "rule: stall" field id: invalid id "rule: stall"; '
        'use letters, digits, ".", "_" and "-", starting with a letter or digit'
    )


def test_unknown_top_level_table(tmp_path: Path) -> None:
    assert rules_error(tmp_path, STALL.replace("[[rule]]", "[[rules]]")) == (
        "rules.toml:2: top level field rules: unknown field; expected one of rule"
    )


def test_toml_syntax_error_keeps_its_line(tmp_path: Path) -> None:
    assert rules_error(tmp_path, STALL.replace('"active"', "active")) == (
        'rules.toml:5: invalid TOML: Invalid value at column 10; strings need quotes, e.g. status = "active"'
    )


def test_unreadable_rules_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(RuleSetError, match=r"missing\.toml: cannot read it \(No such file or directory\); check the path"):
        load_effective(path, None)


def test_rules_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_bytes(b'# caf\xe9\n')
    with pytest.raises(RuleSetError) as caught:
        load_effective(path, None)
    assert str(caught.value) == f"{path}:1: not UTF-8 text (invalid continuation byte at byte 5); save it as UTF-8"


# -- config file errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            '[[grant]]\nsubject = "rule:x"\nactions = ["steer", "nudge"]\n',
            'config.toml:3: grant "rule:x" field actions: unknown action "nudge"; '
            "expected one of steer, queue, interrupt, interrupt_critical, stop",
            id="unknown action",
        ),
        pytest.param(
            '[[grant]]\nsubject = "rule:x"\nactions = ["escalate"]\n',
            'config.toml:3: grant "rule:x" field actions: unknown action "escalate"; '
            "expected one of steer, queue, interrupt, interrupt_critical, stop",
            id="a registered action that is not grantable",
        ),
        pytest.param(
            '[[grant]]\nsubject = "bob"\nactions = ["steer"]\n',
            'config.toml:2: grant "bob" field subject: invalid subject "bob"; '
            'write "owner:NAME", "rule:ID", "reviewer:NAME" or "*"',
            id="bad subject",
        ),
        pytest.param(
            '[[grant]]\nsubject = "owner:ann"\nactions = []\n',
            'config.toml:3: grant "owner:ann" field actions: must not be empty; write it like actions = ["steer"]',
            id="no actions",
        ),
        pytest.param(
            '[[grant]]\nsubject = "owner:ann"\nactions = ["steer"]\nthreads = 3\n',
            'config.toml:4: grant "owner:ann" field threads: invalid threads 3; '
            'write "*", one thread id, or a list of thread ids',
            id="bad threads",
        ),
        pytest.param(
            '[[grant]]\nsubject = "owner:ann"\nactions = ["steer"]\nthread = "t1"\n',
            'config.toml:4: grant "owner:ann" field thread: unknown field; expected one of subject, actions, threads',
            id="unknown grant field",
        ),
        pytest.param(
            '[client]\nname = "x"\n\n[[grant]]\nactions = ["steer"]\n',
            'config.toml:4: grant #1 field subject: missing; add subject = "owner:NAME"',
            id="missing subject",
        ),
        pytest.param(
            "grant = 1\n",
            "config.toml:1: top level field grant: must be [[grant]] tables",
            id="grant not a table array",
        ),
        pytest.param(
            '[[grant]]\nsubject = "owner:ann"\nactions = ["steer"]\n\n[defaults]\nowner_grant = "no"\n',
            'config.toml:6: defaults field owner_grant: must be true or false (got "no"); write it like owner_grant = false',
            id="owner_grant not a boolean",
        ),
        pytest.param(
            '[defaults]\nowner_grant = "false"\n',
            'config.toml:2: defaults field owner_grant: must be true or false (got "false"); '
            "write it like owner_grant = false",
            id="owner_grant a string that reads like a boolean",
        ),
        pytest.param(
            '# mine\n[defaults]\nowner_grant = 0\n',
            "config.toml:3: defaults field owner_grant: must be true or false (got 0); write it like owner_grant = false",
            id="owner_grant a number",
        ),
        pytest.param(
            '[defaults]\nowner_grant = false\nowner_grants = false\n',
            "config.toml:3: defaults field owner_grants: unknown field; expected one of owner_grant, usage_report",
            id="unknown key under defaults",
        ),
        pytest.param(
            '[defaults]\nusage_report = "false"\n',
            'config.toml:2: defaults field usage_report: must be true or false (got "false");'
            " write it like usage_report = false",
            id="usage_report a string",
        ),
        pytest.param(
            "defaults = false\n",
            "config.toml:1: top level field defaults: must be a table, written [defaults] followed by its keys",
            id="defaults not a table",
        ),
    ],
)
def test_config_error(tmp_path: Path, text: str, message: str) -> None:
    assert config_error(tmp_path, text) == message


# -- the digest -------------------------------------------------------------------------------


def digest_of(tmp_path: Path, rules: str, config: str = GRANTS) -> str:
    return load_effective(write(tmp_path, "rules.toml", rules), write(tmp_path, "config.toml", config)).ruleset.digest


def test_digest_ignores_layout_comments_and_order(tmp_path: Path) -> None:
    digest = digest_of(tmp_path, STALL + "\n" + REPEATED_FAILURE)
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
    reordered = REPEATED_FAILURE + "\n# moved\n" + STALL.replace('"report_overdue"', '"report_overdue"   # same')
    swapped_grants = GRANTS.replace('"interrupt", "interrupt_critical"', '"interrupt_critical", "interrupt"')
    assert digest_of(tmp_path, reordered, swapped_grants) == digest


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("version = 1", "version = 2"),
        ('for = "10m"', 'for = "11m"'),
        ('status = "shadow"', 'status = "active"'),
        ("(exit {exit_code})", "(last exit {exit_code})"),
        ('threads = ["t1", "t2"]', 'threads = ["t1"]'),
    ],
)
def test_digest_changes_with_any_rule_change(tmp_path: Path, old: str, new: str) -> None:
    rules = STALL + "\n" + REPEATED_FAILURE
    assert old in rules
    assert digest_of(tmp_path, rules.replace(old, new)) != digest_of(tmp_path, rules)


@pytest.mark.parametrize(
    ("old", "new"),
    [('threads = ["t1"]', 'threads = ["t2"]'), ('actions = ["steer"]', 'actions = ["queue"]'), ("owner:ann", "owner:bob")],
)
def test_digest_changes_with_any_grant_change(tmp_path: Path, old: str, new: str) -> None:
    assert digest_of(tmp_path, STALL, GRANTS.replace(old, new)) != digest_of(tmp_path, STALL)


def test_digest_changes_when_the_owner_grant_is_turned_off(tmp_path: Path) -> None:
    assert digest_of(tmp_path, STALL, GRANTS + "\n" + NO_OWNER_GRANT) != digest_of(tmp_path, STALL)


def test_a_file_grant_like_the_builtin_one_still_counts_in_the_digest(tmp_path: Path) -> None:
    same = grant(owner_grant().subject, ["steer", "queue"], threads="*")
    assert digest_of(tmp_path, STALL, same) != digest_of(tmp_path, STALL, "")
    assert digest_of(tmp_path, STALL, same + NO_OWNER_GRANT) != digest_of(tmp_path, STALL, "")


def test_file_grants_keep_the_digest_they_had_before_builtin_grants() -> None:
    """A ruleset's digest is on record in every ledger: an unchanged file must keep it."""
    grant = Grant(subject="owner:ann", actions=frozenset({"steer", "queue"}), threads=("t1",))
    assert build_ruleset((), (grant,)).digest == (
        "sha256:444d722a67180dd0f9406934eefd47f40aecc32c695c86cf869a84c6f6327543")
    assert default_ruleset().digest == "sha256:71a7bcfcfcbb4fe12f9065e1f37cb777c55742c1af6b0e0f8e98447853c31620"


def test_digest_is_the_same_in_another_process(tmp_path: Path) -> None:
    """Grant action sets are frozensets, whose order changes with the hash seed."""
    rules, config = write(tmp_path, "rules.toml", STALL), write(tmp_path, "config.toml", GRANTS)
    program = (
        "import sys; from pathlib import Path; from tillerman.rules.config import load_effective; "
        "print(load_effective(Path(sys.argv[1]), Path(sys.argv[2])).ruleset.digest)"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", program, str(rules), str(config)],
            capture_output=True, text=True, check=True, cwd=ROOT, env=os.environ | {"PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert digests == {load_effective(rules, config).ruleset.digest}


def test_a_rule_may_name_its_readback() -> None:
    (loaded,) = load_rules(
        rule("fix", owner="me", review_by="2027-01-01", condition={"kind": "repeated_failure", "count": 3},
             action="steer", text="Stop.", verify="test -f fixed.txt"), "rules.toml")
    assert loaded.verify == "test -f fixed.txt"
