"""Loading rule and config files (TOML) into rules and grants.

Each file goes through the same steps, each in its own module: read safely
(``tillerman.rules.file_safety``), parse with line-accurate syntax errors
(``tillerman.rules.toml_source``), validate against the schema
(``tillerman.rules.schema``), and word any error as one line per problem with the
file, line, field and fix (``tillerman.rules.validation``). Every problem raises
``RuleSetError``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from tillerman.rules.errors import RuleSetError
from tillerman.rules.ruleset import Grant, Rule, RuleSet, build_ruleset
from tillerman.rules.toml_source import locate, parse_toml

if TYPE_CHECKING:
    from tillerman.rules.schema import ConfigFile

#: ``rules/defaults.toml`` validated once: its rules, with the digest of the text they
#: came from. Loading them needs no schema (pydantic alone takes longer to import than
#: a small replay runs); ``python -m tillerman.rules.files`` writes it again.
COMPILED_DEFAULTS = "defaults.compiled.json"


class CompiledRules(msgspec.Struct, frozen=True):
    source: str  # sha256 of the rule file's bytes
    rules: tuple[Rule, ...]


def default_ruleset() -> RuleSet:
    """The built-in rules (``rules/defaults.toml``) with no grants at all, not even the
    owner's built-in one (``tillerman.rules.config.load_effective`` gives what a daemon runs)."""
    return build_ruleset(default_rules(), ())


def load_rules(text: str, source: str) -> tuple[Rule, ...]:
    """The ``[[rule]]`` tables of a rule file, validated, each id used once."""
    from tillerman.rules.schema import RulesFile  # pydantic: only for a rule file to validate
    from tillerman.rules.validation import validate

    data = parse_toml(text, source)
    specs = validate(RulesFile, data, text, source).rule
    _check_unique([spec.id for spec in specs], "rule", "id", text, source,
                  "give each rule its own id (raise version to change a rule)")
    return tuple(spec.to_rule() for spec in specs)


def load_config(text: str, source: str) -> ConfigFile:
    """The grants, ``[defaults]`` and ``[[reviewer]]`` tables of a config file, validated,
    each reviewer name used once."""
    from tillerman.rules.schema import ConfigFile
    from tillerman.rules.validation import validate

    config = validate(ConfigFile, parse_toml(text, source), text, source)
    _check_unique([spec.name for spec in config.reviewer], "reviewer", "name", text, source,
                  "give each [[reviewer]] its own name")
    _check_unique([spec.name for spec in config.notify], "notify", "name", text, source,
                  "give each [[notify]] its own name")
    return config


def load_grants(text: str, source: str) -> tuple[Grant, ...]:
    """The grants in force under a config file (``ConfigFile.grants``)."""
    return load_config(text, source).grants()


def default_rules() -> tuple[Rule, ...]:
    """The rules of ``rules/defaults.toml``, shipped with the package: from the compiled
    copy while it was compiled from this very text, else validated again."""
    text = _package_file("defaults.toml")
    compiled = msgspec.json.decode(_package_file(COMPILED_DEFAULTS), type=CompiledRules)
    if compiled.source == _text_digest(text):
        return compiled.rules
    return load_rules(text.decode("utf-8"), "rules/defaults.toml")


def compile_defaults() -> bytes:
    """The compiled copy of ``rules/defaults.toml`` (``COMPILED_DEFAULTS``), validated now."""
    text = _package_file("defaults.toml")
    rules = load_rules(text.decode("utf-8"), "rules/defaults.toml")
    return msgspec.json.format(msgspec.json.encode(CompiledRules(_text_digest(text), rules))) + b"\n"


#: This package's own folder (another distribution may install a top-level "rules"):
#: read directly, since ``importlib.resources`` alone imports ``zipfile`` and ``tempfile``.
PACKAGE_DIR = Path(__file__).resolve().parent


def _package_file(name: str) -> bytes:
    return (PACKAGE_DIR / name).read_bytes()


def _text_digest(text: bytes) -> str:
    return "sha256:" + hashlib.sha256(text).hexdigest()


def _check_unique(names: Sequence[str], table: str, key: str, text: str, source: str, fix: str) -> None:
    first: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in first:  # lines only for the error: locating every name is quadratic in the file
            line, earlier = locate(text, (table, index, key)), locate(text, (table, first[name], key))
            raise RuleSetError(
                f'{source}:{line}: {table} "{name}" field {key}: duplicate {key}, already used at line {earlier}; {fix}'
            )
        first[name] = index


if __name__ == "__main__":  # after editing rules/defaults.toml: write the compiled copy again
    (PACKAGE_DIR / COMPILED_DEFAULTS).write_bytes(compile_defaults())
