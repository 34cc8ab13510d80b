"""[patterns] in the config file: validation with line-accurate errors, the built-in
defaults, and the configured patterns applied at ingestion (replay)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.rule_texts import ANN_STEERS
from tillerman.controller.cli.main import main
from tillerman.ledger import events as ev
from tillerman.ledger.command_patterns import DEFAULT
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.config import load_effective
from tillerman.rules.errors import RuleSetError

ROOT = Path(__file__).resolve().parents[2]
HEALTHY = ROOT / "fixtures" / "disagreement" / "healthy"


def error(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(RuleSetError) as caught:
        load_effective(None, path)
    return str(caught.value).replace(str(path), "config.toml")


def test_defaults_without_a_patterns_table(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(ANN_STEERS)
    assert load_effective(None, path).patterns == DEFAULT
    assert load_effective(None, None).patterns == DEFAULT


def test_a_list_replaces_its_default_and_an_absent_one_keeps_it(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[patterns]\ncritical = ['\\bcargo\\s+build\\b']\n")
    patterns = load_effective(None, path).patterns
    assert patterns.critical == (r"\bcargo\s+build\b",) and patterns.external == DEFAULT.external
    assert patterns.classify("CARGO build --release") == (True, False)
    assert patterns.classify("fly deploy") == (False, True)


def test_errors_name_the_line_and_the_fix(tmp_path):
    text = "[client]\nname = 'x'\n\n[patterns]\ncritical = [\n  '\\bdeploy\\b',\n  '(unclosed',\n]\nexternal = 'git push'\nextra = []\n"
    # shape errors first: a bad entry in a list is looked at once the lists are lists
    assert error(tmp_path, text).splitlines() == [
        "config.toml:9: patterns field external: must be a list of regular expressions (got \"git push\"); "
        "write external = ['\\bdeploy\\b']",
        "config.toml:10: patterns field extra: unknown field; expected one of critical, external",
    ]
    only_regex = text.replace("external = 'git push'\nextra = []\n", "")
    assert error(tmp_path, only_regex) == (
        'config.toml:7: patterns field critical[1]: invalid regular expression "(unclosed" '
        "(missing ), unterminated subpattern at position 0); fix it, or escape literal characters with a backslash")
    assert error(tmp_path, "[patterns]\ncritical = ['ok', 3]\n") == (
        "config.toml:2: patterns field critical[1]: must be a string holding a regular expression (got 3)")
    assert error(tmp_path, "patterns = 'deploy'\n") == (
        "config.toml:1: top level field patterns: must be a table, written [patterns] followed by "
        "critical = [...] and external = [...]")
    assert error(tmp_path, "[patterns]\ncritical = ['  ']\n") == (
        "config.toml:2: patterns field critical[0]: empty pattern; write a regular expression, e.g. '\\bdeploy\\b'")


def test_configured_patterns_are_applied_at_ingestion(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[patterns]\ncritical = ['\\bcargo\\s+build\\b']\n")
    for args, critical in (([], False), (["--config", str(config)], True)):
        ledger = tmp_path / f"out-{critical}.sqlite3"
        result = CliRunner().invoke(main, ["replay", "--json", "--ledger", str(ledger), *args, str(HEALTHY)])
        assert result.exit_code == 0, result.output
        with SQLiteRecorder(ledger) as rec:
            (started,) = [e.envelope.event for e in rec.read() if isinstance(e.envelope.event, ev.ItemStarted)]
        assert started.critical is critical


def test_an_invalid_config_stops_replay_with_exit_2(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[patterns]\ncritical = ['(']\n")
    result = CliRunner().invoke(main, ["replay", "--config", str(config), str(HEALTHY)])
    assert result.exit_code == 2
    assert f"Error: {config}:2: patterns field critical[0]: invalid regular expression" in result.output
