"""The configuration file beyond grants: critical and external command patterns.

    [patterns]
    critical = ['\\bdeploy\\b', '\\bgit\\s+push\\b']   # replaces the built-in list
    external = ['\\bgit\\s+push\\b', '\\bcurl\\b.*-X\\s*POST\\b']

Each entry is a regular expression, searched case-insensitively anywhere in a command
line (``tillerman.ledger.command_patterns``). A list given replaces the built-in one (see
``tillerman.ledger.command_patterns.DEFAULT``, printed by ``tillerman rules show``); a list left out
keeps it; an empty list classifies nothing as critical (or external). Every entry
must compile; an unknown key under ``[patterns]`` is an error, with the file, line
and a fix, like every other rule-file error.

Stall and wait thresholds live in the rule file (``condition = { kind = "turn_quiet",
for = "10m" }``): one place for a threshold, not two that can disagree.

The file itself is ``--config`` when given, else ``$XDG_CONFIG_HOME/tillerman/
config.toml`` (``~/.config/tillerman/config.toml``) when that exists (``config_file``).
With no file at all the local owner may steer and queue (``tillerman.rules.owner``), nothing
else is granted, and the patterns are the built-in ones.

``load_effective`` is what the daemon, replay and ``tillerman rules …`` use: the rule
set (rules and grants) plus the patterns, with both digests.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from tillerman.ledger.command_patterns import DEFAULT as DEFAULT_PATTERNS
from tillerman.ledger.command_patterns import CommandPatterns
from tillerman.rules.errors import RuleSetError, show
from tillerman.rules.file_safety import read_file
from tillerman.rules.files import default_rules, load_config, load_rules
from tillerman.rules.notify import NotifySink
from tillerman.rules.owner import owner_grant
from tillerman.rules.prices import PriceFileError, PriceOverride
from tillerman.rules.review import Reviewer
from tillerman.rules.toml_source import locate, parse_toml
from tillerman.rules.ruleset import Rule, RuleSet, build_ruleset, prices_for

PATTERN_KEYS = ("critical", "external")


class Effective(msgspec.Struct, frozen=True, kw_only=True):
    """What a daemon or a replay runs with."""

    ruleset: RuleSet
    patterns: CommandPatterns
    patterns_digest: str
    reviewers: tuple[Reviewer, ...] = ()
    sinks: tuple[NotifySink, ...] = ()  # [[notify]]: read at start, not reloaded
    usage_report: bool = True  # [defaults] usage_report: the built-in usage notices, read at start
    dashboard_url: str | None = None  # [dashboard] url: notices link to a thread's page there

    def reviewer(self, name: str) -> Reviewer | None:
        return next((r for r in self.reviewers if r.name == name), None)


def patterns_digest(patterns: CommandPatterns) -> str:
    body = msgspec.json.encode({"critical": list(patterns.critical), "external": list(patterns.external)})
    return "sha256:" + hashlib.sha256(body).hexdigest()


def load_patterns(text: str, source: str) -> CommandPatterns:
    """The ``[patterns]`` table of a config file (absent: the built-in patterns)."""
    from pydantic import ValidationError  # the schema's imports only for a config file to validate

    from tillerman.rules.schema import PatternsSpec
    from tillerman.rules.validation import validation_report

    data = parse_toml(text, source)
    table = data.get("patterns")
    if table is None:
        return DEFAULT_PATTERNS
    if not isinstance(table, dict):
        line = locate(text, ("patterns",))
        raise RuleSetError(f"{source}:{line}: top level field patterns: must be a table, written [patterns] "
                           "followed by critical = [...] and external = [...]")
    try:
        spec = PatternsSpec.model_validate(table)
    except ValidationError as exc:
        raise RuleSetError(validation_report(exc.errors(), lambda error: _describe(error, table, text, source),
                                             source)) from None
    wrong = [(key, index, pattern, problem) for key in PATTERN_KEYS
             for index, pattern in enumerate(getattr(spec, key) or ())
             if (problem := _pattern_problem(pattern)) is not None]
    if wrong:
        raise RuleSetError(validation_report(wrong, lambda item: _pattern_error(item, text, source), source))
    patterns = CommandPatterns(
        critical=tuple(spec.critical) if spec.critical is not None else DEFAULT_PATTERNS.critical,
        external=tuple(spec.external) if spec.external is not None else DEFAULT_PATTERNS.external,
    )
    try:
        patterns.classify("")  # compiles each list as one expression, as the daemon will
    except (re.error, RecursionError, OverflowError):
        line = locate(text, ("patterns",))
        raise RuleSetError(f"{source}:{line}: patterns: the expressions are too many or too complex to combine;"
                           " shorten the lists") from None
    return patterns


#: The tables only a config file holds (``check_file`` tells the two kinds apart by them).
CONFIG_TABLES = ("grant", "patterns", "defaults", "reviewer", "notify", "prices", "dashboard")


def check_file(text: str, source: str) -> dict[str, Any]:
    """What ``tillerman rules validate`` reports of a valid file: its kind and what it
    holds. A file with ``[[rule]]`` tables, or with none of ``[[grant]]``, ``[patterns]``,
    ``[defaults]``, ``[[reviewer]]``, ``[[notify]]`` and ``[prices."MODEL"]``, is a rule
    file; anything else a config file. Raises ``RuleSetError`` for an invalid one."""
    data = parse_toml(text, source)
    if "rule" not in data and any(table in data for table in CONFIG_TABLES):
        config, patterns = load_config(text, source), load_patterns(text, source)
        return {"kind": "config", "grants": len(config.grant), "owner_grant": config.defaults.owner_grant,
                "reviewers": len(config.reviewer), "notify": len(config.notify),
                "prices": len(_price_overrides(text, source)),
                "patterns": {"critical": len(patterns.critical), "external": len(patterns.external)}}
    found = load_rules(text, source)
    statuses = {s: sum(1 for r in found if r.status == s) for s in sorted({r.status for r in found})}
    return {"kind": "rules", "rules": len(found), "statuses": statuses, "digest": build_ruleset(found, ()).digest}


def default_config_path() -> Path:
    """Where the config file is looked for when ``--config`` is not given."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "tillerman" / "config.toml"


def config_file(given: str | Path | None) -> Path | None:
    """The config file to read: the one given (``--config``; reading it says so if it
    is missing), else the default one if it exists, else None (no file)."""
    if given:
        return Path(given)
    default = default_config_path()
    return default if default.exists() else None


def load_effective(rules_path: Path | None, config_path: Path | None, *,
                   on_unsafe: Callable[[str], None] | None = None) -> Effective:
    """Rules (None: the built-in defaults), grants and patterns (None: no file, so
    only the owner's built-in grant and the built-in patterns; see ``config_file``).
    Raises ``RuleSetError`` naming the file, line and fix. A file someone else could
    have written is refused, or with ``on_unsafe`` reported to it (``read_file``)."""
    rules_text = read_file(rules_path, on_unsafe=on_unsafe) if rules_path is not None else None
    rules = load_rules(rules_text, str(rules_path)) if rules_text is not None else default_rules()
    overrides: dict[str, PriceOverride] = {}
    usage_report, dashboard_url = True, None
    if config_path is not None:
        text = read_file(config_path, on_unsafe=on_unsafe)
        config = load_config(text, str(config_path))
        patterns = load_patterns(text, str(config_path))
        overrides = _price_overrides(text, str(config_path))
        grants, reviewers, sinks = config.grants(), config.reviewers(), config.sinks()
        usage_report, dashboard_url = config.defaults.usage_report, config.dashboard.url
    else:  # what ``tillerman.rules.schema.NO_CONFIG`` holds, without importing the schema
        grants, reviewers, sinks, patterns = (owner_grant(),), (), (), DEFAULT_PATTERNS
    check_review_names(rules, rules_text or "", str(rules_path or "rules/defaults.toml"),
                       {r.name for r in reviewers}, config_path)
    try:
        prices = prices_for(rules, overrides)
    except PriceFileError as exc:  # a spoiled imported table, an override of a model it cannot price
        raise RuleSetError(str(exc)) from None
    return Effective(ruleset=build_ruleset(rules, grants, prices, overrides), patterns=patterns,
                     patterns_digest=patterns_digest(patterns), reviewers=reviewers, sinks=sinks,
                     usage_report=usage_report, dashboard_url=dashboard_url)


def check_review_names(rules: Sequence[Rule], text: str, source: str, names: set[str],
                       config_path: Path | None) -> None:
    """Refuse a rule whose ``review = "NAME"`` names no ``[[reviewer]]`` of the config file."""
    for index, rule in enumerate(rules):
        if rule.review is not None and rule.review not in names:
            line = locate(text, ("rule", index, "review"))
            where = f"the config file {config_path}" if config_path is not None else "a config file (there is none)"
            known = f" (defined: {', '.join(sorted(names))})" if names else ""
            raise RuleSetError(f'{source}:{line}: rule "{rule.id}" field review: unknown reviewer {show(rule.review)}'
                               f"{known}; add a [[reviewer]] named so to {where}, or remove the key")


def _pattern_problem(pattern: str) -> str | None:
    if not pattern.strip():
        return "empty pattern; write a regular expression, e.g. '\\bdeploy\\b'"
    try:
        re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        return (f"invalid regular expression {show(pattern)} ({exc.msg} at position {exc.pos}); "
                "fix it, or escape literal characters with a backslash")
    except OverflowError as exc:  # a repetition count beyond what re allows
        return f"invalid regular expression {show(pattern)} ({exc}); use a smaller count"
    except RecursionError:
        return f"invalid regular expression {show(pattern)} (groups nested too deeply); nest fewer groups"
    return None


def _pattern_error(item: tuple[str, int, str, str], text: str, source: str) -> tuple[int, str]:
    key, index, pattern, problem = item
    line = _item_line(text, key, pattern)
    return line, f"{source}:{line}: patterns field {key}[{index}]: {problem}"


def _item_line(text: str, key: str, pattern: str) -> int:
    """The line of one list entry: the first line from the key on that holds it as
    written (a literal '…' string, or a basic "…" one), else the key's line."""
    start = locate(text, ("patterns", key))
    lines = text.splitlines()
    forms = (f"'{pattern}'", '"' + pattern.replace("\\", "\\\\").replace('"', '\\"') + '"')
    for number in range(start - 1, len(lines)):
        if any(form in lines[number] for form in forms):
            return number + 1
    return start


def _describe(error: dict[str, Any], table: dict[str, Any], text: str, source: str) -> tuple[int, str]:
    loc = error["loc"]
    key = loc[0] if loc else "patterns"
    line = locate(text, ("patterns", key))
    where = f"{key}[{loc[1]}]" if len(loc) > 1 else str(key)
    value = error.get("input")
    match error["type"]:
        case "extra_forbidden":
            problem = f"unknown field; expected one of {', '.join(PATTERN_KEYS)}"
        case "list_type":
            problem = f"must be a list of regular expressions (got {show(value)}); write {key} = ['\\bdeploy\\b']"
        case "string_type":
            problem = f"must be a string holding a regular expression (got {show(value)})"
        case _:
            problem = f"{error['msg'][0].lower()}{error['msg'][1:]} (got {show(value)})"
    return line, f"{source}:{line}: patterns field {where}: {problem}"


def _price_overrides(text: str, source: str) -> dict[str, PriceOverride]:
    """The config's ``[prices."MODEL"]`` tables. Imported here, not at the top: their
    schema is pydantic, which a replay with no config file never needs to import."""
    from tillerman.rules.price_config import load_price_overrides

    return load_price_overrides(text, source)
