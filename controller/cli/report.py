"""``tillerman report`` and ``tillerman timeline``: the account and the timeline of a
ledger, or of recorded sessions replayed in memory first (as ``tillerman replay`` does).

The I/O edge: reading the entries, printing, writing files. The figures are
``tillerman.controller.report.account``'s, the rows ``fold``'s, the database
``db``'s and the page ``timeline``'s (all in ``tillerman.controller.report``).
"""

from __future__ import annotations

from collections.abc import Iterable

import click

from tillerman.controller.cli.output import (
    Fail,
    PathType,
    errors_to_exit_codes,
    json_option,
    print_json,
    print_line,
)
from tillerman.controller.cli.prices import price_table
from tillerman.controller.cli.shared import CONFIG_HELP, load_rules_or_fail, open_intact_ledger
from tillerman.controller.core.timefmt import iso, parse_time
from tillerman.controller.replay.parallel import ReplaySettings, replay_files
from tillerman.controller.replay.replayer import ReplayError, collect_files
from tillerman.controller.report.account import (
    BY_CHOICES,
    DEFAULT_BY,
    NOT_KNOWN,
    Account,
    Delays,
    Figure,
    Group,
    Spend,
    account,
)
from tillerman.controller.report.fold import Facts, fold_facts
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.paths import check_output, replace_file


def _time(ctx, param, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _source_options(fn):
    for option in reversed((
        click.option("--ledger", "ledger_path", type=PathType(dir_okay=False),
                     help="The ledger to read (read-only; default: $TILLERMAN_LEDGER, else the default ledger)."),
        click.option("--rules", "rules_path", type=PathType(dir_okay=False, exists=True),
                     help="With SESSION: the rule file the replay decides with."),
        click.option("--config", "config_path", type=PathType(dir_okay=False, exists=True),
                     help="With SESSION: " + CONFIG_HELP + " With --ledger: only its [prices.\"MODEL\"]"
                          " tables, which override the price table (as for `tillerman usage`)."),
        click.option("--since", callback=_time, help="Only what began at or after this time (ISO 8601)."),
        click.argument("sessions", nargs=-1),
    )):
        fn = option(fn)
    return fn


def _force_option(fn):
    return click.option("--force", is_flag=True,
                        help="Replace an existing ordinary file too (never a SQLite database that is not a"
                             " report database, a ledger or its files, a FIFO, a device or a directory).")(fn)


def load_facts(ledger_path: str | None, sessions: Iterable[str], rules_path: str | None,
               config_path: str | None) -> Facts:
    """The facts of the ledger, or of the sessions replayed into a ledger in memory;
    usage priced with the price table in force and the config file's overrides, as
    ``tillerman usage`` prices it (read once the options are known to fit)."""
    sessions = list(sessions)
    if sessions and ledger_path is not None:
        raise Fail("give --ledger PATH or recorded SESSION files, not both")
    if not sessions and rules_path:
        raise Fail("--rules applies to SESSION files only; a ledger records its own rule sets")
    prices = price_table(config_path)
    if not sessions:
        with open_intact_ledger(ledger_path) as ledger:
            return fold_facts(ledger.read(), prices)
    effective = load_rules_or_fail(rules_path, config_path)
    memory = MemoryRecorder()
    try:
        found = [str(p) for p in collect_files(sessions)]
        replay_files(found, ReplaySettings(ruleset=effective.ruleset, patterns=effective.patterns), jobs=1,
                     ledger=memory)
    except ReplayError as exc:
        raise Fail(str(exc), exc.exit_code) from exc
    return fold_facts(memory.read(), prices)


@click.command("report")
@_source_options
@click.option("--until", callback=_time, help="Only what began before this time (ISO 8601).")
@click.option("--by", "by", type=click.Choice(BY_CHOICES),
              help="Group the intent figures by this label (default: by mode and task class).")
@click.option("--db", "db_path", type=PathType(dir_okay=False),
              help="Also write the account and its rows to this SQLite file: a new one, or a report database"
                   " tillerman wrote there before (replaced whole).")
@_force_option
@json_option
@errors_to_exit_codes
def report(ledger_path, rules_path, config_path, since, sessions, until, by, db_path, force, as_json):
    """The supervision account: what was proposed, dispatched, held and rejected, how
    precise and how fast delivery was, what was lost or duplicated, what work an
    interrupt cancelled, how often a person was called, what the reviewer cost, and how
    stalls ended. Every figure says how it was computed and from how many events.

    Example: tillerman report --ledger ledger.sqlite3 --by task_class --db account.db
    """
    db_target = None
    if db_path is not None:  # refused before any work is done
        from tillerman.controller.report.db import is_report_db, write_db  # sqlite-utils only when asked for

        db_target = check_output(db_path, "--db", ledgers=_ledgers(ledger_path), ours=is_report_db, force=force)
    facts = load_facts(ledger_path, sessions, rules_path, config_path)
    result = account(facts, since=since, until=until, by=(by,) if by else DEFAULT_BY)
    if db_target is not None:
        replace_file(db_target, lambda new: write_db(new, facts, result))
    if as_json:
        print_json(result)
    else:
        for line in render_text(result):
            print_line(line)
    if not result.delivery.ok:
        print_line(f"WARNING: {_delivery_alarm(result)}", err=True)


@click.command("timeline")
@_source_options
@click.option("--thread", "thread_id", help="Draw only this thread.")
@click.option("--html", "html_path", type=PathType(dir_okay=False), required=True,
              help="Write the page here (one self-contained HTML file): a new file, or a timeline page"
                   " tillerman wrote there before.")
@_force_option
@errors_to_exit_codes
def timeline_cmd(ledger_path, rules_path, config_path, since, sessions, thread_id, html_path, force):
    """Draw a session as one self-contained HTML page: turns as bands, tool calls
    (critical ones marked), approval waits, queue entries, stalls, and each intent's
    journey through its states, with the evidence on hover or click.

    Example: tillerman timeline --ledger ledger.sqlite3 --html timeline.html
    """
    from tillerman.controller.report.timeline import render_html, timeline_data

    target = check_output(html_path, "--html", ledgers=_ledgers(ledger_path), ours=is_timeline_page, force=force)
    facts = load_facts(ledger_path, sessions, rules_path, config_path)
    data = timeline_data(facts, thread_id=thread_id, since=since)
    if thread_id is not None and not data["threads"]:
        raise Fail(f"thread {thread_id} is not in the ledger; `tillerman status` lists the threads")
    page = render_html(data)
    replace_file(target, lambda new: new.write_text(page, encoding="utf-8"))
    print_line(f"{html_path}: {len(data['turns'])} turns, {len(data['calls'])} tool calls,"
               f" {len(data['intents'])} intents on {len(data['threads'])} threads")


def _ledgers(ledger_path: str | None) -> list[str]:
    """The ledger a command reads, protected from its output by name and by inode (the
    output check also knows any SQLite file and its companions without being told)."""
    return [] if ledger_path is None or "://" in ledger_path else [ledger_path]


def is_timeline_page(head: bytes) -> bool:
    """Whether a file's first bytes are those of a page ``timeline`` wrote."""
    return head.startswith(b"<!doctype html>") and b"<title>tillerman timeline: " in head


# -- text ------------------------------------------------------------------------------


def render_text(result: Account) -> list[str]:
    window = f"{iso(result.since) or 'the beginning'} to {iso(result.until) or 'the end'}"
    lines = [f"Account of {result.events} ledger events ({iso(result.first_at)} .. {iso(result.last_at)});"
             f" window: {window}; grouped by {', '.join(result.by)}"]
    if result.undecodable:
        lines.append(f"note: {result.undecodable} rows this version cannot decode were skipped")
    lines += ["", "Interventions (all)"] + _group_lines(result.totals)
    for group in result.groups:
        lines += ["", "Interventions " + ", ".join(f"{k}={v}" for k, v in group.key.items())]
        lines += _group_lines(group)
    d = result.delivery
    lines += ["", "Delivery"]
    if not d.ok:
        lines.append(f"!! {_delivery_alarm(result)}")
    lines += [_line("duplicate deliveries", d.duplicate_deliveries), _line("silently lost intents", d.silently_lost),
              _line("expired: lost_after_accept", d.lost_after_accept)]
    c = result.cancelled_work
    lines += ["", "Cancelled useful work", _line("interrupted turns", c.interrupted_turns),
              _line("  by an interrupt intent", c.interrupted_by_intent), _line("  seconds they had run", c.turn_seconds),
              _line("commands terminated", c.commands_terminated), _line("  seconds they had run", c.command_seconds),
              _spend_line("interrupted turns spent", c.spend),
              _spend_line("  of them by an interrupt intent", c.spend_by_intent),
              _line("queued messages withdrawn", c.queue_withdrawn)]
    a = result.after_interventions
    lines += ["", f"After interventions (prices dated {result.prices['date']})",
              _spend_line("turns after each intervention", a.spend)]
    lines += [_spend_line(f"  {item.mode} {item.intent_id}", item.spend) for item in a.items]
    o = result.owner_interruptions
    lines += ["", "Owner interruptions", _line("escalations", o.escalations), _line("reports to a person", o.reports)]
    lines += [f"  {rule}: {n}" for rule, n in o.reports_by_rule.items()]
    lines += _budget_lines(result)
    r = result.reviewer
    lines += ["", "Reviewer", _line("calls", r.calls), _line("cost (USD)", r.cost_usd), _line("tokens", r.tokens)]
    if len(r.by_reviewer) > 1:
        lines += [_line(f"  {name} cost (USD)", figures["cost_usd"]) for name, figures in r.by_reviewer.items()]
    lines += [f"  outcome {k}: {v}" for k, v in r.outcomes.items()]
    lines += [f"  disposition {k}: {v}" for k, v in r.dispositions.items()]
    lines += [f"  !! FLAGGED {name}: let {len(probes)} known-bad probe(s) through ({', '.join(probes)})"
              for name, probes in r.flagged.items()]
    s = result.stalls
    lines += ["", "Stalls", _line("detected", s.detected),
              _line("recovered after an intervention", s.recovered_after_intervention),
              _line("recovered alone", s.recovered_alone), _line("abandoned", s.abandoned),
              _line("unresolved at the end", s.unresolved)]
    return lines + _goal_lines(result) + _label_lines(result)


def _label_lines(result: Account) -> list[str]:
    o = result.owner_labels
    lines = ["", "Against the owner's labels (tillerman label)", _line("subjects labeled", o.labels)]
    for title, table in (("rule", o.by_rule), ("reviewer", o.by_reviewer), ("mode", o.by_mode)):
        lines += [_line(f"  {title} {name}", p.precision) + f"; {p.labeled} labeled, {p.unlabeled} unlabeled"
                  for name, p in table.items()]
    for name, agreed in o.reviewer_agreement.items():
        lines.append(_line(f"  reviewer {name} agrees with the owner", agreed.agreement))
        lines += [f"    disagrees: {d.checkpoint_id}: {d.disposition}, owner says {d.verdict}"
                  + (f" ({d.note})" if d.note else "") for d in agreed.disagreements]
    return lines


def _goal_lines(result: Account) -> list[str]:
    g = result.goals
    lines = ["", "Goals and turn triggers"]
    lines += [_line(f"turns started by {trigger}" if trigger != NOT_KNOWN else "turns, trigger not known", figure)
              for trigger, figure in g.turns_by_trigger.items()]
    lines += [_line("  of them inferred live", g.inferred_triggers), _line("goal changes", g.goal_changes),
              _line("goals budget-limited", g.budget_limited),
              _line("interrupts whose goal went on", g.interrupts_goal_went_on)]
    if g.interrupts_goal_went_on.value:
        lines.append("  warning: the agent worked on after these interrupts (each ended one turn of an active"
                     " goal); tillerman intent propose --mode stop pauses the goal")
    for thread in g.threads:
        if thread.goal_status is None and not thread.goal_statuses:
            continue  # no goal: its turns are in the counts above
        budget = f", {thread.tokens_used} of {thread.token_budget} tokens" if thread.token_budget is not None else ""
        turns = ", ".join(f"{k} {v}" for k, v in thread.turns_by_trigger.items()) or "none"
        lines.append(f"  thread {thread.thread_id}: goal {' -> '.join(thread.goal_statuses) or thread.goal_status}"
                     f" (now {thread.goal_status}{budget}); turns by trigger: {turns}")
    return lines


def _budget_lines(result: Account) -> list[str]:
    b = result.budgets
    lines = ["", "Budget crossings", _line("crossings", b.crossings)]
    for c in b.items:
        lines.append(f"  {c.rule_id}{' (shadow)' if c.shadow else ''}: {c.measure} per {c.per} ({c.instance}) reached"
                     f" {_number(c.figure)}, limit {_number(c.limit)}; thread {c.thread_id}, turn {c.turn_id};"
                     f" source {c.source_kind}, usage row {c.usage_seq}")
        if c.price_date is not None:
            unpriced = f"; no price for {c.unpriced_models} (a lower bound)" if c.unpriced_models else ""
            lines.append(f"    priced with the table dated {c.price_date}{unpriced}")
        if c.intent_id is not None:
            ended = f"{c.intent_state} ({c.intent_reason})" if c.intent_state else "not in the ledger"
            lines.append(f"    {c.action} {c.intent_id}: {ended}")
        elif c.action is not None:
            lines.append(f"    {c.action}: no intent")
    return lines


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.6g}"


def _group_lines(group: Group) -> list[str]:
    lines = [_line("proposed", group.proposed), _line("dispatched", group.dispatched), _line("held", group.held),
             _line("rejected", group.rejected)]
    lines += [f"  rejected {reason}: {n}" for reason, n in group.rejected_by_reason.items()]
    lines += [f"  expired {reason}: {n}" for reason, n in group.expired_by_reason.items()]
    lines += [_line("in flight", group.in_flight), _line("precision (effect verified)", group.precision_effect),
              _line("precision (acknowledged, nothing to verify)", group.precision_ack)]
    lines += _delay_lines("intent -> ack", group.intent_to_ack) + _delay_lines("ack -> effect", group.ack_to_effect)
    return lines


def _delay_lines(name: str, d: Delays) -> list[str]:
    if d.max.value is None:
        return [f"  {name + ' delay':44} n/a: {d.max.why}"]
    return [f"  {name + ' delay':44} p50 {d.p50.value}s  p95 {d.p95.value}s  max {d.max.value}s"
            f"  ({d.max.how}; {d.max.events} events)"]


def _spend_line(name: str, spend: Spend) -> str:
    if spend.why is not None:
        return f"  {name:44} n/a: {spend.why} ({spend.turns} turns)"
    tokens = spend.tokens
    if spend.cost_usd is not None:
        cost = f"${spend.cost_usd:,.4f}"
    else:
        cost = "cost n/a: no price for " + ", ".join(f"{m['model'] or 'an unnamed model'} ({m['reason']})"
                                                     for m in spend.cost_missing)
    missing = f", {spend.turns_without_usage} without usage" if spend.turns_without_usage else ""
    return (f"  {name:44} {tokens['total']} tokens (input {tokens['input']}, cached {tokens['cached_input']},"
            f" output {tokens['output']}), {cost}  ({spend.turns} turns{missing})")


def _line(name: str, figure: Figure) -> str:
    if figure.value is None:
        return f"  {name:44} n/a: {figure.why} ({figure.how})"
    return f"  {name:44} {figure.value}  ({figure.how}; {figure.events} events)"


def _delivery_alarm(result: Account) -> str:
    d = result.delivery
    parts = []
    if d.duplicate_deliveries.value:
        parts.append(f"{d.duplicate_deliveries.value} DUPLICATE DELIVERIES ({', '.join(d.duplicated_intents)})")
    if d.silently_lost.value:
        parts.append(f"{d.silently_lost.value} SILENTLY LOST INTENTS ({', '.join(d.lost_intents)})")
    return "; ".join(parts) + " — both must be 0; `tillerman intent show ID` has each one's history"
