"""The built-in rules load without the schema: from ``rules/defaults.compiled.json``
while it matches ``rules/defaults.toml``, and validated again when it does not."""

import importlib.resources

from tillerman.rules import files
from tillerman.rules.config import load_effective
from tillerman.rules.ruleset import build_ruleset
from tillerman.rules.schema import NO_CONFIG


def test_the_compiled_copy_is_what_defaults_toml_validates_to():
    # After editing rules/defaults.toml: python -m tillerman.rules.files
    compiled = (importlib.resources.files("tillerman.rules") / files.COMPILED_DEFAULTS).read_bytes()
    assert compiled == files.compile_defaults()


def test_default_rules_equal_the_validated_file():
    text = (importlib.resources.files("tillerman.rules") / "defaults.toml").read_text()
    assert files.default_rules() == files.load_rules(text, "rules/defaults.toml")


def test_an_edited_defaults_toml_is_validated_again_not_taken_from_the_stale_copy(monkeypatch):
    real = files._package_file

    def edited(name: str) -> bytes:
        text = real(name)
        return text.replace(b'for = "10m"', b'for = "20m"', 1) if name == "defaults.toml" else text

    monkeypatch.setattr(files, "_package_file", edited)
    stall = next(rule for rule in files.default_rules() if rule.id == "stall")
    assert stall.condition.for_seconds == 1200.0


def test_no_config_file_gives_what_the_schema_says_no_config_holds():
    effective = load_effective(None, None)
    assert effective.ruleset == build_ruleset(files.default_rules(), NO_CONFIG.grants())
    assert effective.reviewers == NO_CONFIG.reviewers() and effective.sinks == NO_CONFIG.sinks()
