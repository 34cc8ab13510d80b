"""What the commands share: where the ledger is and how a command opens it, loading the
rule and configuration files, and ``--now``. Both command modules (``main`` and
``rules``) import it; neither imports the other's commands."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tillerman.controller.cli.output import EXIT_ANCHOR_STALE, EXIT_CHECK_FAILED, Fail, PathType, print_line
from tillerman.controller.core.timefmt import parse_time
from tillerman.ledger.backends import open_recorder
from tillerman.ledger.errors import SchemaError, UnsafeOutput
from tillerman.ledger.location import is_database_url, shown
from tillerman.ledger.paths import check_ledger_path
from tillerman.ledger.recorder import Recorder
from tillerman.rules.errors import RuleSetError

if TYPE_CHECKING:
    from tillerman.rules.config import Effective

LEDGER_HELP = ("Ledger file, or a PostgreSQL database as postgresql://USER@HOST/DB (default: $TILLERMAN_LEDGER,"
               " else $XDG_STATE_HOME/tillerman/ledger.sqlite3).")
CONFIG_HELP = "Configuration file: grants, [defaults], [patterns] (TOML; default: $XDG_CONFIG_HOME/tillerman/config.toml if it exists)."


def default_ledger_path() -> Path:
    if env := os.environ.get("TILLERMAN_LEDGER"):
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "tillerman" / "ledger.sqlite3"


def ledger_url(path: str | None) -> str | None:
    """The PostgreSQL URL given as ``--ledger`` (or ``$TILLERMAN_LEDGER``); None for a file.
    Another URL is refused, not taken for a folder named ``sqlite:``."""
    given = path if path is not None else os.environ.get("TILLERMAN_LEDGER")
    if given is None or "://" not in given:
        return None
    if is_database_url(given):
        return given
    scheme = given.split("://", 1)[0]
    raise Fail(f"ledger {scheme}:// is not supported; give --ledger the path of a SQLite file"
               " or a postgresql:// URL")


def ledger_file(path: str | None, *, command: str | None = None, readonly: bool = False) -> Path:
    """The ledger's real path: resolved here, at the edge, because the daemon matches it
    against the absolute paths the kernel reports for its WAL file, and a symlink to the
    ledger is the same ledger (``tillerman.ledger.paths``). Every path a person gives as
    a ledger comes through here: a FIFO, a device, a folder or a ledger's companion file
    (``L.head``, ``L-wal``, ``L.segments/…``) is refused before SQLite opens it
    (``check_ledger_path``; ``readonly``: an archive segment may be read). ``command``:
    one that works on a SQLite file only, refusing a PostgreSQL URL by that name."""
    if (url := ledger_url(path)) is not None:
        raise Fail(f"{command or 'this command'} works on a SQLite ledger file, not on the database {shown(url)};"
                   " give --ledger the path of a SQLite file")
    if path is not None and not path.strip():
        raise Fail("--ledger is empty; give the path of the ledger file")
    try:
        return Path(check_ledger_path(Path(path) if path else default_ledger_path(), readonly=readonly).path)
    except UnsafeOutput as exc:
        raise Fail(str(exc)) from None


def open_ledger(path: str | None, *, must_exist: bool = False, readonly: bool = False,
                idle_transaction_limit: float | None = None, or_else: str | None = None) -> Recorder:
    """``must_exist``: a reading command, which never creates a ledger (or its folders) where
    none is; a writing command creates one. ``readonly``: for the commands that only read;
    they never write (no migration, no anchor, no snapshot), so they work on a read-only
    file or a full disk. A ``postgresql://`` URL opens that database's ledger
    (``idle_transaction_limit``: ``tillerman.ledger.backends.open_recorder``). ``or_else``: the
    command's other way in, named where there is no ledger to read."""
    if (url := ledger_url(path)) is not None:
        try:
            return open_recorder(url, readonly=readonly, must_exist=must_exist or readonly,
                                 idle_transaction_limit=idle_transaction_limit)
        except SchemaError as exc:
            raise Fail(str(exc)) from exc
    target = ledger_file(path, readonly=readonly)
    if (must_exist or readonly) and not target.exists():
        raise Fail(f"no ledger at {target}; give --ledger PATH or set TILLERMAN_LEDGER"
                   + (f", or {or_else}" if or_else else ""))
    return open_recorder(target, readonly=readonly)


def open_intact_ledger(path: str | None, *, or_else: str | None = None) -> Recorder:
    """For a reading command that shows what the ledger holds: a file cut mid-page is
    damage (exit 1), not a partial answer."""
    recorder = open_ledger(path, readonly=True, or_else=or_else)
    if recorder.damage:  # a SQLite file cut mid-page
        recorder.close()
        raise Fail(f"the ledger is damaged: {recorder.damage}; `tillerman ledger verify` names the last good seq",
                   EXIT_CHECK_FAILED)
    return recorder


def report_anchor(ledger: Recorder) -> None:
    """After a writing command printed what it committed: a head anchor the file system
    would not move (a full disk) is one line and exit 3; the next write catches it up."""
    if ledger.anchor_error:
        click.echo(f"Warning: committed, but {ledger.anchor_error}; the next write catches it up"
                   " once the disk has room", err=True)
        sys.exit(EXIT_ANCHOR_STALE)


def parse_now(now_text: str | None) -> float:
    """``--now``: absent means the clock; given, it must be a time (an empty one is an error)."""
    return time.time() if now_text is None else parse_time(now_text)


def ledger_option(fn):
    return click.option("--ledger", "ledger_path", type=PathType(dir_okay=False), help=LEDGER_HELP)(fn)


def load_rules_or_fail(rules_path: str | None, config_path: str | None, *, refuse_unsafe: bool = False) -> Effective:
    """Rules, grants and command patterns (tillerman.rules.config), from ``--rules`` and
    ``--config`` as given (no ``--config``: the default config file, if any). A file
    someone else could have written is refused with ``refuse_unsafe`` (``run``: the
    daemon acts on it), and otherwise only warned about."""
    from tillerman.rules.config import config_file, load_effective  # not for the commands that read no rules

    try:
        return load_effective(Path(rules_path) if rules_path else None, config_file(config_path),
                              on_unsafe=None if refuse_unsafe else warn_unsafe)
    except RuleSetError as exc:
        raise Fail(str(exc)) from exc


def warn_unsafe(problem: str) -> None:
    """A command that only reads a rule or config file says what ``run`` would refuse."""
    print_line(f"warning: {problem}", err=True)
