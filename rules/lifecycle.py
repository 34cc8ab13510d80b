"""A rule's life: proposed → shadow → active (and back to shadow), and its review.

Pure functions over rules and ledger events; ``tillerman.controller.cli.rule_proposals``
does the I/O (recording proposals and promotions, installing a promoted rule).

* ``rule_digest`` binds a proposal and every promotion to the exact rule: the
  canonical encoding of the rule without its ``status`` (which is what promotion
  changes), so a promotion of anything but the proposed rule is refused.
* ``fold`` reads ``rule_proposed`` and ``rule_promoted`` events and tells the current
  status of each proposed rule; ``promotion_problem`` says why a promotion may not be
  made. The transitions: proposed → shadow, shadow → active, active → shadow (the
  rollback). Nothing goes to active without having been in shadow first: a rule is
  judged on its disagreement set before it acts.
* How a promoted rule reaches the running set: the promotion writes the rule, with its
  new status, into the rules file the daemon runs with (``install``: the block with
  the same id is replaced, or the rule is appended; the whole file is validated
  before it is written). The daemon's reload (``tillerman.controller.daemon.reload``) picks the file
  up and records the new digest; a file that does not validate is never written.
  The ledger never becomes a second source of rules.
* ``reviews`` lists rules in force past ``review_by`` or past ``expires``: a
  protective rule must not become a permanent silent restriction.
"""

from __future__ import annotations

import calendar
import datetime
import hashlib
import json
import tomllib
from collections.abc import Iterable

import msgspec

from tillerman.ledger.events import Entry, RulePromoted, RuleProposed
from tillerman.rules.durations import format_duration
from tillerman.rules.ruleset import Rule, RuleSet, rule_builtins
from tillerman.rules.toml_source import sections

#: (from, to) moves a promotion may make.
PROMOTIONS = frozenset({("proposed", "shadow"), ("shadow", "active"), ("active", "shadow")})
PROMOTION_TARGETS = ("shadow", "active")


def rule_digest(rule: Rule) -> str:
    body = rule_builtins(rule)
    body.pop("status", None)
    return "sha256:" + hashlib.sha256(msgspec.json.encode(body, order="sorted")).hexdigest()


# -- review dates -------------------------------------------------------------------


class Review(msgspec.Struct, frozen=True, kw_only=True):
    rule_id: str
    rule_version: int
    why: str  # "expired" | "review_overdue"
    due: str  # the date, ISO
    due_at: float  # 00:00 UTC that day
    message: str


def _midnight(day: datetime.date) -> float:
    return float(calendar.timegm(day.timetuple()))


def reviews(ruleset: RuleSet, now: float) -> list[Review]:
    """Rules that are active or shadow and past ``expires`` (out of force) or past
    ``review_by`` (still in force, unreviewed). One per rule: expiry wins."""
    found = []
    for rule in sorted(ruleset.rules, key=lambda r: r.id):
        if rule.status not in ("active", "shadow"):
            continue
        if rule.expires is not None and now >= _midnight(rule.expires):
            why, day = "expired", rule.expires
            message = (f"rule {rule.id} v{rule.version} expired on {day.isoformat()} and no longer applies; "
                       "renew it (new expires) or retire it")
        elif now >= _midnight(rule.review_by):
            why, day = "review_overdue", rule.review_by
            message = (f"rule {rule.id} v{rule.version} was due for review on {day.isoformat()} and is still "
                       f"{rule.status}; review it and set a new review_by, or retire it")
        else:
            continue
        found.append(Review(rule_id=rule.id, rule_version=rule.version, why=why, due=day.isoformat(),
                            due_at=_midnight(day), message=message))
    return found


def warning(rule: Rule, now: float) -> str | None:
    """The ``rules show`` mark for one rule, if any."""
    single = RuleSet(rules=(rule,), grants=(), digest="")
    found = reviews(single, now)
    return f"{found[0].why} {found[0].due}" if found else None


# -- the proposal fold --------------------------------------------------------------


class Promotion(msgspec.Struct, frozen=True, kw_only=True):
    at: float | None
    from_status: str
    to_status: str
    by: str
    evaluation: str
    rollback_trigger: str


class Lifecycle(msgspec.Struct, kw_only=True):
    rule_id: str
    rule_version: int
    rule_digest: str
    action: str
    status: str  # proposed | shadow | active
    proposed_at: float | None
    proposed_by: str | None
    evidence: tuple[str, ...]
    signature: str | None
    rule: str  # TOML text of the proposed rule
    promotions: list[Promotion] = []


def fold(entries: Iterable[Entry]) -> dict[str, Lifecycle]:
    """The current status of each proposed rule (by id; a newer proposal of the same
    id starts over as ``proposed``)."""
    rules: dict[str, Lifecycle] = {}
    for entry in entries:
        event, at = entry.envelope.event, entry.envelope.at
        if isinstance(event, RuleProposed):
            rules[event.rule_id] = Lifecycle(
                rule_id=event.rule_id, rule_version=event.rule_version, rule_digest=event.rule_digest,
                action=event.action, status="proposed", proposed_at=at, proposed_by=event.proposed_by,
                evidence=event.evidence, signature=event.signature, rule=event.rule)
        elif isinstance(event, RulePromoted):
            life = rules.get(event.rule_id)
            if life is None or life.rule_digest != event.rule_digest:
                continue  # a promotion of something else than the current proposal binds nothing
            life.status = event.to_status
            life.promotions.append(Promotion(at=at, from_status=event.from_status, to_status=event.to_status,
                                             by=event.by, evaluation=event.evaluation,
                                             rollback_trigger=event.rollback_trigger))
    return rules


def promotion_problem(life: Lifecycle | None, rule_id: str, to: str) -> str | None:
    if life is None:
        return f"no proposed rule {rule_id} in the ledger; record it first with tillerman rules propose FILE"
    if (life.status, to) not in PROMOTIONS:
        allowed = ", ".join(t for f, t in sorted(PROMOTIONS) if f == life.status) or "none"
        hint = "; promote it to shadow first and judge it with tillerman rules diff" if to == "active" else ""
        return f"rule {rule_id} is {life.status}: it cannot go to {to} (allowed: {allowed}){hint}"
    return None


# -- rules as TOML ------------------------------------------------------------------


def _string(value: str) -> str:
    # a JSON string is a TOML basic string, but for DEL, which TOML wants escaped too
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _threads(value: str | tuple[str, ...]) -> str:
    return _string(value) if isinstance(value, str) else "[" + ", ".join(map(_string, value)) + "]"


def condition_text(rule: Rule) -> str:
    """``{ kind = "turn_quiet", for = "10m" }``: the condition as written in a file."""
    parts = []
    for key, value in msgspec.to_builtins(rule.condition).items():
        if key == "for_seconds":
            parts.append(f'for = "{format_duration(value)}"')
        elif isinstance(value, str):
            parts.append(f"{key} = {_string(value)}")
        else:
            parts.append(f"{key} = {value}")
    return "{ " + ", ".join(parts) + " }"


def rule_toml(rule: Rule, *, status: str | None = None) -> str:
    """One ``[[rule]]`` table that ``tillerman.rules.files.load_rules`` reads back as ``rule``
    (with ``status`` replaced when given)."""
    lines = [
        "[[rule]]",
        f"id = {_string(rule.id)}",
        f"version = {rule.version}",
        f"status = {_string(status or rule.status)}",
        f"owner = {_string(rule.owner)}",
        f"review_by = {rule.review_by.isoformat()}",
    ]
    if rule.expires is not None:
        lines.append(f"expires = {rule.expires.isoformat()}")
    if rule.threads != "*":
        lines.append(f"threads = {_threads(rule.threads)}")
    lines.append(f"condition = {condition_text(rule)}")
    lines.append(f"action = {_string(rule.action.value)}")
    if rule.text is not None:
        lines.append(f"text = {_string(rule.text)}")
    if rule.ack_deadline is not None:
        lines.append(f'ack_deadline = "{format_duration(rule.ack_deadline)}"')
    if rule.verify is not None:
        lines.append(f"verify = {_string(rule.verify)}")
    if rule.review is not None:
        lines.append(f"review = {_string(rule.review)}")
    return "\n".join(lines) + "\n"


def install(text: str, rule_id: str, block: str) -> str:
    """``text`` (a rules file) with the ``[[rule]]`` table whose id is ``rule_id``
    replaced by ``block``, or ``block`` appended when there is none. The caller
    validates the result before writing it."""
    lines = text.splitlines(keepends=True)
    ids = [r.get("id") if isinstance(r, dict) else None for r in tomllib.loads(text).get("rule", [])] if text else []
    tables = sections([line.rstrip("\r\n") for line in lines])[1:]
    headers = [i for i, (_, path, is_array) in enumerate(tables) if is_array and path == ("rule",)]
    if rule_id in ids and ids.index(rule_id) < len(headers):
        at = headers[ids.index(rule_id)]
        start = tables[at][0]
        following = (first for first, path, is_array in tables[at + 1:] if is_array or path[:1] != ("rule",))
        end = next(following, len(lines))
        # keep the blank lines and comments that introduce the next table with it
        while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1
        return "".join(lines[:start]) + block + "".join(lines[end:])
    head = "".join(lines)
    if head and not head.endswith("\n"):
        head += "\n"
    return head + ("\n" if head.strip() else "") + block
