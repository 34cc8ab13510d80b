"""Proposing and promoting rules: the library behind ``tillerman rules propose``,
``promote`` and ``proposals``.

The lifecycle itself (which moves are allowed, the digest that binds a promotion to
the proposed rule, the rule as TOML) is pure and lives in ``tillerman.rules.lifecycle``;
this module does its I/O: it records ``rule_proposed`` and ``rule_promoted`` in the
ledger and installs a promoted rule in the rule file the daemon runs with.

A promotion writes the new rule file beside the old one first (validated, with the
old file's mode and owner), appends the promotion, and only then renames the file
into place: a promotion that the ledger refuses leaves the rule file as it was.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from tillerman.controller.core.intent_requests import SOURCE
from tillerman.ledger.events import Envelope, RulePromoted, RuleProposed
from tillerman.ledger.paths import check_output
from tillerman.ledger.recorder import Recorder
from tillerman.rules import lifecycle
from tillerman.rules.errors import RuleSetError
from tillerman.rules.file_safety import read_file
from tillerman.rules.files import load_rules
from tillerman.rules.lifecycle import Lifecycle, rule_digest, rule_toml
from tillerman.rules.ruleset import Rule

if TYPE_CHECKING:
    from tillerman.controller.report.account import Precision

OnUnsafe = Callable[[str], None]


class ProposalError(ValueError):
    """A proposal or promotion asked for wrongly (a usage error), with what to do instead."""


class PromotionRefused(Exception):
    """A promotion the lifecycle does not allow (a failed check, not a usage error)."""


class Promotion(msgspec.Struct, frozen=True, kw_only=True):
    """What a promotion did: the rule's lifecycle after it, the move, and the TOML
    block that was installed (or is to be, when no rule file was given)."""

    life: Lifecycle
    rule: Rule
    from_status: str
    block: str
    installed: bool


def lifecycles(ledger: Recorder) -> dict[str, Lifecycle]:
    """Every proposed rule's lifecycle, by id."""
    return lifecycle.fold(ledger.read())


def read_proposal(path: str, *, on_unsafe: OnUnsafe | None = None) -> Rule:
    """The one rule, with status ``proposed``, of the file at ``path``."""
    found = load_rules(read_file(Path(path), on_unsafe=on_unsafe), path)
    if len(found) != 1:
        raise ProposalError(f"{path}: a proposal is one rule; found {len(found)} [[rule]] tables")
    (rule,) = found
    if rule.status != "proposed":
        raise ProposalError(f'{path}: rule "{rule.id}" field status: a proposal must say status = "proposed" (got '
                            f'"{rule.status}"); promotion to shadow or active is tillerman rules promote')
    return rule


def propose(ledger: Recorder, rule: Rule, *, evidence: tuple[str, ...], signature: str | None, by: str,
            source_path: str) -> tuple[Lifecycle, bool]:
    """Record ``rule`` as proposed; the lifecycle after it, and False when this exact
    rule was proposed already (nothing is recorded then)."""
    digest = rule_digest(rule)
    current = lifecycles(ledger).get(rule.id)
    if current is not None and current.rule_digest == digest:
        return current, False
    event = RuleProposed(rule_id=rule.id, rule_version=rule.version, rule_digest=digest,
                         action=rule.action.value, rule=rule_toml(rule), evidence=evidence,
                         signature=signature, proposed_by=by, source_path=str(Path(source_path).resolve()))
    ledger.append([Envelope(event_id=f"rule_proposed:{rule.id}:{digest}", event=event, source=SOURCE,
                            at=time.time())], durable=True)
    return lifecycles(ledger)[rule.id], True


def check_promotion_request(by: str, evaluation: str, rollback: str, rules_path: str | None) -> None:
    """Refuse a promotion that does not say who, on what evaluation and what sends it
    back, or that names a rule file in a folder that does not exist."""
    for name, value in (("--by", by), ("--evaluation", evaluation), ("--rollback-trigger", rollback)):
        if not value.strip():
            raise ProposalError(f"{name} is empty; say who, which evaluation, and what sends the rule back")
    if rules_path is not None and not Path(rules_path).absolute().parent.is_dir():
        raise ProposalError(f"cannot install the rule in {rules_path}: the folder {Path(rules_path).absolute().parent}"
                            " does not exist")


def promote(ledger: Recorder, rule_id: str, *, to: str, by: str, evaluation: str, rollback: str,
            rules_path: str | None, on_unsafe: OnUnsafe | None = None) -> Promotion:
    """Move a proposed rule to ``to`` and record who, the evaluation and the rollback
    trigger; with ``rules_path``, install the rule with its new status in that file."""
    check_promotion_request(by, evaluation, rollback, rules_path)
    life = lifecycles(ledger).get(rule_id)
    problem = lifecycle.promotion_problem(life, rule_id, to)
    if problem is not None:
        raise PromotionRefused(problem)
    (rule,) = load_rules(life.rule, f"ledger proposal {rule_id}")
    block = rule_toml(rule, status=to)
    staged = stage_rule_file(Path(rules_path), rule_id, block, on_unsafe=on_unsafe) if rules_path else None
    event = RulePromoted(rule_id=rule_id, rule_version=rule.version, rule_digest=life.rule_digest,
                         action=rule.action.value, from_status=life.status, to_status=to, by=by,
                         evaluation=evaluation, rollback_trigger=rollback,
                         rules_path=str(Path(rules_path).resolve()) if rules_path else None)
    try:
        ledger.append([Envelope(event_id=f"rule_promoted:{rule_id}:{life.rule_digest}:{len(life.promotions)}",
                                event=event, source=SOURCE, at=time.time())], durable=True)
    except BaseException:
        if staged is not None:
            staged.unlink(missing_ok=True)
        raise
    if staged is not None:
        os.replace(staged, os.path.realpath(rules_path))
    return Promotion(life=lifecycles(ledger)[rule_id], rule=rule, from_status=life.status, block=block,
                     installed=staged is not None)


def labeled_records(ledger: Recorder) -> dict[str, Precision]:
    """Each rule's record against the owner's labels (``tillerman label``): its findings'
    and its intents' labels, the evidence ``rules diff`` and ``rules promote`` show. It is
    shown beside a promotion, never a condition of one: a label grants nothing."""
    from tillerman.controller.report.account import LABELED_KINDS, rule_records
    from tillerman.controller.report.fold import Facts

    return rule_records(Facts().fold(ledger.history(kinds=LABELED_KINDS)))


def stage_rule_file(path: Path, rule_id: str, block: str, *, on_unsafe: OnUnsafe | None = None) -> Path:
    """The rule file with the rule installed, validated, written beside it (not yet
    in place; the caller renames it over the file, or over the file a symlink leads
    to). It keeps the file's mode and owner: a promotion must not open the rules to
    others. An invalid result is refused and nothing is written."""
    target = check_output(path, "--rules")  # never a FIFO, a device, a ledger or one of its files
    try:
        existing = os.stat(target) if target.exists() else None
        text = read_file(path, on_unsafe=on_unsafe) if existing else ""
        new = lifecycle.install(text, rule_id, block)
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: TOMLDecodeError, or an over-long number
        raise ProposalError(f"{path}: cannot install the rule ({exc}); fix the file with tillerman rules validate"
                            ) from exc
    try:
        load_rules(new, str(path))
    except RuleSetError as exc:
        raise ProposalError(f"{path}: the rule file would not validate with the rule installed; nothing written:\n{exc}"
                            ) from exc
    staged = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        staged.unlink(missing_ok=True)  # a leftover of a crashed promotion; O_EXCL then follows no planted symlink
        with open(os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), "w",
                  encoding="utf-8") as file:
            if existing is not None:
                os.fchmod(file.fileno(), stat.S_IMODE(existing.st_mode))
                if (existing.st_uid, existing.st_gid) != (os.geteuid(), os.getegid()):
                    os.fchown(file.fileno(), existing.st_uid, existing.st_gid)
            file.write(new)
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise ProposalError(f"{path}: cannot write the rule file ({exc.strerror}); nothing written; "
                            "check that you may write it and its directory") from exc
    return staged
