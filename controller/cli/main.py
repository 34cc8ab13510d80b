"""The ``tillerman`` command line. Each command opens the ledger, calls one library
function and prints; the logic lives in the library modules it names.

Every command pays for what this module imports, so it imports only what the
commands' options need; a command imports the library modules it calls when it runs,
and the commands defined in other modules (``replay``, ``rules``, ``report``, …) are
loaded only when named (``LazyGroup``): ``tillerman hook claude`` or ``tillerman replay``
never import the daemon's WebSocket client, pydantic or the metrics library."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

from tillerman.controller.cli.log_format import LOG_FORMATS
from tillerman.controller.cli.output import (
    EXIT_CHECK_FAILED,
    Fail,
    PathType,
    errors_to_exit_codes,
    json_option,
    print_json,
    print_line,
    print_table,
    warn_undecodable,
)
from tillerman.controller.cli.shared import (
    CONFIG_HELP,
    ledger_file,
    ledger_option,
    ledger_url,
    load_rules_or_fail,
    open_intact_ledger,
    open_ledger,
    parse_now,
    report_anchor,
)
from tillerman.controller.core.timefmt import iso, parse_time, shorten
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import MODES
from tillerman.ledger.location import shown
from tillerman.rules.durations import format_duration, parse_duration
from tillerman.rules.owner import local_login

if TYPE_CHECKING:
    from tillerman.monitor.codex_home import Target
    from tillerman.rules.ruleset import RuleSet

SEQ_MAX = 2**63 - 1  # SQLite's largest integer
def _duration(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_duration(value, name=param.opts[0])
    except ValueError as exc:
        raise Fail(str(exc)) from exc


def _seq(ctx, param, value: str) -> int:
    """A ledger seq: a whole number SQLite can compare (0 to 2**63 - 1)."""
    try:
        seq = int(value)
    except ValueError:
        seq = -1
    if not 0 <= seq <= SEQ_MAX:
        raise Fail(f"{param.opts[0]} {shorten(value)!r} is not a ledger seq; give a whole number from 0 to {SEQ_MAX}")
    return seq


class LazyGroup(click.Group):
    """A group whose commands defined in other modules are imported when named (or
    listed, for ``--help``), not when the group is: ``lazy`` maps a command's name to
    ``module:attribute``."""

    def __init__(self, *args, lazy: dict[str, str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})  # a loaded one is in both

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, attribute = self.lazy[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, lazy={
    "replay": "tillerman.controller.cli.replay:replay_cmd",
    "rules": "tillerman.controller.cli.rules:rules",
    "review": "tillerman.controller.cli.review:review",
    "report": "tillerman.controller.cli.report:report",
    "timeline": "tillerman.controller.cli.report:timeline_cmd",
    "hooks": "tillerman.controller.cli.hooks:hooks",  # Claude Code's hooks: hooks install|uninstall --claude
    "hook": "tillerman.controller.cli.hooks:hook",  # and what they run: hook claude
    "prices": "tillerman.controller.cli.prices:prices",
    "usage": "tillerman.controller.cli.usage:usage",  # the usage account: by day, session, model, turn
    "dashboard": "tillerman.controller.cli.dashboard:dashboard",  # the fleet on a local live web page
    "label": "tillerman.controller.cli.label:label",  # the owner's verdicts rules and reviewers are measured by
    "labels": "tillerman.controller.cli.label:labels",  # and the list of them
})
@click.version_option(package_name="tillerman")
def main() -> None:
    """Supervise AI coding agents: deliver steers, queued messages and interrupts
    exactly once, to the right turn, with evidence, and report what is overdue."""


# -- intents -----------------------------------------------------------------------


@main.group()
def intent() -> None:
    """Propose, inspect and cancel interventions."""


@intent.command("propose")
@click.option("--thread", required=True, help="Thread (session) id to deliver into.")
@click.option("--expected-turn", help="Turn id the intervention is for, or 'active' (required for steer/interrupt;"
                                     " a stop takes none). A steer for 'active' follows the thread's current"
                                     " work: refused for a turn that ended, it goes to a later one (see"
                                     " docs/goals.md).")
@click.option("--mode", type=click.Choice(MODES), required=True,
              help="steer, queue, interrupt (ends one turn), or stop: the thread does no more work until a person"
                   " resumes it (its goal paused, our queued messages withdrawn, its turn interrupted).")
@click.option("--text", required=True, help="What the agent should do, stated precisely (a stop: why).")
@click.option("--ack-deadline", callback=_duration, default="2m", show_default=True)
@click.option("--effect-deadline", callback=_duration, help="Deadline for the effect check (default 10m with --expect/--verify).")
@click.option("--expires", callback=_duration, default="30m", show_default=True)
@click.option("--expect", help="Item predicate that marks the action as started.")
@click.option("--verify", help="Readback command whose exit status proves the effect; it runs in the thread's"
                               " working directory.")
@click.option("--supersedes", help="Intent id this one replaces.")
@click.option("--ack-token", help="steer/queue: acknowledged only when an agent message after ours says this text.")
@click.option("--force", is_flag=True,
              help="interrupt, stop: even while a critical tool runs (the producer needs the interrupt_critical"
                   " grant).")
@click.option("--resume-queue", is_flag=True,
              help="interrupt: resume the server's queue, which the interrupt pauses, once the turn has ended.")
@click.option("--owner", default=local_login,
              help="Who owns it (default: the login name of the user running tillerman).")
@click.option("--task-class", help="A label the account groups by (tillerman report --by task_class);"
                                   " default: unlabeled.")
# -- Claude Code: hook delivery and the wrapper's interrupt ---------------------------
@click.option("--deliver-at", type=click.Choice(["pre_tool_use"]),
              help="steer: before the agent's next tool call (Claude Code's PreToolUse hook denies it with"
                   " the text).")
@click.option("--cancel-queued", is_flag=True,
              help="interrupt: drop the messages still queued behind the turn too (tillerman claude).")
@json_option
@ledger_option
@errors_to_exit_codes
def intent_propose(thread, expected_turn, mode, text, ack_deadline, effect_deadline, expires,
                   expect, verify, supersedes, ack_token, force, resume_queue, owner, task_class,
                   deliver_at, cancel_queued, as_json, ledger_path):
    """Record a new intent (state: proposed); the daemon delivers it.

    A stop (--mode stop) names no turn: it pauses the thread's Codex goal, withdraws our
    queued messages and interrupts whatever turn runs, until a person resumes the thread.

    Example: tillerman intent propose --thread T1 --expected-turn active --mode steer
    --text "Stop the recursive grep; read src/api/ and src/db/ instead."
    """
    from tillerman.controller.core import intent_requests as intent_lib

    with open_ledger(ledger_path) as ledger:
        new = intent_lib.propose(
            ledger, thread_id=thread, expected_turn=expected_turn, mode=mode, text=text,
            ack_deadline=ack_deadline, effect_deadline=effect_deadline, expires=expires,
            expect=expect, verify=verify, supersedes=supersedes, owner=owner,
            ack_token=ack_token, force=force, resume_queue=resume_queue, task_class=task_class,
            deliver_at=deliver_at, cancel_queued=cancel_queued,
        )
        view = intent_lib.intent_view(ledger, new.id)
        if mode == "interrupt":
            _warn_goal_goes_on(ledger, new)
    _print_intent(view, as_json, history=False)
    report_anchor(ledger)


@intent.command("cancel")
@click.argument("intent_id")
@ledger_option
@errors_to_exit_codes
def intent_cancel(intent_id, ledger_path):
    """Expire a still-proposed intent with reason "cancelled".

    Example: tillerman intent cancel in-3f2a9c0d1e2b4a5f6c7d
    """
    from tillerman.controller.core import intent_requests as intent_lib

    with open_ledger(ledger_path, must_exist=True) as ledger:
        try:
            intent_lib.cancel(ledger, intent_id)
        except intent_lib.IntentError as exc:  # not proposed, or the daemon moved it first
            raise Fail(str(exc), EXIT_CHECK_FAILED) from exc
    print_line(f"cancelled {intent_id}")
    report_anchor(ledger)


@intent.command("show")
@click.argument("intent_id")
@json_option
@ledger_option
@errors_to_exit_codes
def intent_show(intent_id, as_json, ledger_path):
    """One intent with its history of state events and their evidence.

    Example: tillerman intent show in-3f2a9c0d1e2b4a5f6c7d --json
    """
    from tillerman.controller.core import intent_requests as intent_lib
    from tillerman.controller.core.render import GOAL_KINDS, intent_goals

    with open_intact_ledger(ledger_path) as ledger:
        view = intent_lib.intent_view(ledger, intent_id)
        goals = intent_goals(view, ledger.history(kinds=GOAL_KINDS), ledger.max_seq())
    _print_intent(view, as_json, history=True, goals=goals)


def _warn_goal_goes_on(ledger, new) -> None:
    """An interrupt on a thread whose Codex goal is active ends one turn, and Codex starts
    the next; resuming the queue afterwards resumes the goal too. Said at the proposal."""
    from tillerman.ledger import projections

    if not projections.load(ledger).snapshot(new.thread_id).goal_active:
        return
    if new.resume_queue:
        click.echo(f"warning: thread {new.thread_id} has an active goal: --resume-queue resumes the goal's"
                   " turns too (the agent works on)", err=True)
    else:
        click.echo(f"warning: thread {new.thread_id} has an active goal: the interrupt ends one turn and the"
                   " goal's next turn follows; --mode stop pauses the goal as well", err=True)


def _print_intent(view, as_json: bool, history: bool, goals: dict | None = None) -> None:
    """``goals``: the thread's Codex goal around the intent (``render.intent_goals``)."""
    from tillerman.controller.core.render import goal_text, intent_json

    data = intent_json(view, history=history) | (goals or {})
    if as_json:
        print_json(data)
        return
    for key in ("id", "thread", "expected_turn", "mode", "state", "owner", "ack_deadline",
                "effect_deadline", "expires_at", "text"):
        if data.get(key) is not None:
            print_line(f"{key:>16}: {data[key]}")
    for key in ("goal_at_proposal", "goal_at_end", "goal_now"):
        if key in data:
            print_line(f"{key:>16}: {goal_text(data[key])}")
    for item in data.get("history", []):
        extra = " ".join(f"{k}={v}" for k, v in item["evidence"].items())
        print_line(f"  {item['at']}  {item['kind']:<10} {item['state']:<16} {item['reason']} {extra}".rstrip())
    if any(item["evidence"].get("goal_active") is True for item in data.get("history", [])):
        print_line("         warning: the thread's goal stayed active: the agent works on (--mode stop pauses it)")


@main.command("intents")
@click.option("--state", type=click.Choice([s.value for s in State]), help="Only intents in this state.")
@json_option
@ledger_option
@errors_to_exit_codes
def intents_list(state, as_json, ledger_path):
    """List intents, newest first.

    Example: tillerman intents --state queued --json
    """
    from tillerman.controller.core.render import intent_json
    from tillerman.ledger import projections

    with open_intact_ledger(ledger_path) as ledger:
        projection = projections.load(ledger)
    warn_undecodable(projection.undecodable)
    views = [v for v in projection.intents.values() if state is None or v.state == state]
    views.sort(key=lambda v: (-v.intent.created_at, v.intent.id))
    rows = [intent_json(v, history=False) for v in views]
    if as_json:
        print_json(rows)
    else:
        print_table(rows, ("id", "thread", "expected_turn", "mode", "state", "owner", "created_at"), "no intents")


# -- the daemon ------------------------------------------------------------------------


def _watchable(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """--watch directories: one that does not exist yet is waited for (a fresh HOME has
    no ~/.claude/projects), one that never can (a file in the way) is refused."""
    if not values:
        return values
    from tillerman.monitor.watch import never_a_folder

    for value in values:
        if (why := never_a_folder(value)) is not None:
            raise Fail(f"--watch {value}: {why}; give a directory")
    return values


@main.command("run")
@click.option("--codex", "url", metavar="URL",
              help="The app-server to attach to: unix://PATH or ws://HOST:PORT (default, and for a bare unix://:"
                   " Codex's shared server on $CODEX_HOME/app-server-control/app-server-control.sock).")
@click.option("--no-codex", is_flag=True, help="Attach to no app-server: follow --watch files only.")
@click.option("--spawn-codex", is_flag=True,
              help="Start a shared app-server (on $CODEX_HOME, default ~/.codex) and attach to it.")
@click.option("--codex-bin", type=PathType(dir_okay=False),
              help="The codex binary --spawn-codex runs (default: $TILLERMAN_CODEX_BIN, else codex on PATH).")
@click.option("--watch", "watch_dirs", multiple=True, type=PathType(file_okay=False), callback=_watchable,
              help="Follow the session files (*.jsonl) under this directory as they grow; repeatable"
                   " (e.g. ~/.codex/sessions, ~/.claude/projects). One that does not exist yet is followed"
                   " once it appears. Works with or without an app-server.")
@click.option("--allow-remote", is_flag=True,
              help="Allow --codex ws://HOST on another machine (its WebSocket has no authentication by default).")
@click.option("--client-name",
              help="clientInfo.name to initialize with (default: codex-tui on Codex's shared server, so the"
                   " user's threads are not branded; tillerman elsewhere).")
@ledger_option
@click.option("--config", "config_path", type=PathType(dir_okay=False, exists=True), help=CONFIG_HELP)
@click.option("--rules", "rules_path", type=PathType(dir_okay=False, exists=True), help="Rule file (TOML).")
@click.option("--trace", "trace_path", type=PathType(dir_okay=False), help="Record the JSON-RPC exchanged here.")
@click.option("--retain-payloads", is_flag=True, help="Keep prompt and tool text in the ledger and trace.")
@click.option("--dry-run", is_flag=True, help="Decide and record, never dispatch (shadow mode).")
@click.option("--on-overdue", "on_overdue", help="Command run with each overdue intent as JSON on stdin.")
@click.option("-v", "--verbose", is_flag=True, help="Log every decision and delivery step.")
# -- the operator surface: metrics and the log's format
@click.option("--metrics", "metrics_address", metavar="HOST:PORT",
              help="Serve Prometheus metrics on this loopback address, e.g. 127.0.0.1:9464 (GET /metrics).")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              help="json: one JSON object per log line.")
# -- several daemons on one PostgreSQL ledger
@click.option("--lease", "lease", callback=_duration, metavar="DURATION",
              help="A PostgreSQL ledger's thread lease length (default 15s): a thread whose daemon stopped"
                   " renewing is taken over by another daemon after this long.")
@errors_to_exit_codes
def run_cmd(url, no_codex, spawn_codex, codex_bin, watch_dirs, allow_remote, client_name, ledger_path, config_path,
            rules_path, trace_path, retain_payloads, dry_run, on_overdue, verbose, metrics_address, log_format,
            lease):
    """Supervise a live Codex app-server: observe every thread, run the rules, deliver
    intents through the guarded adapter, report what is overdue. Stops on SIGINT/SIGTERM.

    With no --codex it attaches to Codex's shared server, the one your Codex TUI uses
    ($CODEX_HOME/app-server-control/app-server-control.sock); while nothing listens there
    it says how to start it and keeps retrying, following --watch files meanwhile.

    With --watch DIR, session files under DIR are followed as they grow, resumably
    (offsets are kept in the ledger): their threads are observed and reported on,
    never steered.

    Example: tillerman run --watch ~/.codex/sessions
    """
    from tillerman.controller.cli.log_format import configure_logging
    from tillerman.controller.codex.process import AppServer, AppServerStartError, CodexBinaryMissing, find_codex_binary
    from tillerman.monitor.codex_home import OWN_CLIENT_NAME, codex_home

    if no_codex and (url is not None or spawn_codex):
        raise Fail("--no-codex attaches to no app-server: drop --codex and --spawn-codex, or drop --no-codex")
    if no_codex and not watch_dirs:
        raise Fail("nothing to supervise with --no-codex: add --watch DIR (e.g. --watch ~/.codex/sessions)")
    if url is not None and spawn_codex:
        raise Fail("--spawn-codex starts its own app-server: drop --codex, or drop --spawn-codex")
    configure_logging(verbose=verbose, log_format=log_format)
    if codex_bin and not spawn_codex:
        raise Fail("--codex-bin names the binary --spawn-codex runs: give --spawn-codex too")
    _check_run_options(client_name=client_name, on_overdue=on_overdue, trace_path=trace_path)
    target = None if no_codex or spawn_codex else _target(url, client_name, allow_remote)
    database = ledger_url(ledger_path)  # a PostgreSQL ledger; None: a SQLite file
    path = None if database else ledger_file(ledger_path)
    lease = _lease_length(lease, database=bool(database))
    effective = load_rules_or_fail(rules_path, config_path, refuse_unsafe=True)
    server = None
    if spawn_codex:
        home = codex_home()
        try:
            server = AppServer(home, home / "app-server-control" / "tillerman.sock",
                               binary=find_codex_binary(codex_bin), isolated_home=False)
            (home / "app-server-control").mkdir(parents=True, exist_ok=True, mode=0o700)
            server.start()
        except (CodexBinaryMissing, AppServerStartError) as exc:
            raise Fail(str(exc)) from exc
        url = server.url
        click.echo(f"app-server listening: {url}  (point the harness at it: tillerman shim {server.socket_path})")
        target = _target(url, client_name, allow_remote)
    from tillerman.controller.daemon.daemon import (  # the daemon's imports only when it runs
        DaemonOptions,
        run_daemon,
    )
    from tillerman.controller.notify.usage_report import UsageReport
    from tillerman.monitor.appserver_client import JsonlTrace, TraceFileError
    from tillerman.rules.prices import PriceFileError

    if trace_path:
        created = not os.path.lexists(trace_path)
        try:  # refused here in one line, not later inside the daemon's connection task
            JsonlTrace(trace_path).close()
        except TraceFileError as exc:
            raise Fail(str(exc)) from None
        if created:  # only tried: the daemon creates it once the ledger opens, so an error there writes nothing
            os.unlink(trace_path)
    try:  # the built-in usage report prices a day's cost
        usage_report = UsageReport.for_ruleset(effective.ruleset) if effective.usage_report else None
    except PriceFileError as exc:
        raise Fail(str(exc)) from None
    options = DaemonOptions(url=target.url if target else None,
                            client_name=target.client_name if target else OWN_CLIENT_NAME,
                            default_socket=bool(target and target.default_socket),
                            trace=trace_path, retain_payloads=retain_payloads,
                            dry_run=dry_run, on_overdue=on_overdue, rules_path=rules_path,
                            config_path=config_path, patterns=effective.patterns,
                            reviewers=effective.reviewers,
                            watch=tuple(os.path.abspath(d) for d in watch_dirs), sinks=effective.sinks,
                            metrics=serve_metrics(metrics_address, effective.ruleset) if metrics_address else None,
                            lease=lease,
                            usage_report=usage_report, dashboard_url=effective.dashboard_url)
    try:
        if database:  # several daemons may share a database: each thread by lease, no lock file
            # A transaction of this daemon frozen past its lease is ended by the server:
            # its threads are another daemon's by then, and the head row must be free.
            with open_ledger(database, idle_transaction_limit=lease) as recorder:
                run_daemon(recorder, None, effective.ruleset, options)
        else:
            with open_ledger(str(path)) as recorder:
                run_daemon(recorder, str(path), effective.ruleset, options)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.stop()


def _target(url: str | None, client_name: str | None, allow_remote: bool) -> Target:
    """The app-server to attach to. Its WebSocket has no authentication by default, so a
    host on another machine is refused unless ``--allow-remote`` says it is meant."""
    from tillerman.monitor.codex_home import TargetError, resolve_target

    try:
        target = resolve_target(url, client_name)
    except TargetError as exc:
        raise Fail(str(exc)) from exc
    if target.remote:
        risk = (f"{target.url} is not on this machine, and the app-server's WebSocket has no authentication by"
                " default: anyone who can reach it can drive your agents")
        if not allow_remote:
            raise Fail(f"{risk}; give --allow-remote if that is meant, or attach over unix:// or a loopback ws://")
        click.echo(f"warning: {risk}", err=True)
    return target


def serve_metrics(address: str, ruleset: RuleSet):
    """The daemon's metrics, served on ``address`` from now on (``--metrics``), usage
    priced with the table in force for ``ruleset``."""
    from tillerman.controller.daemon.metrics import (  # prometheus-client only when asked for
        Metrics,
        parse_address,
    )
    from tillerman.controller.notify.usage_report import prices_in_force

    try:
        host, port = parse_address(address)
        metrics = Metrics(prices_in_force(ruleset))  # a spoiled imported table: a one-line PriceFileError
        metrics.serve((host, port))
    except ValueError as exc:
        raise Fail(str(exc)) from None
    except OSError as exc:
        raise Fail(f"cannot serve metrics on {address} ({exc.strerror or exc}); pick a free port") from None
    return metrics


def _lease_length(lease: float | None, *, database: bool) -> float | None:
    """The thread lease length of a daemon on a database ledger; a SQLite ledger has one
    daemon, which owns every thread, so no lease."""
    from tillerman.controller.dispatch.leases_keeper import DEFAULT_LEASE, RENEWALS_PER_LEASE

    if not database:
        if lease is not None:
            raise Fail("--lease is for several daemons on a PostgreSQL ledger; a SQLite ledger has one daemon:"
                       " drop --lease, or give --ledger postgresql://…")
        return None
    if lease is not None and lease < RENEWALS_PER_LEASE * 0.1:
        raise Fail(f"--lease {lease:g}s is too short to renew in time; give at least {RENEWALS_PER_LEASE * 0.1:g}s")
    return DEFAULT_LEASE if lease is None else lease


def _check_run_options(*, client_name: str | None, on_overdue: str | None, trace_path: str | None) -> None:
    """What can be checked before the daemon starts, so that a typo is one line, not a
    failure inside the running daemon."""
    for option, value in (("--client-name", client_name), ("--on-overdue", on_overdue), ("--trace", trace_path)):
        if value is not None and not value.strip():
            raise Fail(f"{option} is empty; give a value or leave the option out")
    if trace_path is not None:
        if trace_path.endswith(("/", os.sep)):  # Path() would drop the slash and create a file of that name
            raise Fail(f"--trace {trace_path} names a folder (it ends in /); give the trace file's path")
        folder = Path(trace_path).absolute().parent
        if not folder.is_dir():
            raise Fail(f"cannot write the trace {trace_path}: the folder {folder} does not exist")


@main.command("status")
@json_option
@ledger_option
@errors_to_exit_codes
def status_cmd(as_json, ledger_path):
    """Whether a daemon owns the ledger (pid, since, last heartbeat), the threads it
    sees with their active turns and flags, open intents and overdue counts.

    Example: tillerman status --json
    """
    url = ledger_url(ledger_path)
    path = shown(url) if url else ledger_file(ledger_path, readonly=True)
    with open_intact_ledger(url or str(path)) as recorder:
        from tillerman.controller.cli.status import ledger_status, state_text, stopped_lines, writer_lines

        data = ledger_status(recorder, path, time.time())
    warn_undecodable({int(seq): why for seq, why in data["undecodable"].items()})
    if as_json:
        print_json(data)
        return
    for line in _daemon_lines(data["daemon"]):
        print_line(line)
    for daemon in data["daemons"]:
        state = "renewing" if daemon["alive"] else "stopped renewing"
        print_line(f"daemon {daemon['id']}: host {daemon['host']}, pid {daemon['pid']}, {state},"
                   f" last renewal {daemon['renewed_at']}, lease {format_duration(daemon['lease_seconds'])}")
    for lease in data["leases"]:
        print_line(f"lease: thread {lease['thread']} held by {lease['owner']} (token {lease['token']})"
                   f" {'until' if lease['held'] else 'lapsed at'} {lease['expires_at']}")
    from tillerman.controller.core.render import goal_text

    threads = [dict(t, takes=",".join(t["takes"]) or "-", via=t["via"] or "files", goal=goal_text(t["goal"]),
                    status=state_text(t)) for t in data["threads"]]
    print_table(threads, ("thread", "takes", "via", "active_turn", "status", "goal", "approval_pending",
                          "critical_tool", "external_effect_unknown", "queue"), "no threads")
    if data["unsupervised_threads"]:
        click.echo(f"({data['unsupervised_threads']} of Codex's ephemeral housekeeping threads recorded, not supervised)")
    for thread in data["threads"]:
        for line in stopped_lines(thread) + writer_lines(thread):
            print_line(line)
    click.echo(f"open intents: {data['open_intents']}, overdue: {data['overdue']}")
    for name, probes in data["flagged_reviewers"].items():
        print_line(f"reviewer {name} FLAGGED: let {len(probes)} known-bad calibration probe(s) through"
                   f" ({', '.join(probes)}); check its command and prompt before trusting its answers")


def _daemon_lines(daemon: dict) -> list[str]:
    from tillerman.controller.cli.status import version_warning

    if not daemon["running"]:
        return ["daemon: not running"]
    lines = [f"daemon: pid {daemon['pid']} since {daemon['since']}, heartbeat {daemon['heartbeat']}"]
    codex = daemon.get("codex")
    if codex and codex["connected"]:
        lines.append(f"codex: connected to {codex['url']} since {codex['since']} as {codex['client_name']};"
                     f" server {codex['server_version'] or 'version unknown'}")
        first = {True: "tillerman initialized it first: new threads are branded with its name",
                 False: "another client initialized it first",
                 None: "tillerman used the same name, so threads keep that originator"}[codex["initialized_first"]]
        lines.append(f"codex: threads' originator {codex['originator'] or 'unknown'} ({first})")
        if warning := version_warning(codex):
            lines.append(warning)
    elif codex:
        lines.append(f"codex: connecting to {codex['url']} since {codex['since']}"
                     + (f" (last try: {codex['error']})" if codex["error"] else ""))
    if outage := daemon.get("ledger_outage"):
        lines.append(f"ledger: unreachable since {outage['since']}" + (
            f", reachable again at {outage['until']}" if outage["until"] else "") + f" ({outage['error']})")
    waiting = daemon.get("watch_waiting") or []
    if following := [d for d in daemon.get("watch") or [] if d not in waiting]:
        # A hook spool's sessions take queued messages and pre_tool_use steers: TAKES says
        # what each thread takes; this line must not contradict it.
        lines.append(f"files: following {', '.join(following)} (what a thread there can be sent: its TAKES;"
                     " one only read from files takes nothing)")
    if waiting:
        lines.append(f"files: waiting for {', '.join(waiting)} to appear, then following it")
    return lines


@main.command("shim", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("socket_path", type=PathType(dir_okay=False))
@click.argument("ignored", nargs=-1, type=click.UNPROCESSED)
def shim_cmd(socket_path, ignored):
    """Stand in for `codex app-server` for a harness that can only spawn a stdio server:
    stdin JSON lines become WebSocket frames to the shared server, and back. Flags the
    harness passes (app-server, -c …) are ignored; set them on the shared server.

    Example: tillerman shim ~/.codex/app-server-control/tillerman.sock
    """
    import anyio

    from tillerman.controller.codex.shim import run_shim

    try:
        anyio.run(run_shim, socket_path)
    except OSError as exc:
        raise Fail(f"cannot connect to {socket_path}: {exc}; is the shared app-server running?") from exc


# -- overdue -----------------------------------------------------------------------


@main.group("overdue", invoke_without_command=True)
@click.option("--now", "now_text", help="Evaluate at this ISO-8601 time instead of now.")
@click.option("--check", is_flag=True, help="Exit 1 when anything is overdue.")
@json_option
@ledger_option
@click.pass_context
@errors_to_exit_codes
def overdue_cmd(ctx, now_text, check, as_json, ledger_path):
    """Intents past their acknowledgement or effect deadline: thread, expected turn,
    state, age, owner and why. One whose notice a person resolved (overdue resolve) is
    not listed, until it misses a later deadline.

    Example: tillerman overdue --check --json
    """
    if ctx.invoked_subcommand is not None:
        # `overdue --ledger L resolve ID` means that ledger: handed down, never dropped
        if now_text is not None or check:
            raise Fail("--now and --check are for the listing; give them without a subcommand")
        ctx.obj = {"ledger_path": ledger_path, "as_json": as_json}
        return
    from tillerman.controller.core.notice_resolution import read_resolutions
    from tillerman.controller.core.overdue import overdue as find_overdue
    from tillerman.controller.core.render import overdue_json
    from tillerman.ledger import projections

    now = parse_now(now_text)
    with open_intact_ledger(ledger_path) as ledger:
        projection = projections.load(ledger)
        resolved = {subject: r.at for subject, r in read_resolutions(ledger).items()}
    warn_undecodable(projection.undecodable)
    found = find_overdue(projection, now, resolved)
    rows = [overdue_json(o) for o in found]
    if as_json:
        print_json(rows)
    else:
        print_table(
            [dict(r, age=format_duration(r["age_seconds"], parts=2),
                  late=format_duration(r["overdue_seconds"], parts=2)) for r in rows],
            ("intent", "thread", "expected_turn", "state", "deadline", "late", "age", "owner", "why"),
            "nothing overdue",
        )
    if check and found:
        sys.exit(EXIT_CHECK_FAILED)


@overdue_cmd.command("resolve")
@click.argument("intent_id")
@click.option("--note", help="Why it needs no more attention (kept with the resolution).")
@click.option("--by", default=local_login, show_default="the login name", help="Who resolves it.")
@json_option
@ledger_option
@click.pass_obj
@errors_to_exit_codes
def overdue_resolve(given, intent_id, note, by, as_json, ledger_path):
    """Resolve an overdue intent's notice: it is no longer listed as overdue, and the
    [[notify]] sinks are told it is resolved once and hear of it no more (a deadline it
    misses later is a new notice). The intent itself is untouched.

    Example: tillerman overdue resolve in-3f2a9c0d1e2b4a5f6c7d --note "handled by hand"
    """
    from tillerman.controller.core import notice_resolution

    given = given or {}
    if ledger_path is not None and given.get("ledger_path") not in (None, ledger_path):
        raise Fail("--ledger is given twice, naming two ledgers; give it once")
    ledger_path = ledger_path or given.get("ledger_path")
    as_json = as_json or given.get("as_json", False)
    with open_ledger(ledger_path, must_exist=True) as ledger:
        try:
            resolution = notice_resolution.resolve(ledger, intent_id, by=by, note=note, now=time.time())
        except notice_resolution.NoticeError as exc:  # not overdue, or resolved already
            raise Fail(str(exc), EXIT_CHECK_FAILED) from exc
    if as_json:
        print_json({"subject": resolution.subject, "by": resolution.by, "at": iso(resolution.at),
                    "note": resolution.note})
    else:
        print_line(f"resolved {resolution.subject}")
    report_anchor(ledger)


# -- ledger ------------------------------------------------------------------------


@main.group()
def ledger() -> None:
    """Check, export, archive and accept a shortened ledger."""


@ledger.command("verify")
@json_option
@ledger_option
@errors_to_exit_codes
def ledger_verify(as_json, ledger_path):
    """Check the hash chain, the sequence, the head anchor, the saved fold and SQLite's
    integrity, through the archive segments; name the first bad seq and the last good
    one. Exit 1 on damage, or when a segment is missing.

    Example: tillerman ledger verify --ledger ./ledger.sqlite3
    """
    with open_ledger(ledger_path, readonly=True) as recorder:
        report = recorder.verify()
    if as_json:
        print_json(report)
    else:
        last = "last seq" if report.ok else "last good seq"
        click.echo(f"{'ok' if report.ok else 'DAMAGED'}: {report.rows} rows, {last} {report.last_seq}")
        for line in report.problems:
            print_line(f"problem: {line}")
        for line in report.notes:
            print_line(f"note: {line}")
    if not report.ok:
        sys.exit(EXIT_CHECK_FAILED)


@ledger.command("export")
@click.option("--after", callback=_seq, default="0", help="Only entries after this seq.")
@ledger_option
@errors_to_exit_codes
def ledger_export(after, ledger_path):
    """Every entry as one JSON object per line (seq, event_id, times, source, event,
    hashes), streamed; archived rows too, from their segments, in seq order.

    Example: tillerman ledger export > ledger.jsonl
    """
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    with open_intact_ledger(ledger_path) as recorder:
        for entry in recorder.history(after_seq=after):
            out.write(encoder.encode(entry))
            out.write(b"\n")
    out.flush()


@ledger.command("accept-tail")
@click.option("--by", required=True, help="Who accepts the shorter history (recorded in the ledger).")
@ledger_option
@errors_to_exit_codes
def ledger_accept_tail(by, ledger_path):
    """Accept a ledger that ends before its head anchor, or whose anchor is gone: rows
    cut off the tail, or lost to a power failure. Until then every write is refused and
    the daemon holds every dispatch. Records who accepted, in a chained event, and moves
    the anchor onto it.

    Example: tillerman ledger verify; tillerman ledger accept-tail --by ann
    """
    if not by.strip():
        raise Fail("--by names the person who accepts the shorter history: give a name")
    with open_ledger(ledger_path, must_exist=True) as recorder:
        problem, seq = recorder.accept_tail(by)
    print_line(f"accepted by {by} at seq {seq}: {problem}")



@ledger.command("copy")
@click.argument("source")
@click.argument("target")
@json_option
@errors_to_exit_codes
def ledger_copy(source, target, as_json):
    """Copy a ledger's whole history into an empty ledger, SQLite or PostgreSQL either
    way (a path or a postgresql:// URL), and verify the copy: every row is written again
    as an ordinary append and must come out with the source's seq and chain hash. The
    source is only read. Exit 1 when the source does not verify or the copy differs, 2
    when the target is not empty.

    Example: tillerman ledger copy ~/.local/state/tillerman/ledger.sqlite3 postgresql://tm@db/tillerman
    """
    from tillerman.ledger.copy import copy_ledger
    from tillerman.ledger.paths import SQLITE_MAGIC, check_output

    if ledger_url(target) is None:  # a file: a new one, or an empty ledger (a full one is refused below)
        check_output(target, "the copy's target", ledgers=[] if ledger_url(source) else [source],
                     ours=lambda head: head.startswith(SQLITE_MAGIC))
    with open_ledger(source, readonly=True) as src, open_ledger(target) as dst:
        result = copy_ledger(src, dst)
    if as_json:
        print_json(result)
        return
    click.echo(f"copied {result.rows} rows and {result.file_offsets} file offsets; the copy verifies and ends at"
               f" seq {result.last_seq} ({result.head[:16]}), as the source does")


@ledger.command("archive")
@click.option("--before", "before_text", required=True,
              help="Archive the threads closed before this ISO-8601 time (no row of theirs since, no open intent).")
@click.option("--dry-run", is_flag=True, help="Say what would move; change nothing.")
@json_option
@ledger_option
@errors_to_exit_codes
def ledger_archive(before_text, dry_run, as_json, ledger_path):
    """Move the rows of threads closed before a time, with their intents' rows, into a
    segment file beside the ledger (LEDGER.segments/), and shrink the ledger. The chain
    is kept: verify walks through the segments, export and replay read them. Refused
    while a daemon runs on the ledger (exit 2) and on a ledger that does not verify
    (exit 1).

    Example: tillerman ledger archive --before 2026-10-01T00:00:00Z --dry-run
    """
    from tillerman.controller.dispatch.driver import kill_at  # the crash checkpoints tests set
    from tillerman.ledger.archive import archive as archive_ledger

    try:
        before = parse_time(before_text)
    except ValueError as exc:
        raise Fail(f"--before {exc}") from exc
    path = ledger_file(ledger_path, command="ledger archive")
    if not path.is_file():
        raise Fail(f"no ledger at {path}; give --ledger PATH or set TILLERMAN_LEDGER")
    result = archive_ledger(path, before, dry_run=dry_run, checkpoint=kill_at)
    if as_json:
        print_json(result)
        return
    what = (f"{result.threads} thread(s), {result.intents} intent(s), {result.rows} row(s)"
            + (f", seqs {result.first_seq}..{result.last_seq}" if result.rows else ""))
    kept = f"; {result.kept_threads} closed thread(s) kept for an open intent" if result.kept_threads else ""
    if dry_run:
        click.echo(f"would archive {what}{kept} (closed before {iso(before)}); nothing changed")
    elif result.segment is None:
        click.echo(f"nothing to archive before {iso(before)}{kept}; ledger {result.bytes_after:,} bytes")
    else:
        click.echo(f"archived {what} into {result.segment}{kept}")
        click.echo(f"ledger {result.bytes_before:,} -> {result.bytes_after:,} bytes")




# -- claude: the stream-json wrapper -------------------------------------------------


@main.command("claude", context_settings={"ignore_unknown_options": True})
@ledger_option
@click.option("--retain-payloads", is_flag=True, help="Keep prompt and message text in the ledger.")
@click.argument("claude_args", nargs=-1, type=click.UNPROCESSED)
def claude_cmd(ledger_path, retain_payloads, claude_args):
    """Run Claude Code (stream-json in and out) for a harness, relaying its traffic
    unchanged, recording the session and carrying out the intents the daemon decides
    for it. Put the CLI's own arguments after `--`; the stream-json flags are added when
    missing. The binary is $TILLERMAN_CLAUDE_BIN, else `claude` on PATH.

    Example: tillerman claude -- --permission-prompt-tool stdio
    """
    from tillerman.controller.claude.wrapper import WrapperError, run_wrapper

    recorder = open_ledger(ledger_path)
    try:
        code = run_wrapper(recorder, claude_args, retain_payloads=retain_payloads)
    except WrapperError as exc:
        raise Fail(str(exc)) from exc
    except OSError as exc:
        raise Fail(f"cannot start Claude Code: {exc}; check $TILLERMAN_CLAUDE_BIN or PATH") from exc
    finally:
        recorder.close()
    sys.exit(code)
