"""Validating a parsed rule or config file, and the wording of its errors.

Every problem becomes one line naming the file, the line, the table, the field and a
fix, e.g.

    rules.toml:14: rule "stall" field condition.kind: unknown kind "turn_slow"; expected one of turn_quiet, …

The line comes from the source text (``tillerman.rules.toml_source.locate``), since
pydantic knows only the path of a value in the parsed data.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tillerman.rules.decision import Action
from tillerman.rules.errors import RuleSetError, show
from tillerman.rules.ruleset import CONDITION_KINDS
from tillerman.rules.schema import CONDITION_SPECS, TABLES, GrantSpec, NotifySpec, ReviewerSpec, RuleSpec, RulesFile
from tillerman.rules.toml_source import locate

M = TypeVar("M", bound=BaseModel)

#: Errors shown for one file: each is located in the source, and a file with thousands
#: of wrong entries needs its first ones fixed, not a screenful.
MAX_ERRORS = 20


def validate(model: type[M], data: dict[str, Any], text: str, source: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RuleSetError(validation_report(exc.errors(), lambda error: _describe(error, data, text, source),
                                             source)) from None


def validation_report(errors: list[Any], describe: Callable[[Any], tuple[int, str]], source: str) -> str:
    """The messages for the first ``MAX_ERRORS`` errors, in line order, and how many more."""
    problems = sorted(describe(error) for error in errors[:MAX_ERRORS])
    more = len(errors) - MAX_ERRORS
    tail = [f"{source}:{problems[-1][0]}: and {more} more problems; fix these first"] if more > 0 else []
    return "\n".join([message for _, message in problems] + tail)


# -- the wording of one error ---------------------------------------------------------------------------

#: What to write for a missing or malformed field.
EXAMPLES = {
    "id": 'id = "stall"',
    "version": "version = 1",
    "status": 'status = "active"',
    "owner": 'owner = "platform-team"',
    "review_by": "review_by = 2027-03-01",
    "expires": "expires = 2027-06-01",
    "threads": 'threads = "*"',
    "condition": 'condition = { kind = "turn_quiet", for = "10m" }',
    "kind": 'kind = "turn_quiet"',
    "for": 'for = "10m"',
    "count": "count = 3",
    "action": 'action = "report_overdue"',
    "ack_deadline": 'ack_deadline = "2m"',
    "subject": 'subject = "owner:NAME"',
    "actions": 'actions = ["steer"]',
    "owner_grant": "owner_grant = false",
    "review": 'review = "codex"',
    "name": 'name = "codex"',
    "command": 'command = ["codex", "exec", "--json", "-"]',
    "timeout": 'timeout = "60s"',
    "max_per_intent": "max_per_intent = 2",
    "max_per_thread_per_hour": "max_per_thread_per_hour = 6",
    "adapter": 'adapter = "codex-exec-json"',
    "probe_every": "probe_every = 20",
    "home": 'home = "/var/lib/tillerman/reviewer-home"',
    "budget_usd_per_day": "budget_usd_per_day = 2.0",
    "webhook": 'webhook = "http://127.0.0.1:9000/tillerman"',
    "group_window": 'group_window = "10s"',
    "repeat": 'repeat = "1h"',
    "kinds": 'kinds = ["overdue", "escalation", "report"]',
    "allow_remote": "allow_remote = true",
}
#: The noun for one value of a field, in "unknown action …".
SINGULAR = {"actions": "action", "kinds": "kind"}


def _describe(error: dict[str, Any], data: dict[str, Any], text: str, source: str) -> tuple[int, str]:
    """(line, message) for one pydantic error."""
    loc = _plain_loc(error["loc"])
    if error["type"].startswith("union_tag_"):
        loc = (*loc, "kind")
    line = locate(text, loc)
    if loc[0] in TABLES and len(loc) > 1:  # [defaults]: one table, no index
        fields = [part for part in loc[1:] if isinstance(part, str)]
    else:
        fields = [part for part in loc[2:] if isinstance(part, str)] if len(loc) > 1 else list(loc)
    field = f" field {'.'.join(fields)}" if fields else ""
    return line, f"{source}:{line}: {_owner_label(loc, data)}{field}: {_problem(error, loc, data)}"


def _plain_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The path as written in the file: without the union member pydantic inserts
    after ``condition`` (``condition.turn_quiet.for`` is ``condition.for``)."""
    if len(loc) >= 3 and loc[0] == "rule" and "condition" in loc:
        at = loc.index("condition")
        rest = loc[at + 1:]
        if rest and rest[0] in CONDITION_KINDS:
            rest = rest[1:]
        return (*loc[: at + 1], *rest)
    return loc


def _problem(error: dict[str, Any], loc: tuple[Any, ...], data: dict[str, Any]) -> str:
    kind, value, name = error["type"], error.get("input"), _last_name(loc)
    match kind:
        case "missing":
            return f"missing; add {EXAMPLES.get(name, name + ' = …')}"
        case "extra_forbidden":
            expected = ", ".join(_known_fields(loc[:-1], data))
            return f"unknown field; expected one of {expected}"
        case "union_tag_invalid":
            return f'unknown kind {show(error["ctx"]["tag"])}; expected one of {", ".join(CONDITION_KINDS)}'
        case "union_tag_not_found":
            return f"missing; add {EXAMPLES['kind']} (one of {', '.join(CONDITION_KINDS)})"
        case "model_attributes_type" | "dict_type" if name == "condition":
            return f"must be a table of a kind and its parameters, e.g. {EXAMPLES['condition']}"
        case "model_type" | "model_attributes_type" if len(loc) == 1 and name in TABLES:
            return f"must be a table, written [{name}] followed by its keys"
        case "model_type" if len(loc) == 2:
            return f"must be a table, written [[{loc[0]}]] followed by its keys"
        case "bool_type":
            return f"must be true or false (got {show(value)}); write it like {EXAMPLES.get(name, name + ' = false')}"
        case "list_type" if len(loc) == 1:
            return f"must be [[{name}]] tables"
        case "enum":
            return f"unknown action {show(value)}; expected one of {', '.join(Action)}"
        case "literal_error":
            expected = re.findall(r"'([^']*)'", error["ctx"]["expected"])
            return f"unknown {SINGULAR.get(name, name)} {show(value)}; expected one of {', '.join(expected)}"
        case "string_pattern_mismatch" if name == "subject":
            return f'invalid subject {show(value)}; write "owner:NAME", "rule:ID", "reviewer:NAME" or "*"'
        case "string_pattern_mismatch":
            return f'invalid {name} {show(value)}; use letters, digits, ".", "_" and "-", starting with a letter or digit'
        case "too_short":
            return f"must not be empty; write it like {EXAMPLES.get(name, name + ' = …')}"
        case "value_error":
            return str(error["ctx"]["error"])
    hint = f"; write it like {EXAMPLES[name]}" if name in EXAMPLES else ""
    return f"{error['msg'][0].lower()}{error['msg'][1:]} (got {show(value)}){hint}"


def _last_name(loc: tuple[Any, ...]) -> str:
    return next((part for part in reversed(loc) if isinstance(part, str)), "")


def _known_fields(parent: tuple[Any, ...], data: dict[str, Any]) -> list[str]:
    """The fields allowed in the table at ``parent`` (the file's names, aliases included)."""
    model: type[BaseModel]
    if not parent:  # only the rules file forbids unknown top-level keys
        return [*RulesFile.model_fields]
    if parent[-1] == "condition":
        model = CONDITION_SPECS[_dig(data, parent)["kind"]]
    elif parent[0] in TABLES:
        model = TABLES[parent[0]]
    else:
        model = {"rule": RuleSpec, "reviewer": ReviewerSpec, "notify": NotifySpec}.get(parent[0], GrantSpec)
    return [info.alias or name for name, info in model.model_fields.items()]


def _owner_label(loc: tuple[Any, ...], data: dict[str, Any]) -> str:
    """``rule "stall"``, ``grant "owner:ann"``, ``rule #2`` when it has no usable id,
    or ``top level``."""
    if loc[0] in TABLES and len(loc) > 1:
        return str(loc[0])
    if len(loc) < 2 or not isinstance(loc[1], int):
        return "top level"
    table = _dig(data, loc[:2])
    key = {"rule": "id", "reviewer": "name", "notify": "name"}.get(loc[0], "subject")
    name = table.get(key) if isinstance(table, dict) else None
    return f"{loc[0]} {show(name)}" if isinstance(name, str) else f"{loc[0]} #{loc[1] + 1}"


def _dig(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data
