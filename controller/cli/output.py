"""One way to print: a human table by default, ``--json`` for scripts.

A single entity prints one JSON object, a list prints an array, a summary one object
(docs/design.md "Command-line conventions"). Library errors become one ``Error:`` line and
the exit code scripts rely on: 1 a failed check, 2 usage, unreadable input or invalid
configuration.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence

import click
import msgspec

from tillerman.controller.core.printable import printable
from tillerman.ledger.errors import (
    AnchorMismatch,
    IntegrityError,
    LedgerError,
    OperationalError,
    SchemaError,
    UnknownIntent,
)

EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_ANCHOR_STALE = 3  # the command's rows are committed, but the ledger's head anchor was not moved


class Fail(click.ClickException):
    """An error for a person: what was wrong and what to do, with an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def format_message(self) -> str:
        # The message often quotes what it refuses (a path, an id, a line of a rule file);
        # its own lines stay lines (a rule file's several problems, one a line).
        return "\n".join(printable(line) for line in self.message.split("\n"))


class PathType(click.Path):
    """``click.Path`` that answers a name the system cannot take (a NUL byte, a name
    too long) with a usage error, not an exception from ``os.stat``."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except (ValueError, OSError) as exc:
            self.fail(f"{value[:40]!r} cannot be a path ({exc})", param, ctx)


def json_option(fn):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(fn)


def print_json(value) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")


def print_line(line: object, *, err: bool = False) -> None:
    """One line of human output that quotes outside text (a thread id, a file name, a
    recorded reason): its control characters are shown as codes, so it stays one line
    and nothing in it acts on the terminal."""
    click.echo(printable(line), err=err)


def print_table(rows: Sequence[dict], columns: Sequence[str], empty: str) -> None:
    if not rows:
        click.echo(empty)
        return
    cells = [[("" if r.get(c) is None else printable(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def warn_undecodable(undecodable: Mapping[int, str], shown: int = 5) -> None:
    """One stderr line per ledger row the fold skipped because it does not decode (the
    first few): the rest of the ledger is still read and shown."""
    for seq in sorted(undecodable)[:shown]:
        click.echo(f"warning: ledger seq {seq} cannot be decoded and was skipped ({printable(undecodable[seq])})",
                   err=True)
    if len(undecodable) > shown:
        click.echo(f"warning: {len(undecodable) - shown} more ledger rows cannot be decoded and were skipped",
                   err=True)


def errors_to_exit_codes(fn: Callable) -> Callable:
    """Turn library exceptions into one ``Error:`` line with the right exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UnknownIntent as exc:
            raise Fail(str(exc)) from exc
        except SchemaError as exc:
            raise Fail(f"{exc}. Point --ledger at a tillerman ledger.") from exc
        except (AnchorMismatch, IntegrityError) as exc:  # damage: a failed check, not a usage error
            raise Fail(str(exc), EXIT_CHECK_FAILED) from exc
        except OperationalError as exc:
            raise Fail(f"{exc}. Retry when the ledger is writable.") from exc
        except LedgerError as exc:
            raise Fail(str(exc)) from exc
        except ValueError as exc:  # our own validation (durations, times, intent requests)
            raise Fail(str(exc)) from exc
        except BrokenPipeError:  # the reader went away (`| head`): click ends quietly, as cat would
            raise
        except OSError as exc:  # a path the system refuses (too long, not permitted, …)
            raise Fail(f"{exc.filename!s:.80}: {exc.strerror or exc}" if exc.filename else str(exc)) from exc

    return wrapper
