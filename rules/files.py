"""Human-edited rule and config files (TOML) → a frozen ``RuleSet``.

pydantic validates the files (``extra="forbid"``: a typo is an error, not a silently
ignored key); the result becomes ``tillerman.rules.ruleset`` structs, so nothing downstream sees
a pydantic object. Every problem raises ``RuleSetError`` with one line per error:

    rules.toml:14: rule "stall" field condition.kind: unknown kind "turn_slow"; expected one of turn_quiet, …

tomllib reports positions only for syntax errors, so for a file that parses but does
not validate the line is found in the source text: the Nth ``[[rule]]`` header, then
the key inside that table (inline, dotted, or in a ``[rule.condition]`` sub-table).
"""

from __future__ import annotations

import datetime
import importlib.resources
import json
import os
import pwd
import re
import stat
import string
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from tillerman.rules.decision import Action
from tillerman.rules.detect import TEMPLATE_FIELDS
from tillerman.rules.owner import owner_grant
from tillerman.rules.ruleset import (
    ANY,
    CONDITION_KINDS,
    ApprovalWaiting,
    Condition,
    CriticalToolRunning,
    Grant,
    GrantableAction,
    IntentOverdue,
    RepeatedFailure,
    Rule,
    RuleSet,
    RuleStatus,
    TurnLong,
    TurnQuiet,
    build_ruleset,
)

M = TypeVar("M", bound=BaseModel)


class RuleSetError(Exception):
    """A rule or config file that cannot be used; the message says where and how to fix it.

    A reload that raises this keeps the last good rule set.
    """


# -- durations: 90s, 5m, 2h, 1d ---------------------------------------------------------

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"([1-9][0-9]*)([smhd])")
#: The longest duration a rule may give. A wait or deadline beyond a year is a typo, and
#: an unbounded one would overflow the clock arithmetic it feeds.
MAX_DURATION_DAYS = 365


def parse_duration(value: object) -> float:
    """Seconds in ``"90s"``, ``"5m"``, ``"2h"`` or ``"1d"``, at most ``MAX_DURATION_DAYS``.
    A bare number is refused: seconds or minutes would be a guess."""
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"invalid duration {_show(value)}; write a whole number and a unit: 90s, 5m, 2h or 1d")
    limit = MAX_DURATION_DAYS * DURATION_UNITS["d"]
    # the length first: int() of thousands of digits is refused (or slow) before any comparison
    if len(match[1]) > len(str(limit)) or int(match[1]) * DURATION_UNITS[match[2]] > limit:
        raise ValueError(f"duration {_show(value)} is too long; at most {MAX_DURATION_DAYS}d")
    return float(int(match[1]) * DURATION_UNITS[match[2]])


Duration = Annotated[float, BeforeValidator(parse_duration)]


def parse_threads(value: object) -> str | tuple[str, ...]:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise ValueError(f'invalid threads {_show(value)}; write "*", one thread id, or a list of thread ids')


Threads = Annotated[str | tuple[str, ...], BeforeValidator(parse_threads)]


# -- the file schemas ---------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ConditionSpec(_Spec):
    struct: ClassVar[type[Condition]]

    def to_condition(self) -> Condition:
        return self.struct(**self.model_dump(exclude={"kind"}))


class TurnQuietSpec(_ConditionSpec):
    struct = TurnQuiet
    kind: Literal["turn_quiet"]
    for_seconds: Duration = Field(alias="for")


class RepeatedFailureSpec(_ConditionSpec):
    struct = RepeatedFailure
    kind: Literal["repeated_failure"]
    count: int = Field(ge=2, strict=True)
    within: Literal["turn"] = "turn"


class ApprovalWaitingSpec(_ConditionSpec):
    struct = ApprovalWaiting
    kind: Literal["approval_waiting"]
    for_seconds: Duration = Field(alias="for")


class CriticalToolRunningSpec(_ConditionSpec):
    struct = CriticalToolRunning
    kind: Literal["critical_tool_running"]
    for_seconds: Duration = Field(alias="for")


class IntentOverdueSpec(_ConditionSpec):
    struct = IntentOverdue
    kind: Literal["intent_overdue"]


class TurnLongSpec(_ConditionSpec):
    struct = TurnLong
    kind: Literal["turn_long"]
    for_seconds: Duration = Field(alias="for")


CONDITION_SPECS: dict[str, type[_ConditionSpec]] = {
    spec.struct.__struct_config__.tag: spec
    for spec in (TurnQuietSpec, RepeatedFailureSpec, ApprovalWaitingSpec, CriticalToolRunningSpec, IntentOverdueSpec, TurnLongSpec)
}
ConditionSpec = Annotated[
    TurnQuietSpec | RepeatedFailureSpec | ApprovalWaitingSpec | CriticalToolRunningSpec | IntentOverdueSpec | TurnLongSpec,
    Field(discriminator="kind"),
]

#: Ids become grant subjects ("rule:ID") and dedup keys: no spaces, no colons.
ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
SUBJECT_PATTERN = r"\*|(owner|rule|reviewer):\S+"
#: Actions that send text to the agent need a text to send.
TEXT_ACTIONS = frozenset({Action.STEER, Action.QUEUE})


class RuleSpec(_Spec):
    id: str = Field(pattern=f"^{ID_PATTERN}$")
    version: int = Field(ge=1, strict=True)
    status: RuleStatus
    owner: str = Field(min_length=1)
    review_by: datetime.date
    expires: datetime.date | None = None
    threads: Threads = ANY
    condition: ConditionSpec
    action: Action
    # after condition and action: its validator reads them
    text: str | None = Field(default=None, validate_default=True)
    ack_deadline: Duration | None = None
    verify: str | None = Field(default=None, min_length=1)

    @field_validator("text")
    @classmethod
    def _text_fits_action_and_condition(cls, text: str | None, info: ValidationInfo) -> str | None:
        action, condition = info.data.get("action"), info.data.get("condition")
        if text is None:
            if action in TEXT_ACTIONS:
                raise ValueError(f"missing; a {action} rule needs the text to send, e.g. text = \"Stop …; read … first.\"")
            return None
        if condition is not None:
            _check_placeholders(text, condition.kind)
        return text

    def to_rule(self) -> Rule:
        return Rule(**self.model_dump(exclude={"condition"}), condition=self.condition.to_condition())


class GrantSpec(_Spec):
    subject: str = Field(pattern=f"^({SUBJECT_PATTERN})$")
    actions: list[GrantableAction] = Field(min_length=1)
    threads: Threads = ANY

    def to_grant(self) -> Grant:
        return Grant(subject=self.subject, actions=frozenset(self.actions), threads=self.threads)


class RulesFile(_Spec):
    rule: list[RuleSpec] = []


class DefaultsSpec(_Spec):
    """``[defaults]``: what holds without a grant written down."""

    # strict: "false" (a string) is not false; authority is not guessed from a typo
    owner_grant: bool = Field(default=True, strict=True)


class ConfigFile(BaseModel):
    # The config file also holds command patterns and client settings, which their
    # own loaders validate; the [[grant]] tables and [defaults] are ours.
    model_config = ConfigDict(extra="ignore", frozen=True)
    grant: list[GrantSpec] = []
    defaults: DefaultsSpec = DefaultsSpec()

    def grants(self) -> tuple[Grant, ...]:
        """The grants in force: the local owner's built-in one (unless ``[defaults]
        owner_grant = false``), then the file's ``[[grant]]`` tables."""
        builtin = (owner_grant(),) if self.defaults.owner_grant else ()
        return builtin + tuple(spec.to_grant() for spec in self.grant)


#: No config file at all: the built-in owner grant and nothing else.
NO_CONFIG = ConfigFile()
#: The config file's plain tables (``[name]``, not ``[[name]]``) validated here.
TABLES: dict[str, type[BaseModel]] = {"defaults": DefaultsSpec}


def _check_placeholders(text: str, kind: str) -> None:
    available = TEMPLATE_FIELDS[kind]
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"invalid template ({exc}); write literal braces as {{{{ and }}}}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in available:
            names = ", ".join(f"{{{n}}}" for n in available)
            raise ValueError(f"unknown placeholder {_show('{' + name + '}')} for kind {kind}; available: {names}")
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}}} takes no format spec or conversion; write {{{name}}}")


# -- loading -----------------------------------------------------------------------------


def default_ruleset() -> RuleSet:
    """The built-in rules (``rules/defaults.toml``) with no grants at all, not even the
    owner's built-in one (``tillerman.rules.config.load_effective`` gives what a daemon runs)."""
    return build_ruleset(_default_rules(), ())


def load_rules(text: str, source: str) -> tuple[Rule, ...]:
    data = _parse_toml(text, source)
    specs = _validate(RulesFile, data, text, source).rule
    _check_unique_ids(specs, text, source)
    return tuple(spec.to_rule() for spec in specs)


def load_config(text: str, source: str) -> ConfigFile:
    """The grants and ``[defaults]`` of a config file, validated."""
    return _validate(ConfigFile, _parse_toml(text, source), text, source)


def load_grants(text: str, source: str) -> tuple[Grant, ...]:
    """The grants in force under a config file (``ConfigFile.grants``)."""
    return load_config(text, source).grants()


def _default_rules() -> tuple[Rule, ...]:
    # This package's own file: another distribution may install a top-level "rules".
    resource = importlib.resources.files(__package__) / "defaults.toml"
    return load_rules(resource.read_text(encoding="utf-8"), "rules/defaults.toml")


#: The most a rule or config file may hold. Real ones are a few KiB; the limit keeps a
#: path that leads somewhere huge from filling memory while it is read.
MAX_FILE_BYTES = 1 << 20
#: What a path may lead to besides a regular file, by ``stat.S_IFMT``.
_NOT_A_FILE = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def read_file(path: Path, *, on_unsafe: Callable[[str], None] | None = None) -> str:
    """The text of a rule or config file.

    Only a regular file of at most ``MAX_FILE_BYTES`` is read: the path is opened
    without blocking (a FIFO with no writer would wait forever) and checked on the
    open descriptor, so a symlink to ``/dev/zero`` or a FIFO is refused at once.

    A rule's ``verify`` and the config's commands run as this user, so a file that
    someone else could have written is as good as their command (``unsafe_problem``):
    with ``on_unsafe`` None it is refused, as ``tillerman run`` and its reloads do;
    otherwise ``on_unsafe`` gets the same one-line message and the file is read anyway.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise RuleSetError(f"{path}: cannot read it ({exc.strerror}); check the path given") from None
    try:
        st = os.fstat(fd)
        kind = _NOT_A_FILE.get(stat.S_IFMT(st.st_mode))
        if kind is not None:
            raise RuleSetError(f"{path}: {kind}, not a regular file; give the path of a rule or config file")
        problem = unsafe_problem(path, st)
        if problem is not None:
            if on_unsafe is None:
                raise RuleSetError(problem)
            on_unsafe(problem)
        data = _read_at_most(fd, MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise RuleSetError(f"{path}: cannot read it ({exc.strerror}); check the path given") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise RuleSetError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, the most a rule or config file may hold;"
                           " check the path given")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise RuleSetError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(limit - size, 1 << 16))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def unsafe_problem(path: Path, st: os.stat_result) -> str | None:
    """Why someone other than this user or root could have written the file ``st``
    describes, or None. As ssh does for its config: the file must be owned by the
    effective user or root and writable by no group or other. The directories holding
    it (as named, and after symlinks) are held to the same, since whoever can write a
    directory can replace the file in it; a sticky directory such as /tmp is fine, as
    only a file's owner may replace it there. Directories further up are not checked.
    """
    problem = _foreign_writer(st, path, sticky_ok=False)
    if problem is not None:
        return f"{path}: {problem}"
    named = Path(os.path.abspath(path)).parent
    for directory in dict.fromkeys((named, Path(os.path.realpath(path)).parent)):
        try:
            problem = _foreign_writer(os.stat(directory), directory, sticky_ok=True)
        except OSError:
            continue  # not ours to look at (no search permission): the file alone is judged
        if problem is not None:
            return f"{path}: its directory {directory} is {problem}"
    return None


_CONSEQUENCE = "tillerman run refuses it, since its commands would run as you"


def _foreign_writer(st: os.stat_result, path: Path, *, sticky_ok: bool) -> str | None:
    """What lets another user write ``path`` (described by ``st``), and the fix."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return f"owned by {_user(st.st_uid)}, not by you ({_user(me)}) or root: {_CONSEQUENCE}; fix: chown {_user(me)} {path}"
    writers = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return (f"writable by {' and '.join(writers)} (mode {stat.S_IMODE(st.st_mode):04o}): {_CONSEQUENCE};"
                f" fix: chmod go-w {path}")
    return None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


_TOML_POSITION = re.compile(r"(?P<what>.*) \(at line (?P<line>\d+), column (?P<column>\d+)\)")


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except RecursionError:
        line = _deepest_line(text)
        raise RuleSetError(f"{source}:{line}: invalid TOML: arrays or tables nested too deeply; "
                           "rule and config files need a few levels at most") from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        where = _TOML_POSITION.fullmatch(message)
        if where is None:  # "(at end of document)"
            line, what = text.count("\n") + 1, message.replace(" (at end of document)", " at the end")
        else:
            line, what = int(where["line"]), f"{where['what']} at column {where['column']}"
        hint = 'strings need quotes, e.g. status = "active"' if what.startswith("Invalid value") else "fix the syntax there"
        raise RuleSetError(f"{source}:{line}: invalid TOML: {what}; {hint}") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        digits = re.search(r"[0-9_]{%d,}" % (sys.get_int_max_str_digits() + 1), text)
        line = text.count("\n", 0, digits.start()) + 1 if digits else 1
        raise RuleSetError(f"{source}:{line}: invalid TOML: a number of more than {sys.get_int_max_str_digits()} digits;"
                           " write a smaller one") from None


def _deepest_line(text: str) -> int:
    """The line where brackets first nest deepest: where a too-deep nesting is. Brackets
    in strings and comments count too: a guess, for an error message."""
    depth, deepest, line, at = 0, 0, 1, 1
    for char in text:
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest, at = depth, line
        elif char in "]}":
            depth -= 1
        elif char == "\n":
            line += 1
    return at


def _check_unique_ids(specs: Sequence[RuleSpec], text: str, source: str) -> None:
    first: dict[str, int] = {}
    for index, spec in enumerate(specs):
        if spec.id in first:  # lines only for the error: locating every id is quadratic in the file
            line, earlier = _locate(text, ("rule", index, "id")), _locate(text, ("rule", first[spec.id], "id"))
            raise RuleSetError(
                f'{source}:{line}: rule "{spec.id}" field id: duplicate id, already used at line '
                f"{earlier}; give each rule its own id (raise version to change a rule)"
            )
        first[spec.id] = index


#: Errors shown for one file: each is located in the source, and a file with thousands
#: of wrong entries needs its first ones fixed, not a screenful.
MAX_ERRORS = 20


def _validate(model: type[M], data: dict[str, Any], text: str, source: str) -> M:
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


# -- error messages ---------------------------------------------------------------------------

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
}
#: The noun for one value of a field, in "unknown action …".
SINGULAR = {"actions": "action"}


def _describe(error: dict[str, Any], data: dict[str, Any], text: str, source: str) -> tuple[int, str]:
    """(line, message) for one pydantic error."""
    loc = _plain_loc(error["loc"])
    if error["type"].startswith("union_tag_"):
        loc = (*loc, "kind")
    line = _locate(text, loc)
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
            return f'unknown kind {_show(error["ctx"]["tag"])}; expected one of {", ".join(CONDITION_KINDS)}'
        case "union_tag_not_found":
            return f"missing; add {EXAMPLES['kind']} (one of {', '.join(CONDITION_KINDS)})"
        case "model_attributes_type" | "dict_type" if name == "condition":
            return f"must be a table of a kind and its parameters, e.g. {EXAMPLES['condition']}"
        case "model_type" | "model_attributes_type" if len(loc) == 1 and name in TABLES:
            return f"must be a table, written [{name}] followed by its keys"
        case "model_type" if len(loc) == 2:
            return f"must be a table, written [[{loc[0]}]] followed by its keys"
        case "bool_type":
            return f"must be true or false (got {_show(value)}); write it like {EXAMPLES.get(name, name + ' = false')}"
        case "list_type" if len(loc) == 1:
            return f"must be [[{name}]] tables"
        case "enum":
            return f"unknown action {_show(value)}; expected one of {', '.join(Action)}"
        case "literal_error":
            expected = re.findall(r"'([^']*)'", error["ctx"]["expected"])
            return f"unknown {SINGULAR.get(name, name)} {_show(value)}; expected one of {', '.join(expected)}"
        case "string_pattern_mismatch" if name == "subject":
            return f'invalid subject {_show(value)}; write "owner:NAME", "rule:ID", "reviewer:NAME" or "*"'
        case "string_pattern_mismatch":
            return f'invalid {name} {_show(value)}; use letters, digits, ".", "_" and "-", starting with a letter or digit'
        case "too_short":
            return f"must not be empty; write it like {EXAMPLES.get(name, name + ' = …')}"
        case "value_error":
            return str(error["ctx"]["error"])
    hint = f"; write it like {EXAMPLES[name]}" if name in EXAMPLES else ""
    return f"{error['msg'][0].lower()}{error['msg'][1:]} (got {_show(value)}){hint}"


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
        model = RuleSpec if parent[0] == "rule" else GrantSpec
    return [info.alias or name for name, info in model.model_fields.items()]


def _owner_label(loc: tuple[Any, ...], data: dict[str, Any]) -> str:
    """``rule "stall"``, ``grant "owner:ann"``, ``rule #2`` when it has no usable id,
    or ``top level``."""
    if loc[0] in TABLES and len(loc) > 1:
        return str(loc[0])
    if len(loc) < 2 or not isinstance(loc[1], int):
        return "top level"
    table = _dig(data, loc[:2])
    name = table.get("id" if loc[0] == "rule" else "subject") if isinstance(table, dict) else None
    return f"{loc[0]} {_show(name)}" if isinstance(name, str) else f"{loc[0]} #{loc[1] + 1}"


def _dig(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


#: How much of a value an error message quotes.
SHOW_CHARS = 60


def _show(value: object) -> str:
    """A value as an error quotes it: one line, at most about ``SHOW_CHARS`` characters."""
    try:
        text = json.dumps(value[: SHOW_CHARS + 1]) if isinstance(value, str) else str(value).replace("\n", " ")
    except ValueError:  # an integer of thousands of digits (Python refuses to print it)
        return "a number too large to show"
    return text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS] + "…"


# -- finding the line of a table or key in TOML source --------------------------------------

_HEADER = re.compile(r"\s*\[(\[)?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def _locate(text: str, loc: tuple[Any, ...]) -> int:
    """The 1-based line of the deepest part of ``loc`` found in the source: the key's
    own line, else its parent's, else the ``[[array]]`` header, else line 1.

    ``loc`` is (array name, index, key, key, …) or (top-level key,). Lines inside
    multi-line strings are not told apart from keys: a good-enough guess there.
    """
    lines = text.splitlines()
    sections = _sections(lines)
    if len(loc) >= 2 and isinstance(loc[1], int):
        array, index = loc[0], loc[1]
        headers = [i for i, (_, path, is_array) in enumerate(sections) if is_array and path == (array,)]
        if index >= len(headers):
            return 1
        start = headers[index]
        end = next((i for i in range(start + 1, len(sections)) if sections[i][2] and sections[i][1] == (array,)), len(sections))
        owned = [(first, path[1:]) for first, path, _ in sections[start:end] if path[:1] == (array,)]
        header_line, keys = sections[start][0] + 1, _keys_until_index(loc[2:])
    else:
        owned = [(first, path) for first, path, _ in sections]
        header_line, keys = 1, _keys_until_index(loc)
    for depth in range(len(keys), 0, -1):
        line = _find_key(lines, sections, owned, keys[:depth])
        if line is not None:
            return line
    return header_line


def _keys_until_index(parts: tuple[Any, ...]) -> tuple[str, ...]:
    """Keys up to the first list index: an array's elements have no keys of their own."""
    keys: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            break
        keys.append(part)
    return tuple(keys)


def _sections(lines: list[str]) -> list[tuple[int, tuple[str, ...], bool]]:
    """(0-based first line, table path, is array-of-tables) for each table; the
    top-level table (before any header) first, with path ()."""
    sections: list[tuple[int, tuple[str, ...], bool]] = [(-1, (), False)]
    for number, line in enumerate(lines):
        header = _HEADER.match(line)
        if header and not line.lstrip().startswith("#"):
            path = tuple(part.strip().strip("\"'") for part in header[2].split("."))
            sections.append((number, path, bool(header[1])))
    return sections


def _find_key(
    lines: list[str],
    sections: list[tuple[int, tuple[str, ...], bool]],
    owned: list[tuple[int, tuple[str, ...]]],
    keys: tuple[str, ...],
) -> int | None:
    """The line defining ``keys`` in one of the ``owned`` sections (given as first
    line and path relative to the table ``keys`` is relative to): a sub-table
    header, or a (dotted) key in a section that is a prefix of ``keys``; a key
    defined through dotted sub-keys is found at its first one."""
    firsts = [first for first, _, _ in sections]
    for first, prefix in owned:
        if prefix == keys and first >= 0:
            return first + 1
        if keys[: len(prefix)] != prefix or len(keys) == len(prefix):
            continue
        rest = keys[len(prefix):]
        key = re.compile(r"\s*" + r"\s*\.\s*".join(rf"[\"']?{re.escape(k)}[\"']?" for k in rest) + r"\s*[=.]")
        end = next((f for f in firsts if f > first), len(lines))
        for number in range(first + 1, end):
            if key.match(lines[number]):
                return number + 1
    return None
