"""``tillerman review try``: one checkpoint by hand, to test a reviewer command.

It builds the packet for an intent from the ledger, runs the configured reviewer once,
judges the answer and says what the controller would do with it; ``--labeled`` does so
for every intent the owner labeled and measures the reviewer's agreement with the labels
(the calibration of a reviewer against its owner). It records nothing:
a try must not spend a cap or leave a committed checkpoint that a later real checkpoint
with the same id would answer from. Exit codes: 0 an accepted answer, 1 the checkpoint
failed closed, 2 usage or configuration.
"""

from __future__ import annotations

import time

import click
import msgspec

from tillerman.controller.cli.output import (
    EXIT_CHECK_FAILED,
    Fail,
    PathType,
    errors_to_exit_codes,
    json_option,
    print_json,
    print_line,
)
from tillerman.controller.cli.shared import CONFIG_HELP, ledger_option, load_rules_or_fail, open_intact_ledger
from tillerman.controller.core.intent_requests import intent_view
from tillerman.controller.review.packet import packet_for_intent
from tillerman.controller.report.account import ratio
from tillerman.controller.review.reviewer import ask
from tillerman.ledger.labels import fold_labels, parse_subject, reviewer_agrees
from tillerman.ledger.reviews import Call, Escalate, OverBudget, Plan, Recorded, Refused, fold_reviews, plan_checkpoint
from tillerman.rules.review import CHECKPOINTS, Accepted, consequence


#: Reviewer calls ``review try --labeled`` makes unless told otherwise: each one costs.
LABELED_LIMIT = 25


@click.group()
def review() -> None:
    """Reviewers: model judgment at named checkpoints, never an authority."""


@review.command("try")
@click.option("--reviewer", "name", required=True, help="A [[reviewer]] name from the config file.")
@click.option("--checkpoint", type=click.Choice(CHECKPOINTS), required=True)
@click.option("--intent", "intent_id", help="The intent the checkpoint is about.")
@click.option("--labeled", is_flag=True,
              help="Instead of one intent: every intent the owner labeled (tillerman label), and the reviewer's"
                   " agreement with those labels.")
@click.option("--limit", type=click.IntRange(min=1),
              help=f"With --labeled: ask about the newest this many labeled intents (each is a reviewer call,"
                   f" which costs; default {LABELED_LIMIT}).")
@click.option("--rules", "rules_path", type=PathType(dir_okay=False, exists=True), help="Rule file (default: built-in).")
@click.option("--config", "config_path", type=PathType(dir_okay=False, exists=True), help=CONFIG_HELP)
@json_option
@ledger_option
@errors_to_exit_codes
def review_try(name, checkpoint, intent_id, labeled, limit, rules_path, config_path, as_json, ledger_path):
    """Run one checkpoint by hand: show the packet, the answer and what the controller
    would do with it. Nothing is recorded. With --labeled, run it for every intent the
    owner labeled and say how often the reviewer's disposition agrees with the label
    (a disposition that lets the intervention go on agrees with useful, any other with
    not_useful and harmful).

    Example: tillerman review try --reviewer codex --checkpoint before_dispatch --intent in-3f2a9c0d1e2b4a5f6c7d
    """
    if (intent_id is None) == (not labeled):
        raise Fail("give --intent ID, or --labeled for every intent the owner labeled (not both)")
    if limit is not None and not labeled:
        raise Fail("--limit counts the labeled intents asked about: give it with --labeled")
    effective = load_rules_or_fail(rules_path, config_path)
    reviewer = effective.reviewer(name)
    if reviewer is None:
        known = ", ".join(r.name for r in effective.reviewers) or "none configured"
        raise Fail(f"no reviewer {name!r} in the config file ({known}); add a [[reviewer]] table named so")
    if labeled:
        try_labeled(reviewer, checkpoint, effective.ruleset, ledger_path, as_json, limit or LABELED_LIMIT)
        return
    ledger = open_intact_ledger(ledger_path)
    try:
        view = intent_view(ledger, intent_id)
        reviews = fold_reviews(ledger.read())
    finally:
        ledger.close()
    packet = packet_for_intent(view, checkpoint, reviewer, effective.ruleset)
    earlier_returns = reviews.returns(intent_id)
    recorded = ledger_says(plan_checkpoint(
        reviews, checkpoint_id=packet.checkpoint_id, checkpoint=checkpoint, intent_id=intent_id,
        thread_id=packet.thread_id, now=time.time(), max_per_intent=reviewer.max_per_intent,
        max_per_thread_per_hour=reviewer.max_per_thread_per_hour, reviewer=reviewer.name,
        budget_usd_per_day=reviewer.budget_usd_per_day))
    asked = ask(reviewer, checkpoint, packet)
    then = consequence(checkpoint, asked.outcome, reviewer=name, earlier_returns=earlier_returns)
    accepted = isinstance(asked.outcome, Accepted)
    if as_json:
        print_json({"packet": packet, "called": asked.called, "wall_ms": asked.wall_ms, "tokens": asked.tokens,
                    "accepted": accepted, "outcome": asked.outcome, "consequence": then, "ledger": recorded})
    else:
        click.echo("packet:")
        for line in msgspec.json.format(msgspec.json.encode(packet), indent=2).decode().splitlines():
            print_line(line)
        if not asked.called:
            click.echo("not called: the packet was refused before the call")
        else:
            print_line(f"called {reviewer.name} ({asked.wall_ms} ms"
                       + (f", {asked.tokens} tokens)" if asked.tokens is not None else ")"))
        if accepted:
            answer = asked.outcome.answer
            print_line(f"answer: {answer.disposition}"
                       + (f", recommends {answer.recommended_action}" if answer.recommended_action else "")
                       + f" (confidence {answer.confidence:g}): {answer.reason}")
            for number, item in enumerate(answer.required_corrections, 1):
                print_line(f"  correction {number}: {item.correction} (proof: {item.proof})")
        else:
            print_line(f"failed closed: {asked.outcome.reason}: {asked.outcome.detail}")
        print_line(f"the controller would: {then.step}: {then.detail}")
        print_line(f"the ledger says of {packet.checkpoint_id}: {recorded}")
    if not accepted:
        raise SystemExit(EXIT_CHECK_FAILED)


def try_labeled(reviewer, checkpoint: str, ruleset, ledger_path: str | None, as_json: bool, limit: int) -> None:
    """The reviewer over the ``limit`` intents the owner labeled last: its disposition
    against the owner's label (``tillerman.ledger.labels.reviewer_agrees``). Exit 1 when
    an answer failed closed (it is listed, and not compared)."""
    ledger = open_intact_ledger(ledger_path)
    try:
        labels = fold_labels(ledger.history(kinds=("owner_labeled",)))
        subjects = []
        for given in labels.all_current():
            kind, id_ = parse_subject(given.subject)
            if kind == "intent":
                subjects.append((given, intent_view(ledger, id_)))
    finally:
        ledger.close()
    if not subjects:
        raise Fail("the owner labeled no intent in this ledger; label some with: tillerman label INTENT VERDICT")
    labeled, subjects = len(subjects), subjects[-limit:]
    items = []
    for number, (given, view) in enumerate(subjects, 1):
        if not as_json:
            print_line(f"asking {reviewer.name} about {view.intent.id} ({number} of {len(subjects)})", err=True)
        asked = ask(reviewer, checkpoint, packet_for_intent(view, checkpoint, reviewer, ruleset))
        disposition = asked.outcome.answer.disposition if isinstance(asked.outcome, Accepted) else None
        items.append({"intent_id": view.intent.id, "verdict": given.verdict, "disposition": disposition,
                      "failed": None if disposition else asked.outcome.reason,
                      "agrees": None if disposition is None else reviewer_agrees(disposition, given.verdict)})
    compared = [item for item in items if item["agrees"] is not None]
    agreeing = sum(1 for item in compared if item["agrees"])
    figure = ratio(agreeing, len(compared), "answers whose disposition agrees with the owner's label / compared",
                   len(compared), "every answer failed closed")
    if as_json:
        print_json({"reviewer": reviewer.name, "checkpoint": checkpoint, "agreement": figure,
                    "compared": len(compared), "asked": len(items), "labeled": labeled, "items": items})
    else:
        for item in items:
            said = item["disposition"] or f"failed closed ({item['failed']})"
            mark = "" if item["agrees"] is None else ("  agrees" if item["agrees"] else "  DISAGREES")
            print_line(f"{item['intent_id']}: owner {item['verdict']}, {reviewer.name} {said}{mark}")
        shown = figure.value if figure.value is not None else f"n/a ({figure.why})"
        print_line(f"agreement: {shown} ({agreeing} of {len(compared)} compared; {len(items) - len(compared)}"
                   " failed closed)")
        if labeled > len(items):
            print_line(f"asked about the newest {len(items)} of {labeled} labeled intents; --limit {labeled} asks"
                       " about all")
    if len(compared) < len(items):
        raise SystemExit(EXIT_CHECK_FAILED)


def ledger_says(plan: Plan) -> str:
    """What a daemon would do at this checkpoint, given what the ledger recorded of it."""
    match plan:
        case Call():
            return "not asked yet: a daemon would call the reviewer"
        case Recorded(committed):
            return (f"already committed ({committed.disposition or committed.outcome}): a daemon would use that"
                    " and call nothing")
        case Refused(reason=reason, detail=detail) | Escalate(reason=reason, detail=detail) \
                | OverBudget(reason=reason, detail=detail):
            return f"{reason}: {detail}"
    raise AssertionError(plan)
