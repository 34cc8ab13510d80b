"""``tillerman hooks install|uninstall --claude`` and ``tillerman hook claude``: Claude
Code's hooks record every payload for tillerman.

``hook claude`` is what Claude Code runs (installed as ``python -m
tillerman.controller.claude_hook``, the same without the CLI's imports): it reads the payload on stdin and appends it,
as one line, to ``<spool>/<session_id>.jsonl``; it answers nothing (no decision), so the
session goes on as if no hook were there. It never waits on the ledger: the daemon
(``tillerman run --watch <spool>``) and ``tillerman replay`` read the spool files like
any session file (format ``claude-hooks``). When the payload cannot be kept it says so
on stderr and still exits 0: a hook of ours never stops the agent.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from tillerman.controller.claude import hook as claude_hook
from tillerman.controller.claude.hook import default_spool
from tillerman.controller.claude.settings import (
    HOOK_MODULE,
    SettingsNotExact,
    SettingsShapeError,
    read_settings,
    settings_text,
    with_our_hooks,
    without_our_hooks,
)
from tillerman.controller.cli.output import Fail, PathType, errors_to_exit_codes
from tillerman.ledger.paths import check_output, replace_file


def _settings_path(project: str | None) -> Path:
    if project is not None:
        return Path(project).resolve() / ".claude" / "settings.json"
    return Path.home() / ".claude" / "settings.json"


def _read_settings(path: Path) -> tuple[Path, dict]:
    """Where the settings are written (a symlinked ``settings.json`` leads to its file)
    and what they hold; a file that may not be written, or whose settings could not be
    written back exactly, is refused before anything changes."""
    target = check_output(path, "the settings file")
    try:
        text = target.read_text(encoding="utf-8") if target.exists() else ""
        return target, read_settings(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Fail(f"{path}: cannot read it as JSON ({exc}); fix or move it, then run this again") from exc
    except (SettingsNotExact, SettingsShapeError) as exc:
        raise Fail(f"{path}: {exc}, so it cannot be rewritten exactly; fix it, then run this again") from exc


def _write_settings(target: Path, settings: dict) -> None:
    """Written beside and renamed into place: Claude Code never reads half a file."""
    text = settings_text(settings)
    replace_file(target, lambda new: new.write_text(text, encoding="utf-8"), mode=0o600)


def _where(claude: bool, project: str | None, user: bool) -> Path:
    if not claude:
        raise Fail("say which agent's hooks: --claude (Claude Code is the only one with hooks here)")
    if project is not None and user:
        raise Fail("--project and --user name two settings files: give one")
    return _settings_path(project)


def _spool_made(spool: str | None) -> Path:
    """The spool the hook will write, made now (0700: payloads hold prompts and
    commands), so the folder the install tells you to watch exists before the first
    hook runs. Refused before the settings are touched."""
    if spool == "":  # Path("") is whatever directory the hook starts in: the agent's project
        raise Fail("--spool '' names no folder: give the folder the hook should keep payloads in")
    spool_dir = default_spool() if spool is None else Path(spool).resolve()
    try:
        spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise Fail(f"{spool_dir}: cannot make the spool folder ({exc.strerror or exc})") from exc
    return spool_dir


@click.group("hooks")
def hooks() -> None:
    """Install or remove tillerman's hooks in an agent's settings."""


_place = [
    click.option("--claude", is_flag=True, help="Claude Code's settings.json."),
    click.option("--project", type=PathType(file_okay=False, exists=True),
                 help="The project's settings (DIR/.claude/settings.json)."),
    click.option("--user", is_flag=True, help="Your user settings (~/.claude/settings.json), the default."),
]


def _placed(fn):
    for option in reversed(_place):
        fn = option(fn)
    return fn


@hooks.command("install")
@_placed
@click.option("--spool", type=PathType(file_okay=False), help="Where the hook keeps payloads"
              " (default: $XDG_STATE_HOME/tillerman/claude-hooks).")
@errors_to_exit_codes
def install(claude, project, user, spool):
    """Add a hook of ours to every Claude Code hook event, beside the hooks already there
    (installing again replaces only ours). It runs `tillerman hook claude` as a bare
    module, without the CLI's imports: a hook starts on every event.

    Example: tillerman hooks install --claude --user
    """
    path = _where(claude, project, user)
    spool_dir = _spool_made(spool)
    command = f"{shlex.quote(sys.executable)} -m {HOOK_MODULE} --spool {shlex.quote(str(spool_dir))}"
    path.parent.mkdir(parents=True, exist_ok=True)
    target, settings = _read_settings(path)
    try:
        merged = with_our_hooks(settings, command)
    except SettingsShapeError as exc:
        raise Fail(f"{path}: {exc}; fix it, then run this again") from exc
    _write_settings(target, merged)
    click.echo(f"installed tillerman's Claude Code hooks in {path}")
    click.echo(f"payloads go to {spool_dir}: follow them with tillerman run --watch {spool_dir}")


@hooks.command("uninstall")
@_placed
@errors_to_exit_codes
def uninstall(claude, project, user):
    """Take tillerman's hook entries out of Claude Code's settings; the rest stays.

    Example: tillerman hooks uninstall --claude --user
    """
    path = _where(claude, project, user)
    if not path.parent.is_dir():
        click.echo(f"no tillerman hooks in {path}: nothing changed")
        return
    target, settings = _read_settings(path)
    kept = without_our_hooks(settings)
    if kept == settings:
        click.echo(f"no tillerman hooks in {path}: nothing changed")
        return
    _write_settings(target, kept)
    click.echo(f"removed tillerman's Claude Code hooks from {path}")


@click.group("hook")
def hook() -> None:
    """What an agent's hook runs (installed by `tillerman hooks install`)."""


@hook.command("claude", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("options", nargs=-1, type=click.UNPROCESSED, metavar="[--spool DIR]")
def hook_claude(options):
    """Keep the hook payload on stdin as one line of <spool>/<session_id>.jsonl
    (--spool DIR; default: $XDG_STATE_HOME/tillerman/claude-hooks). Prints no
    decision; exits 0 even when it cannot keep it or its options are wrong (saying why
    on stderr): Claude Code reads exit 2 as "block this action".

    Example: echo '{"session_id": "s1", "hook_event_name": "Stop"}' | tillerman hook claude
    """
    sys.exit(claude_hook.main(list(options)))  # its options are parsed there, never by click
