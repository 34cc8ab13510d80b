"""``tillerman review try``: one checkpoint by hand, to test a reviewer command.

It builds the packet for an intent from the ledger, runs the configured reviewer once,
judges the answer and says what the controller would do with it. It records nothing:
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
from tillerman.controller.review.reviewer import ask
from tillerman.ledger.reviews import Call, Escalate, OverBudget, Plan, Recorded, Refused, fold_reviews, plan_checkpoint
from tillerman.rules.review import CHECKPOINTS, Accepted, consequence


@click.group()
def review() -> None:
    """Reviewers: model judgment at named checkpoints, never an authority."""


@review.command("try")
@click.option("--reviewer", "name", required=True, help="A [[reviewer]] name from the config file.")
@click.option("--checkpoint", type=click.Choice(CHECKPOINTS), required=True)
@click.option("--intent", "intent_id", required=True, help="The intent the checkpoint is about.")
@click.option("--rules", "rules_path", type=PathType(dir_okay=False, exists=True), help="Rule file (default: built-in).")
@click.option("--config", "config_path", type=PathType(dir_okay=False, exists=True), help=CONFIG_HELP)
@json_option
@ledger_option
@errors_to_exit_codes
def review_try(name, checkpoint, intent_id, rules_path, config_path, as_json, ledger_path):
    """Run one checkpoint by hand: show the packet, the answer and what the controller
    would do with it. Nothing is recorded.

    Example: tillerman review try --reviewer codex --checkpoint before_dispatch --intent in-3f2a9c0d1e2b4a5f6c7d
    """
    effective = load_rules_or_fail(rules_path, config_path)
    reviewer = effective.reviewer(name)
    if reviewer is None:
        known = ", ".join(r.name for r in effective.reviewers) or "none configured"
        raise Fail(f"no reviewer {name!r} in the config file ({known}); add a [[reviewer]] table named so")
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
