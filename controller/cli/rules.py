"""``tillerman rules …``: validate, show, diff, propose, promote, proposals.

Added to the main group by ``tillerman.controller.cli.main``. Exit codes
follow the CLI convention: 0 done, 1 a refused check (a promotion the lifecycle does
not allow), 2 usage, unreadable input or an invalid rule or config file.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
import msgspec

from tillerman.controller.cli.output import (
    EXIT_CHECK_FAILED,
    EXIT_USAGE,
    Fail,
    PathType,
    errors_to_exit_codes,
    json_option,
    print_json,
    print_line,
    print_table,
)
from tillerman.controller.cli.rule_proposals import (
    PromotionRefused,
    check_promotion_request,
    labeled_records,
    lifecycles,
    promote,
    propose,
    read_proposal,
)
from tillerman.controller.cli.shared import (
    CONFIG_HELP,
    ledger_option,
    load_rules_or_fail,
    open_intact_ledger,
    open_ledger,
    parse_now,
    report_anchor,
    warn_unsafe,
)
from tillerman.controller.core.timefmt import iso
from tillerman.controller.replay.disagreement import DiffReport, diff
from tillerman.controller.replay.replayer import ReplayError
from tillerman.ledger.command_patterns import DEFAULT as DEFAULT_PATTERNS
from tillerman.rules import lifecycle
from tillerman.rules.config import Effective, check_file, config_file, default_config_path
from tillerman.rules.durations import format_duration
from tillerman.rules.errors import RuleSetError
from tillerman.rules.file_safety import read_file
from tillerman.rules.files import load_rules
from tillerman.rules.lifecycle import PROMOTION_TARGETS, condition_text, rule_digest
from tillerman.rules.owner import local_login
from tillerman.rules.ruleset import build_ruleset


def _rules_options(fn):
    fn = click.option("--config", "config_path", type=PathType(dir_okay=False, exists=True), help=CONFIG_HELP)(fn)
    return click.option("--rules", "rules_path", type=PathType(dir_okay=False, exists=True),
                        help="Rule file (TOML; default: the built-in rules).")(fn)


@click.group()
def rules() -> None:
    """Validate, show and compare rule sets; propose and promote rules."""


# -- validate -----------------------------------------------------------------------


@rules.command("validate")
@click.argument("file", type=PathType(dir_okay=False))
@json_option
def rules_validate(file, as_json):
    """Check a rule file or a config file (grants, [patterns]); exit 2 with the file,
    line, field and fix when it is invalid. A file with [[rule]] tables (or none of
    [[grant]] and [patterns]) is a rule file.

    Example: tillerman rules validate ~/.config/tillerman/rules.toml
    """
    try:
        result = {"file": file, "valid": True} | check_file(read_file(Path(file), on_unsafe=warn_unsafe), file)
    except RuleSetError as exc:
        if as_json:
            print_json({"file": file, "valid": False, "errors": str(exc).splitlines()})
            raise SystemExit(EXIT_USAGE) from exc
        raise Fail(str(exc)) from exc
    if as_json:
        print_json(result)
    elif result["kind"] == "config":
        patterns = result["patterns"]
        print_line(f"{file}: valid config file: {result['grants']} grants, built-in owner grant"
                   f" {'on' if result['owner_grant'] else 'off'}, patterns {patterns['critical']} critical,"
                   f" {patterns['external']} external"
                   + (f", {result['reviewers']} reviewers" if result["reviewers"] else "")
                   + (f", {result['notify']} notify sinks" if result["notify"] else "")
                   + (f", {result['prices']} price overrides" if result["prices"] else ""))
    else:
        shown = ", ".join(f"{n} {s}" for s, n in result["statuses"].items()) or "none in force"
        print_line(f"{file}: valid rule file: {result['rules']} rules ({shown}), digest {result['digest']}")


# -- show ----------------------------------------------------------------------------


def rule_json(rule, now: float) -> dict:
    return {
        "id": rule.id, "version": rule.version, "status": rule.status, "action": rule.action.value,
        "condition": condition_text(rule), "owner": rule.owner, "review_by": rule.review_by.isoformat(),
        "expires": rule.expires.isoformat() if rule.expires else None,
        "threads": rule.threads if isinstance(rule.threads, str) else list(rule.threads),
        "text": rule.text, "ack_deadline": format_duration(rule.ack_deadline) if rule.ack_deadline else None,
        "verify": rule.verify, "review": rule.review, "digest": rule_digest(rule),
        "warning": lifecycle.warning(rule, now),
    }


@rules.command("show")
@_rules_options
@click.option("--now", "now_text", help="Judge review dates at this ISO-8601 time instead of now.")
@json_option
@errors_to_exit_codes
def rules_show(rules_path, config_path, now_text, as_json):
    """The effective rule set: each rule with its status, version, action, condition,
    owner and review warnings; the grants (the built-in owner grant marked as such);
    the command patterns; the digest; which config file was read, if any.

    Example: tillerman rules show --rules rules.toml --config config.toml
    """
    effective = load_rules_or_fail(rules_path, config_path)
    used = config_file(config_path)
    now = parse_now(now_text)
    ruleset, patterns = effective.ruleset, effective.patterns
    data = {
        "digest": ruleset.digest,
        "rules_path": rules_path,
        "config_path": str(used) if used else None,
        "config_source": "option" if config_path else "default" if used else "none",
        "default_config_path": str(default_config_path()),
        "rules": [rule_json(r, now) for r in sorted(ruleset.rules, key=lambda r: r.id)],
        "grants": [{"subject": g.subject, "actions": sorted(g.actions),
                    "threads": g.threads if isinstance(g.threads, str) else list(g.threads),
                    "source": "built-in" if g.builtin else "config"} for g in ruleset.grants],
        "patterns": {"source": "built-in" if patterns == DEFAULT_PATTERNS else "config",
                     "digest": effective.patterns_digest,
                     "critical": list(patterns.critical), "external": list(patterns.external)},
        "reviewers": [{"name": r.name, "command": list(r.command), "timeout": format_duration(r.timeout),
                       "adapter": r.adapter, "max_per_intent": r.max_per_intent,
                       "max_per_thread_per_hour": r.max_per_thread_per_hour,
                       "budget_usd_per_day": r.budget_usd_per_day} for r in effective.reviewers],
    }
    if as_json:
        print_json(data)
        return
    click.echo(f"rule set {ruleset.digest}")
    print_line(f"rules: {rules_path or 'built-in defaults'}; config: {_config_text(data)}")
    rows = [dict(r, warning=r["warning"] or "", expires=r["expires"] or "") for r in data["rules"]]
    print_table(rows, ("id", "version", "status", "action", "condition", "owner", "review_by", "expires", "warning"),
                "no rules")
    click.echo("")
    grants = [dict(g, actions=",".join(g["actions"]),
                   threads=g["threads"] if isinstance(g["threads"], str) else ",".join(g["threads"]))
              for g in data["grants"]]
    print_table(grants, ("subject", "actions", "threads", "source"), "no grants: nothing may be dispatched")
    if any(g.builtin for g in ruleset.grants):
        click.echo("(built-in: the local owner may steer and queue anywhere; [defaults] owner_grant = false removes it)")
    click.echo("")
    click.echo(f"patterns ({data['patterns']['source']}, {effective.patterns_digest}):")
    for kind in ("critical", "external"):
        for pattern in data["patterns"][kind]:
            print_line(f"  {kind:<8}  {pattern}")
    for r in data["reviewers"]:
        print_line(f"reviewer {r['name']}: {' '.join(r['command'])} (timeout {r['timeout']},"
                   f" {r['max_per_intent']} per intent, {r['max_per_thread_per_hour']} per thread per hour"
                   + (f", {r['budget_usd_per_day']:g} USD a day)" if r["budget_usd_per_day"] is not None else ")"))


def _config_text(data: dict) -> str:
    match data["config_source"]:
        case "option":
            return data["config_path"]
        case "default":
            return f"{data['config_path']} (the default file)"
    return f"none ({data['default_config_path']} does not exist)"


# -- diff ----------------------------------------------------------------------------


@rules.command("diff")
@click.option("--against", "against", required=True, type=PathType(dir_okay=False, exists=True),
              help="The candidate rule file.")
@_rules_options
@click.option("--ledger", "ledger_path", type=PathType(dir_okay=False, exists=True),
              help="Replay the observations of this ledger.")
@click.argument("sessions", nargs=-1)
@json_option
@errors_to_exit_codes
def rules_diff(against, rules_path, config_path, ledger_path, sessions, as_json):
    """The disagreement set: replay a ledger or recorded sessions with the active rule
    set and with the candidate (same grants and patterns), in memory, and list where
    one would have acted differently: rule, file, thread, turn, time, and what each
    would have done. Nothing is dispatched or written. With --ledger, also each rule's
    labeled record there (tillerman label): labeled useful / labeled, and how many are not.

    Example: tillerman rules diff --against candidate.toml ~/.codex/sessions/2026/11/
    """
    if bool(ledger_path) == bool(sessions):
        raise Fail("give the input: --ledger PATH, or recorded session files or directories (not both)")
    active = load_rules_or_fail(rules_path, config_path)
    try:
        candidate_rules = load_rules(read_file(Path(against), on_unsafe=warn_unsafe), against)
    except RuleSetError as exc:
        raise Fail(str(exc)) from exc
    candidate = Effective(ruleset=build_ruleset(candidate_rules, active.ruleset.grants),
                          patterns=active.patterns, patterns_digest=active.patterns_digest)
    try:
        report = diff(active, candidate, [ledger_path] if ledger_path else list(sessions))
    except ReplayError as exc:
        raise Fail(str(exc), exc.exit_code) from exc
    records = _diff_records(ledger_path, {r.id for r in (*active.ruleset.rules, *candidate.ruleset.rules)})
    if as_json:
        print_json(_diff_json(report) | {"labeled_records": records})
        return
    _print_diff(report, rules_path, against)
    if ledger_path:
        click.echo("")
        click.echo("labeled record (tillerman label) of the rules in either set:")
        for line in _record_lines(records):
            print_line(line)


def _diff_records(ledger_path: str | None, rule_ids: set[str]) -> dict:
    """The rules' labeled records in the ledger the diff replays (recorded sessions carry no labels)."""
    if not ledger_path:
        return {}
    with open_intact_ledger(ledger_path) as ledger:
        return {rule: record for rule, record in labeled_records(ledger).items() if rule in rule_ids}


def _record_lines(records: dict) -> list[str]:
    if not records:
        return ["  none: no finding or intent of these rules is in the ledger"]
    return [f"  {rule}: {_record_text(record)}" for rule, record in records.items()]


def _record_text(record) -> str:
    figure = record.precision
    shown = f"{figure.value} ({figure.how})" if figure.value is not None else f"n/a ({figure.why})"
    verdicts = ", ".join(f"{verdict} {n}" for verdict, n in record.verdicts.items())
    return f"precision {shown}; {record.labeled} labeled ({verdicts or 'none'}), {record.unlabeled} unlabeled"


def _act_json(act) -> dict | None:
    return None if act is None else msgspec.to_builtins(act) | {"summary": act.summary}


def _diff_json(report: DiffReport) -> dict:
    data = msgspec.to_builtins(report)
    data["disagreements"] = [msgspec.to_builtins(d) | {"active": _act_json(d.active), "candidate": _act_json(d.candidate)}
                             for d in report.disagreements]
    return data


def _short(path: str, inputs: list[str]) -> str:
    if len(inputs) < 2:
        return Path(path).name
    return os.path.relpath(path, os.path.commonpath(inputs))


def _print_diff(report: DiffReport, rules_path: str | None, against: str) -> None:
    print_line(f"active     {report.active_digest}  ({rules_path or 'built-in defaults'})")
    print_line(f"candidate  {report.candidate_digest}  ({against})")
    disagree = report.only_active + report.only_candidate + report.changed
    click.echo(f"{len(report.inputs)} inputs: {report.acts['active']} acts by the active set, "
               f"{report.acts['candidate']} by the candidate; {report.agreements} agree, {disagree} disagree "
               f"({report.only_active} only active, {report.only_candidate} only candidate, {report.changed} changed)")
    if not report.disagreements:
        click.echo("no disagreements")
        return
    click.echo("")
    rows = [{"rule": d.rule_id, "kind": d.kind, "file": _short(d.file, report.inputs), "thread": d.thread,
             "turn": d.turn, "at": d.at, "active": d.active.summary if d.active else "-",
             "candidate": d.candidate.summary if d.candidate else "-"} for d in report.disagreements]
    print_table(rows, ("rule", "kind", "file", "thread", "turn", "at", "active", "candidate"), "")


# -- propose, promote, proposals ------------------------------------------------------


@rules.command("propose")
@click.argument("file", type=PathType(dir_okay=False))
@click.option("--evidence", multiple=True, help="Pointer to the evidence (ledger seq, session file:offset, issue …).")
@click.option("--signature", help="The failure signature the rule predicts (what it should catch).")
@click.option("--by", "by", default=local_login,
              help="Who proposes it (default: the login name of the user running tillerman).")
@ledger_option
@json_option
@errors_to_exit_codes
def rules_propose(file, evidence, signature, by, ledger_path, as_json):
    """Record a candidate rule as proposed: its digest, the evidence it cites and the
    failure it predicts. FILE holds one [[rule]] with status = "proposed" and an
    action from the registered vocabulary. Nothing runs it until it is promoted.

    Example: tillerman rules propose quiet-steer.toml --evidence ledger:seq:1042 --signature "same pytest failure 3x"
    """
    try:
        rule = read_proposal(file, on_unsafe=warn_unsafe)
    except RuleSetError as exc:
        raise Fail(str(exc)) from exc
    with open_ledger(ledger_path) as ledger:
        life, recorded = propose(ledger, rule, evidence=tuple(evidence), signature=signature, by=by, source_path=file)
    if not recorded:
        print_line(f"rule {rule.id} v{rule.version} is already proposed ({life.status}, {life.rule_digest})")
        return
    if as_json:
        print_json(_life_json(life))
    else:
        print_line(f"proposed {rule.id} v{rule.version} ({rule.action.value}) {life.rule_digest}")
        print_line(f"evidence: {', '.join(evidence) or 'none'}; signature: {signature or 'none'}")
        print_line(f"next: tillerman rules diff --against {file} …, then tillerman rules promote {rule.id}"
                   " --to shadow")
    report_anchor(ledger)


@rules.command("promote")
@click.argument("rule_id")
@click.option("--to", "to", type=click.Choice(PROMOTION_TARGETS), required=True)
@click.option("--by", "by", required=True, help="Who promotes it.")
@click.option("--evaluation", required=True, help="The evaluation it cites (e.g. the rules diff run and its result).")
@click.option("--rollback-trigger", "rollback", required=True, help="What observation sends it back to shadow.")
@click.option("--rules", "rules_path", type=PathType(dir_okay=False),
              help="Install the rule, with its new status, in this rule file (the daemon reloads it).")
@ledger_option
@json_option
@errors_to_exit_codes
def rules_promote(rule_id, to, by, evaluation, rollback, rules_path, ledger_path, as_json):
    """Promote a proposed rule: proposed → shadow → active (active → shadow rolls
    back). Records who, the evaluation and the rollback trigger, bound to the rule's
    digest; with --rules, writes the rule into that file (validated first). Shows the
    rule's labeled record (tillerman label) as evidence; a label never allows a promotion.

    Example: tillerman rules promote quiet-steer --to shadow --by ann --evaluation "rules diff 2026-11-30: 1 catch, 1 false" --rollback-trigger "any steer on a healthy build" --rules rules.toml
    """
    check_promotion_request(by, evaluation, rollback, rules_path)  # before a ledger is created for nothing
    with open_ledger(ledger_path) as ledger:
        try:
            done = promote(ledger, rule_id, to=to, by=by, evaluation=evaluation, rollback=rollback,
                           rules_path=rules_path, on_unsafe=warn_unsafe)
        except PromotionRefused as exc:
            raise Fail(str(exc), EXIT_CHECK_FAILED) from exc
        except RuleSetError as exc:
            raise Fail(str(exc)) from exc
        record = labeled_records(ledger).get(rule_id)  # evidence shown, never a condition of the promotion
    if as_json:
        print_json(_life_json(done.life) | {"labeled_record": record})
    else:
        print_line(f"promoted {rule_id} v{done.rule.version} {done.from_status} -> {to} by {by}"
                   f" ({done.life.rule_digest})")
        print_line(f"labeled record: {_record_text(record) if record else 'none: no finding or intent of it is on record'}")
        if done.installed:
            print_line(f"installed in {rules_path}; a running daemon reloads it and records the new digest")
        else:
            click.echo("not installed: add this to the daemon's rule file (or give --rules PATH):")
            for line in done.block.rstrip("\n").split("\n"):  # the recorded rule, a line at a time
                print_line(line)
    report_anchor(ledger)


def _life_json(life: lifecycle.Lifecycle) -> dict:
    data = msgspec.to_builtins(life)
    data["proposed_at"] = iso(life.proposed_at)
    for item in data["promotions"]:
        item["at"] = iso(item["at"])
    return data


@rules.command("proposals")
@ledger_option
@json_option
@errors_to_exit_codes
def rules_proposals(ledger_path, as_json):
    """Proposed rules and their current status (the lifecycle fold of the ledger).

    Example: tillerman rules proposals --json
    """
    with open_ledger(ledger_path, must_exist=True) as ledger:
        lives = sorted(lifecycles(ledger).values(), key=lambda life: life.rule_id)
    rows = [_life_json(life) for life in lives]
    if as_json:
        print_json(rows)
        return
    table = [{"rule": r["rule_id"], "version": r["rule_version"], "status": r["status"], "action": r["action"],
              "proposed_by": r["proposed_by"], "promotions": len(r["promotions"]), "digest": r["rule_digest"]}
             for r in rows]
    print_table(table, ("rule", "version", "status", "action", "proposed_by", "promotions", "digest"), "no proposed rules")
