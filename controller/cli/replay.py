"""``tillerman replay``: recorded sessions through the rules and policy on a virtual
clock, and ``replay --check`` of a ledger's decisions. Loaded only when the command
runs (``tillerman.controller.cli.main``), so other commands never import the replay pipeline."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

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
    print_table,
)
from tillerman.controller.cli.shared import CONFIG_HELP, load_rules_or_fail, open_ledger
from tillerman.controller.core.printable import printable
from tillerman.controller.core.render import goal_text
from tillerman.controller.core.timefmt import iso
from tillerman.controller.replay.parallel import ReplaySettings, replay_files
from tillerman.controller.replay.replayer import FORMATS, ReplayError, collect_files
from tillerman.ledger.location import shown


@click.command("replay")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto", show_default=True,
              help="Input format; auto detects it per file.")
@click.option("--ledger", "ledger_path", type=PathType(dir_okay=False),
              help="Record into this ledger file (default: in memory, keeping only the chain head;"
                   " $TILLERMAN_LEDGER is ignored).")
@click.option("--rules", "rules_path", type=PathType(dir_okay=False, exists=True), help="Rule file (TOML).")
@click.option("--config", "config_path", type=PathType(dir_okay=False, exists=True), help=CONFIG_HELP)
@click.option("--retain-payloads", is_flag=True, help="Keep prompt and tool text instead of digests.")
@click.option("--jobs", type=click.IntRange(min=1), metavar="N",
              help="Replay on N processes, one thread family (a rollout and its forks, a transcript and its"
                   " subagents) per task; with one family, a second process reads and parses each large file"
                   " while this one folds it; 1 replays in this process. The result is the same for any N."
                   "  [default: the number of cores]")
@click.option("--check", is_flag=True,
              help="Decide again every decision the ledger PATH records, with the rule set then in force;"
                   " exit 1 at the first that differs.")
@click.option("--review", is_flag=True,
              help="Ask the configured reviewers at checkpoints the inputs did not record (default: hold them,"
                   " with no call, so the replay is deterministic).")
@json_option
@click.argument("paths", nargs=-1, required=True)
@errors_to_exit_codes
def replay_cmd(fmt, ledger_path, rules_path, config_path, retain_payloads, jobs, check, review, as_json, paths):
    """Run recorded sessions through the normalizer, rules and policy on a virtual
    clock. Dispatches nothing; never touches a configured ledger.

    With --check LEDGER: decide every recorded decision again, at its seq and time,
    with this version's policy and the rule set the ledger recorded; exit 0 when all
    agree, 1 at the first that differs, 2 when the ledger cannot be checked.

    Example: tillerman replay --json ~/.codex/sessions/2026/11/30/
    """
    if check:
        given = [name for name, value in (("--format", fmt != "auto"), ("--ledger", ledger_path),
                                          ("--rules", rules_path), ("--config", config_path),
                                          ("--retain-payloads", retain_payloads), ("--jobs", jobs),
                                          ("--review", review)) if value]
        if given or len(paths) != 1:
            raise Fail("--check takes one ledger and uses the rule sets it recorded: give only"
                       f" --check [--json] LEDGER{' (drop ' + ', '.join(given) + ')' if given else ''}")
        _check(paths[0], as_json)
        return
    effective = load_rules_or_fail(rules_path, config_path)
    try:
        found = [str(p) for p in collect_files(list(paths))]  # before a --ledger is created
    except ReplayError as exc:
        raise Fail(str(exc)) from exc
    ledger = open_ledger(ledger_path) if ledger_path is not None else None
    progress = _Progress() if sys.stderr.isatty() and not as_json else None
    settings = ReplaySettings(ruleset=effective.ruleset, fmt=fmt, patterns=effective.patterns,
                              retain_payloads=retain_payloads, reviewers=effective.reviewers, review=review)
    try:
        summary = replay_files(found, settings, jobs=jobs or os.cpu_count() or 1, ledger=ledger, progress=progress)
    except ReplayError as exc:
        raise Fail(str(exc), exc.exit_code) from exc
    finally:
        if progress:
            progress.done()
        if ledger is not None:
            ledger.close()
    if ledger_path is not None:
        summary.ledger = shown(ledger_path)
    if as_json:
        print_json(summary)
        return
    print_table([msgspec.structs.asdict(f) for f in summary.files],
                ("path", "format", "records", "events", "quarantined", "threads", "turns",
                 "interrupted_turns", "unclosed_turns"), "no files")
    click.echo()
    print_line(f"{summary.events} events, {summary.decisions} decisions ({summary.decisions_digest[:19]}…),"
               f" {summary.reports} reports")
    if summary.intents:
        print_line("intents: " + ", ".join(f"{k} {v}" for k, v in summary.intents.items()))
    for item in summary.overdue:
        print_line(f"overdue: {item['intent']} on {item['thread']} ({item['state']}): {item['why']}")
    for kind, said in (summary.reviews or {}).items():
        print_line(f"reviews at {kind}: " + ", ".join(f"{k} {v}" for k, v in said.items()))
    for thread in summary.goals or ():
        triggers = ", ".join(f"{k} {v}" for k, v in thread["recent_turn_triggers"].items()) or "none known"
        print_line(f"goal: thread {thread['thread']}: {' -> '.join(thread['goal_statuses'])}"
                   f" (now {goal_text(thread['goal'])}); recent turns by trigger: {triggers}")


def _check(path: str, as_json: bool) -> None:
    from tillerman.controller.replay.recheck import (  # the ledger's rule sets, only for --check
        CannotCheck,
        check_ledger,
    )

    progress = _Progress(unit=lambda seq: f"seq {seq}") if sys.stderr.isatty() and not as_json else None
    try:
        result = check_ledger(path, progress=(lambda seq, last: progress(path, seq, last)) if progress else None)
    except CannotCheck as exc:
        raise Fail(str(exc), exc.exit_code) from exc
    finally:
        if progress:
            progress.done()
    if as_json:
        print_json(result)
    else:
        for note in result.notes:
            print_line(f"note: {note}")
        skipped = f"; {result.shadow_decisions} shadow decisions not decided again" if result.shadow_decisions else ""
        diff = result.first_difference
        if diff is None:
            click.echo(f"ok: {result.decisions} decisions decided again, all agree ({result.entries} entries,"
                       f" {result.rulesets} rule sets{skipped})")
        else:
            print_line(f"DIFFERS at seq {diff.seq}: intent {diff.intent} on thread {diff.thread} at {iso(diff.at)}:"
                       f" recorded {diff.recorded.action} ({diff.recorded.reason}), decided again"
                       f" {diff.redecided.action} ({diff.redecided.reason}) under rule set {diff.ruleset_digest};"
                       f" the {result.decisions - 1} decisions before it agree")
    if not result.ok:
        sys.exit(EXIT_CHECK_FAILED)


class _Progress:
    """A one-line progress meter on stderr for long replays on a terminal."""

    def __init__(self, unit: Callable[[int], str] = lambda done: f"{done >> 20} MiB") -> None:
        self.last = 0.0
        self.path: str | None = None
        self.unit = unit

    def __call__(self, path: str, done: int, total: int) -> None:
        now = time.monotonic()
        # At most five draws a second, but a file's name as soon as it is reached: with
        # workers, a small file may be read from start to end between two draws.
        if now - self.last >= 0.2 or done >= total or path != self.path:
            self.last, self.path = now, path
            pct = 100 * done // total if total else 100
            click.echo(f"\r{pct:3d}% {self.unit(done)}  {printable(path[-60:])}", err=True, nl=False)

    def done(self) -> None:
        click.echo("\r\033[K", err=True, nl=False)
