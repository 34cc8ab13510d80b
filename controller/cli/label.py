"""``tillerman label``: the owner's verdict on an intervention, a rule's finding or a
reviewer's answer (``tillerman.controller.core.labeling``), what rules and reviewers are
measured against in ``tillerman report``, ``rules diff``, ``rules promote`` and ``review
try --labeled``. A label grants nothing."""

from __future__ import annotations

import click

from tillerman.controller.cli.output import errors_to_exit_codes, json_option, print_json, print_line
from tillerman.controller.cli.shared import ledger_option, open_ledger, report_anchor
from tillerman.ledger.labels import VERDICTS
from tillerman.rules.owner import local_login


@click.command("label")
@click.argument("subject")
@click.argument("verdict", type=click.Choice(VERDICTS))
@click.option("--note", help="Why (kept as written).")
@click.option("--by", "by", default=local_login,
              help="Who labels (default: the login name of the user running tillerman).")
@json_option
@ledger_option
@errors_to_exit_codes
def label(subject, verdict, note, by, as_json, ledger_path):
    """Label SUBJECT useful, not_useful or harmful: intent:ID (or a bare in-… id),
    finding:EVENT_ID (a rule's report event) or review:CHECKPOINT_ID (a reviewer's
    answer). A later label of the same subject replaces this one in the account; both
    stay on record.

    Example: tillerman label in-3f2a9c0d1e2b4a5f6c7d not_useful --note "the agent was already doing it"
    """
    from tillerman.controller.core.labeling import label as record_label

    with open_ledger(ledger_path, must_exist=True) as ledger:
        event = record_label(ledger, subject, verdict, note=note, by=by)
    if as_json:
        print_json(event)
    else:
        print_line(f"labeled {event.subject} {event.verdict} (by {event.by})")
    report_anchor(ledger)
