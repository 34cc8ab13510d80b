"""Hostile content for the rule and config loaders: whatever a file holds, loading it
either gives a rule set or raises ``RuleSetError`` whose every line says file:line —
never another exception (a daemon's reload survives only the one it expects)."""

from __future__ import annotations

import datetime
import os
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tillerman.rules.config import load_effective, load_patterns
from tillerman.rules.errors import RuleSetError
from tillerman.rules.file_safety import MAX_FILE_BYTES
from tillerman.rules.files import load_config, load_rules
from tillerman.rules.lifecycle import rule_toml
from tillerman.rules.ruleset import build_ruleset

VALID_RULE = {
    "id": "stall", "version": 1, "status": "active", "owner": "platform-team",
    "review_by": datetime.date(2027, 3, 1), "condition": {"kind": "turn_quiet", "for": "10m"},
    "action": "steer", "text": "Turn {turn_id} is quiet", "ack_deadline": "2m", "verify": "true",
}
VALID_GRANT = {"subject": "owner:ann", "actions": ["steer"], "threads": "*"}
KEYS = [*VALID_RULE, *VALID_GRANT, "kind", "for", "count", "within", "expires", "critical", "external",
        "owner_grant", "rule", "grant", "patterns", "defaults", "x", "measure", "over", "per"]
WORDS = ["turn_quiet", "repeated_failure", "approval_waiting", "critical_tool_running", "intent_overdue",
         "goal_budget_limited", "budget", "tokens", "cost_usd", "context", "owner", "day",
         "turn_long", "active", "shadow", "proposed", "steer", "queue", "interrupt", "report_overdue", "*",
         "owner:ann", "rule:stall", "10m", "0s", "365d", "366d", "{turn_id}", "{", "}", "\\bdeploy\\b", "(", "a{99999999999}"]

class Digits(int):
    """A number written with this many digits (more than Python converts, at will)."""


huge_numbers = st.integers(1, 6000).map(Digits)
durations = st.from_regex(r"[0-9]{1,40}[smhdx]", fullmatch=True) | st.integers(1, 5000).map(lambda n: "9" * n + "s")
huge_strings = st.builds(lambda char, count: char * count, st.characters(), st.integers(0, 100_000))
deep_groups = st.integers(1, 20_000).map(lambda depth: "(" * depth + ")" * depth)
scalars = st.one_of(
    st.booleans(), st.integers(), huge_numbers, st.floats(), st.text(max_size=30), st.sampled_from(WORDS),
    durations, huge_strings, deep_groups, st.dates(), st.datetimes(), st.times(),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner,
                                                                                             max_size=4), max_leaves=12)


def damaged(base: dict) -> st.SearchStrategy[dict]:
    """``base`` with some keys set to anything and some removed."""
    return st.builds(lambda changes, removed: {k: v for k, v in {**base, **changes}.items() if k not in removed},
                     st.dictionaries(st.sampled_from(KEYS), values, max_size=3),
                     st.sets(st.sampled_from(list(base)), max_size=2))


documents = st.fixed_dictionaries({}, optional={
    "rule": st.lists(damaged(VALID_RULE), max_size=3) | values,
    "grant": st.lists(damaged(VALID_GRANT), max_size=3) | values,
    "patterns": damaged({"critical": ["\\bdeploy\\b"], "external": ["\\bcurl\\b"]}) | values,
    "defaults": damaged({"owner_grant": False}) | values,
    "x": values,
})


def toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    return '"' + "".join(f"\\u{ord(c):04x}" if c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F else c
                         for c in text) + '"'


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(value), repr(value))
    if isinstance(value, Digits):
        return "9" * value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(document: dict) -> str:
    """Arrays of tables as ``[[name]]`` sections and tables as ``[name]``, so that
    locating lines is exercised the way real files do."""
    head, sections = [], []
    for key, value in document.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for item in value:
                sections.append(f"[[{key}]]\n" + "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in item.items()))
        elif isinstance(value, dict):
            sections.append(f"[{key}]\n" + "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in value.items()))
        else:
            head.append(f"{key} = {toml_value(value)}\n")
    return "".join(head) + "\n".join(sections)


nesting = st.builds(
    lambda arrays, depth: "x = " + ("[" * depth + "]" * depth if arrays else "{a = " * depth + "1" + "}" * depth) + "\n",
    st.booleans(), st.integers(1, 100_000))
texts = st.one_of(documents.map(toml_document), nesting, st.text(max_size=300),
                  st.sampled_from(["[[rule]]\n", "[patterns]\n", "rule = 1\n", "\x00", "a = \"\x00\"\n", "[[rule]]\nid = \"a\"\n" * 3]))


def assert_line_accurate(error: RuleSetError, source: str) -> None:
    lines = str(error).splitlines()
    assert lines, "an empty error message"
    for line in lines:
        assert re.match(rf"{re.escape(source)}:\d+: \S", line), line[:300]
        assert len(line) < 2000, line[:300]


def load_all(text: str) -> None:
    try:
        rules = load_rules(text, "rules.toml")
    except RuleSetError as exc:
        assert_line_accurate(exc, "rules.toml")
    else:
        build_ruleset(rules, ())  # the digest: every value the file gave must encode
        for rule in rules:  # a promotion writes a loaded rule back: it must read back the same
            assert load_rules(rule_toml(rule), "again.toml") == (rule,)
    try:
        config, patterns = load_config(text, "config.toml"), load_patterns(text, "config.toml")
    except RuleSetError as exc:
        assert_line_accurate(exc, "config.toml")
    else:
        build_ruleset((), config.grants())
        patterns.classify("git push --force")


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(texts)
def test_hostile_text_loads_or_is_a_line_accurate_error(text: str) -> None:
    load_all(text)


@FUZZ
@given(st.one_of(texts.map(lambda text: text.encode("utf-8", "surrogatepass")), st.binary(max_size=300),
                 st.builds(lambda good, junk, at: good[:at] + junk + good[at:],
                           documents.map(lambda d: toml_document(d).encode("utf-8", "surrogatepass")),
                           st.binary(min_size=1, max_size=8), st.integers(0, 400))))
def test_hostile_bytes_in_a_file_load_or_are_a_line_accurate_error(data: bytes) -> None:
    """Through the file reader: invalid UTF-8, NUL bytes, anything."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "rules.toml"
        path.write_bytes(data)
        os.chmod(path, 0o600)
        for rules_path, config_path in ((path, None), (None, path)):
            try:
                load_effective(rules_path, config_path)
            except RuleSetError as exc:
                if len(data) > MAX_FILE_BYTES:  # refused before it is read as text
                    assert str(exc) == f"{path}: larger than 1 MiB, the most a rule or config file may hold; check the path given"
                else:
                    assert_line_accurate(exc, str(path))


@FUZZ
@given(st.text(), st.text(min_size=1))
@example("rm -rf \x7f\x00\x1b[2J", "ann\x7f")  # DEL: TOML wants it escaped, JSON does not
def test_any_loaded_text_is_written_back_by_a_promotion_as_it_was(text: str, owner: str) -> None:
    """``rule_toml`` (a proposal in the ledger, a promotion into the rule file) keeps
    every character a file could give, control characters and DEL included."""
    rule = dict(VALID_RULE, text=text.replace("{", "{{").replace("}", "}}"), owner=owner)
    (loaded,) = load_rules(toml_document({"rule": [rule]}), "rules.toml")
    assert load_rules(rule_toml(loaded), "again.toml") == (loaded,)
