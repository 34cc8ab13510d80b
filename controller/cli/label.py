"""``tillerman label``: the owner's verdict on an intervention, a rule's finding or a
reviewer's answer (``tillerman.controller.core.labeling``), what rules and reviewers are
measured against in ``tillerman report``, ``rules diff``, ``rules promote`` and ``review
try --labeled``. A label grants nothing. ``tillerman labels`` lists them."""

from __future__ import annotations

import click

from tillerman.controller.cli.output import (
    errors_to_exit_codes,
    json_option,
    print_json,
    print_line,
    print_table,
)
from tillerman.controller.cli.shared import ledger_option, open_intact_ledger, open_ledger, report_anchor
from tillerman.controller.core.timefmt import iso, shorten
from tillerman.ledger.labels import SUBJECT_KINDS, VERDICTS, Label, fold_labels, parse_subject
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


@click.command("labels")
@click.option("--verdict", type=click.Choice(VERDICTS), help="Only labels with this verdict.")
@click.option("--kind", type=click.Choice(SUBJECT_KINDS), help="Only labels of intents, findings or reviews.")
@click.option("--by", "by", help="Only labels given by this person.")
@click.option("--history", is_flag=True, help="Every label given, the replaced ones too (marked), oldest first.")
@json_option
@ledger_option
@errors_to_exit_codes
def labels(verdict, kind, by, history, as_json, ledger_path):
    """List the owner's labels: the one standing on each subject, the latest first
    (--history: every label given, oldest first, each replaced one marked).

    Example: tillerman labels --verdict harmful --json
    """
    with open_intact_ledger(ledger_path) as ledger:
        folded = fold_labels(ledger.history(kinds=("owner_labeled",)))
    standing = folded.all_current()
    shown = ([given for label in standing for given in folded.history(label.subject)] if history
             else list(reversed(standing)))
    if history:
        shown.sort(key=lambda given: given.seq)
    standing_ids = {label.event_id for label in standing}
    rows = [_row(given, given.event_id in standing_ids) for given in shown
            if (verdict is None or given.verdict == verdict) and (by is None or given.by == by)
            and (kind is None or parse_subject(given.subject)[0] == kind)]
    if as_json:
        print_json(rows)
        return
    columns = ("at", "subject", "verdict", "by", "note") + (("standing",) if history else ())
    shown_rows = [row | {"note": shorten(row["note"] or "", 60) or None,
                         "standing": "yes" if row["standing"] else "replaced"} for row in rows]
    print_table(shown_rows, columns, "no labels" + (" match" if verdict or kind or by else
                                                    "; give one with: tillerman label SUBJECT VERDICT"))


def _row(given: Label, standing: bool) -> dict:
    return {"at": iso(given.at), "subject": given.subject, "verdict": given.verdict, "by": given.by,
            "note": given.note, "thread": given.thread, "seq": given.seq, "standing": standing}
