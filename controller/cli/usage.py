"""``tillerman usage``: what the sessions spent, by day, session, model or turn, from a
ledger or straight from the agents' folders (docs/usage/usage-and-budgets.md).

The I/O edge: reading the ledger or the files, printing. The rows are
``tillerman.controller.report.usage``'s; the files are read by
``tillerman.monitor.usage_files`` (no ledger is written). Exit codes: 0 done, 2 a
missing path, a bad date or zone, an unreadable ledger or a bad price table.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import itertools
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import click

from tillerman.controller.cli.output import Fail, PathType, errors_to_exit_codes, json_option, print_json, print_line
from tillerman.controller.cli.prices import PRICES_CONFIG_HELP
from tillerman.controller.cli.prices import price_table  # as `report` reads it
from tillerman.controller.cli.shared import LEDGER_HELP, open_intact_ledger
from tillerman.controller.report.usage import BY_CHOICES, UsageReport
from tillerman.ledger.events import Envelope

_DATE = re.compile(r"\A([0-9]{4})-?([0-9]{2})-?([0-9]{2})\Z")  # 2026-12-01 or ccusage's 20261201
#: Processes reading files, one a core: reading is most of the work (on 2 cores, two
#: readers took a 113 MB folder from 1.6-2.1 s to 1.3-1.8 s).
MAX_JOBS = 4
PROGRESS_FROM = 50  # files: fewer are read before anyone waits
NOTES_SHOWN = 5  # mismatches and quarantined lines named in the text output; --json has them all
GC_THRESHOLD = (50_000, 50, 100)  # collector thresholds while reporting (defaults: 700, 10, 10)


def _date(ctx, param, value: str | None) -> str | None:
    """A day as ``YYYY-MM-DD`` (given so, or as ccusage's ``YYYYMMDD``)."""
    if value is None:
        return None
    found = _DATE.match(value.strip())
    try:
        return dt.date(*map(int, found.groups())).isoformat() if found else dt.date.fromisoformat("x")
    except ValueError:
        raise Fail(f"{param.opts[0]} {value[:40]!r} is not a date; give YYYY-MM-DD (or YYYYMMDD)") from None


def _zone(ctx, param, value: str | None) -> dt.tzinfo | None:
    """``--timezone``: an IANA zone name (``Europe/Berlin``, ``UTC``); None: the system's."""
    if value is None:
        return None
    from zoneinfo import ZoneInfo

    try:
        return ZoneInfo(value)
    except (ValueError, OSError, KeyError):  # an unknown name, or one that is no zone file's
        raise Fail(f"--timezone {value[:40]!r} is not a time zone; give an IANA name such as UTC or"
                   " Europe/Berlin") from None


@click.command("usage")
@click.argument("paths", nargs=-1, type=PathType())
@click.option("--ledger", "ledger_path", type=PathType(dir_okay=False),
              help=LEDGER_HELP + " Read when no PATH is given; never created.")
@click.option("--by", "by", type=click.Choice(BY_CHOICES), default="day", show_default=True,
              help="Group by day (in --timezone), session (thread), model, or turn.")
@click.option("--since", callback=_date, help="Only responses on or after this day (YYYY-MM-DD, in --timezone).")
@click.option("--until", callback=_date, help="Only responses on or before this day (YYYY-MM-DD, in --timezone).")
@click.option("--timezone", "zone", callback=_zone,
              help="The zone days are counted in (an IANA name; default: the system's, as ccusage).")
@click.option("--breakdown", is_flag=True, help="Split each row by model.")
@click.option("--config", "config_path", type=PathType(dir_okay=False, exists=True), help=PRICES_CONFIG_HELP)
@json_option
@errors_to_exit_codes
def usage(paths, ledger_path, by, since, until, zone, breakdown, config_path, as_json):
    """What the sessions spent: tokens (cached input inside input, reasoning inside
    output) and cost in USD, by day, session, model or turn. Read from the ledger, or
    straight from Codex rollouts and Claude Code transcripts (PATH: files, or folders
    searched for *.jsonl such as ~/.codex/sessions and ~/.claude/projects) without
    writing a ledger. Each response is counted once and priced on its own; a row with
    a response of no known price has no cost (null, with the reasons), never 0. The
    agents' own cost figures, the places where the sum and the agents' running
    counters disagree, and the lines refused as bad usage are listed after the rows.

    Example: tillerman usage ~/.codex/sessions ~/.claude/projects --by session --since 2026-12-01 --json
    """
    if paths and ledger_path is not None:
        raise Fail("give --ledger PATH or session files and folders, not both")
    if since and until and since > until:
        raise Fail(f"--since {since} is after --until {until}; nothing could match")
    with _collector_relaxed():
        if paths:
            # The readers start first, so the price table loads while they read.
            envelopes = _file_envelopes(paths)
            first = next(envelopes, None)
            report = UsageReport(price_table(config_path), by=by, tz=zone, since=since, until=until,
                                 all_quarantines=True)
            report.add_all(itertools.chain((first,) if first is not None else (), envelopes))
        else:
            report = UsageReport(price_table(config_path), by=by, tz=zone, since=since, until=until)
            # a person who runs no daemon reads the agents' own folders instead
            with open_intact_ledger(ledger_path, or_else="give the agents' folders: tillerman usage"
                                    " ~/.codex/sessions ~/.claude/projects") as ledger:
                report.add_all(entry.envelope for entry in ledger.read())
        shown = {"by": by, "timezone": _zone_name(zone), **report.as_json(breakdown=breakdown)}
    if as_json:
        print_json(shown)
    else:
        _print_text(shown, breakdown=breakdown)


@contextlib.contextmanager
def _collector_relaxed() -> Iterator[None]:
    """The report keeps every counted response's dedup entry and makes almost no cyclic
    garbage, yet the collector's default thresholds walked those objects again and again:
    a fifth of the fold and of the rows' summing on a 100 MB folder. What lives is frozen
    out of its sight and it runs less often, as replay does (the forked readers inherit it)."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _file_envelopes(paths: tuple[str, ...]) -> Iterator[Envelope]:
    from tillerman.monitor.usage_files import UsageFilesError, read_usage_files, usage_file_paths

    try:
        files = usage_file_paths(paths)
    except UsageFilesError as exc:
        raise Fail(str(exc)) from None
    jobs = min(len(os.sched_getaffinity(0)), MAX_JOBS)
    shown = sys.stderr.isatty() and len(files) > PROGRESS_FROM  # on a terminal only, and a long read
    for found in read_usage_files(files, progress=progress if shown else None, jobs=jobs):
        if not isinstance(found, str):  # a file of another format: no usage to read
            yield from found.envelopes


def progress(done: int, total: int) -> None:
    """One stderr line, rewritten as files are read, ended with the last."""
    if done % 25 == 0 or done == total:
        click.echo(f"\rreading usage: {done}/{total} files", err=True, nl=done == total)


def _zone_name(zone: dt.tzinfo | None) -> str:
    if zone is not None:
        return str(zone)
    return dt.datetime.now().astimezone().tzname() or "local"


# -- text --------------------------------------------------------------------------------

_FIGURES = (("input", "INPUT"), ("cached_input", "CACHED"), ("cache_write", "CACHE WRITE"), ("output", "OUTPUT"),
            ("reasoning", "REASONING"), ("total", "TOTAL"))


def _print_text(shown: dict[str, Any], *, breakdown: bool) -> None:
    by = shown["by"]
    keys = {"day": ("day",), "session": ("session", "source"), "model": ("model",), "turn": ("session", "turn")}[by]
    header = [k.upper() for k in keys] + ([] if by == "model" else ["MODELS"]) + [h for _, h in _FIGURES] + ["COST"]
    lines = []
    for row in shown["rows"]:
        lines.append([_cell(row[k]) for k in keys] + ([] if by == "model" else [", ".join(row["models"])])
                     + _figures(row))
        if breakdown:
            for part in row["breakdown"]:
                lines.append(["  " + _cell(part["model"])] + [""] * (len(keys) - (by == "model"))
                             + _figures(part))
    if not lines:
        print_line(f"No usage{_span(shown)}.")
    else:
        lines.append(["Total"] + [""] * (len(header) - len(_FIGURES) - 2) + _figures(shown["totals"]))
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
        numeric = len(header) - len(_FIGURES) - 1
        for line in [header, *lines]:
            print_line("  ".join(cell.rjust(w) if i >= numeric else cell.ljust(w)
                                 for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip())
    _print_notes(shown)


def _figures(row: dict[str, Any]) -> list[str]:
    return [_number(row[name]) for name, _ in _FIGURES] + [_cost(row)]


def _number(value: int | None) -> str:
    return "out of range" if value is None else f"{value:,}"


def _cost(row: dict[str, Any]) -> str:
    if row["cost_usd"] is None:
        return "no price"
    return f"${row['cost_usd']:,.2f}"


def _cell(value: Any) -> str:
    return "(none)" if value is None else str(value)


def _span(shown: dict[str, Any]) -> str:
    if not shown["since"] and not shown["until"]:
        return ""
    return f" from {shown['since'] or 'the start'} to {shown['until'] or 'now'} ({shown['timezone']})"


def _print_notes(shown: dict[str, Any]) -> None:
    prices = shown["prices"]
    print_line(f"Prices: table dated {prices['date']} ({prices['source']}); days in {shown['timezone']}.")
    missing = shown["totals"]["cost_missing"]
    if missing:
        named = ", ".join(f"{m['model'] or '(no model)'} ({m['reason']})" for m in missing)
        print_line(f"No price for: {named}; their rows have no cost.")
    for vendor in shown["vendor"]:
        if vendor["cost_usd"] is not None:
            ours = "no price" if vendor["our_cost_usd"] is None else f"${vendor['our_cost_usd']:,.4f}"
            print_line(f"Vendor: {vendor['session']} ({vendor['source_kind']}) says ${vendor['cost_usd']:,.4f};"
                       f" ours {ours}.")
    _listed("Mismatch", shown["mismatches"], lambda m: (
        f"{_cell(m['thread_id'])} {m['field']}: sum {m['expected']:,}, counter {m['counter']:,}"
        f" ({m['difference']:+,}{', ' + m['cause'] if m['cause'] else ''}) at {m['source']}"
        f"{'' if m['offset'] is None else ' offset ' + str(m['offset'])}"))
    _listed("Quarantined", shown["quarantined"], lambda q: f"{q['file']} offset {q['offset']}: {q['reason']}")


def _listed(label: str, items: list[dict[str, Any]], say) -> None:
    if not items:
        return
    print_line(f"{label}: {len(items)}{' (first ' + str(NOTES_SHOWN) + ')' if len(items) > NOTES_SHOWN else ''}")
    for item in items[:NOTES_SHOWN]:
        print_line(f"  {say(item)}")
