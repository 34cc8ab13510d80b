"""The shell examples of README.md and of every docs page are checked against the real
CLI: every `tillerman …` line of every ```sh block (and every `$ tillerman …` line of an
unlabelled block, the rest being its output) parses with the click commands (an unknown command or option, a
missing value, a choice that does not exist or a required option left out fails), and
the commands of one example use one ledger (all the default, or all the same
`--ledger`). Followed literally, an example whose commands write different ledgers
leaves the daemon blind to what the others record.

Nothing is run: each line is split as the shell would and parsed by the command's own
parser, without converting values (a path in an example need not exist here)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import click
import pytest

from tests.test_docs import COMMANDS, PAGES
from tillerman.controller.cli.main import main
from tillerman.controller.cli.shared import LEDGER_HELP

DEFAULT_LEDGER = "$TILLERMAN_LEDGER"  # what a command without --ledger uses
SHELL_OPERATORS = {";", "&", "&&", "|", "||"}
REDIRECTIONS = {">", ">>", "<", "2>", "2>&1"}


@dataclass(frozen=True)
class Example:
    heading: str  # the section it is in, for the test's id
    lines: list[str]  # its commands, continuation lines joined, prompts and output dropped


@dataclass(frozen=True)
class Parsed:
    path: str  # "tillerman intent propose"
    command: click.Command
    options: dict  # parameter name -> value as written
    synopsis: bool  # a usage line with [optional] parts, not a command to run


def sh_examples(text: str) -> list[Example]:
    examples = []
    heading = ""
    for match in re.finditer(r"^```(\w*)\n(.*?)^```|^(#+ [^\n]*)$", text, re.M | re.S):
        if match.group(3):
            heading = match.group(3).lstrip("# ")
        elif match.group(1) == "sh":
            examples.append(Example(heading, _commands_of(match.group(2))))
        elif match.group(1) == "":  # a terminal's copy: only its prompted lines
            examples.append(Example(heading, _commands_of(match.group(2), prompted_only=True)))
    return examples


def _commands_of(block: str, *, prompted_only: bool = False) -> list[str]:
    """The command lines of a block. With `$ ` prompts, only the prompted lines are
    commands (the rest is their output); without, every line is."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.lstrip() for line in joined.splitlines()]
    if prompted_only or any(line.startswith("$ ") for line in lines):
        return [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if line and not line.startswith("#")]


def simple_commands(line: str, exported: dict[str, str]) -> list[list[str]]:
    """A line split as the shell would into its simple commands, with the variables the
    example exported expanded, `<placeholders>` kept as one word and redirections
    dropped. ``exported`` gains what an `export` sets."""
    words = shlex.shlex(re.sub(r"<[^<>\n]+>", "PLACEHOLDER", line), posix=True, punctuation_chars=";&|<>")
    words.whitespace_split = True
    words.commenters = "#"
    commands: list[list[str]] = [[]]
    tokens = iter(words)
    for token in tokens:
        if token in SHELL_OPERATORS:
            commands.append([])
        elif token in REDIRECTIONS:
            next(tokens, None)  # the redirection's target
        else:
            commands[-1].append(_expanded(token, exported))
    for command in commands:
        if command[:1] == ["export"]:
            exported.update(word.split("=", 1) for word in command[1:] if "=" in word)
    return [c for c in commands if c]


def _expanded(word: str, exported: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: exported.get(m.group(1), m.group(0)), word)


def tillerman_args(command: list[str]) -> list[str] | None:
    """The arguments of a tillerman command line (None: another program)."""
    while command and re.fullmatch(r"\w+=.*", command[0]):  # VAR=value before the command
        command = command[1:]
    if command[:1] == ["tillerman"]:
        return command[1:]
    for module in ("tillerman", "tillerman.controller"):
        marker = ["-m", module]
        if len(command) > 2 and command[1:3] == marker and command[0].endswith("python"):
            return command[3:]
    return None


def parse(args: list[str]) -> Parsed:
    """Resolve ``tillerman ARGS`` to its command and parse its options, as click would,
    without converting values or running anything. Raises click.UsageError."""
    synopsis = any(word.startswith(("[", "(")) or word == "|" for word in args)
    if synopsis:  # a usage line: its words, without the brackets and alternatives
        args = [w for word in args for w in re.split(r"[\[\]()|]", word) if w]
    command: click.Command = main
    ctx = click.Context(main, info_name="tillerman")
    path = "tillerman"
    while True:
        options, rest, _ = command.make_parser(ctx).parse_args(list(args))
        if not isinstance(command, click.Group) or not rest:
            break
        name, sub = rest[0], command.get_command(ctx, rest[0])
        if sub is None:
            raise click.UsageError(f"no such command {name!r} in {path}")
        command, args, path = sub, rest[1:], f"{path} {name}"
        ctx = click.Context(sub, info_name=name, parent=ctx)
    if rest and not ctx.allow_extra_args and not synopsis:
        raise click.UsageError(f"{path}: unexpected extra arguments {rest}")
    _check_values(command, options, path, synopsis)
    return Parsed(path, command, options, synopsis)


def _check_values(command: click.Command, options: dict, path: str, synopsis: bool) -> None:
    for param in command.params:
        value = options.get(param.name)
        if value is None:
            if param.required and not synopsis and not any(o in ("-h", "--help") for o in options):
                raise click.UsageError(f"{path}: {param.opts[0]} is required")
            continue
        if isinstance(param.type, click.Choice) and not synopsis:
            for one in value if isinstance(value, tuple | list) else [value]:
                if one not in param.type.choices:
                    raise click.UsageError(f"{path}: {one!r} is not a choice of {param.opts[0]}")


def ledger_of(parsed: Parsed) -> str | None:
    """The ledger a command records in or reads (None: it takes no shared --ledger)."""
    for param in parsed.command.params:
        if param.name == "ledger_path" and param.help == LEDGER_HELP:
            return parsed.options.get("ledger_path") or DEFAULT_LEDGER
    return None


def checked(example: Example) -> list[Parsed]:
    exported: dict[str, str] = {}
    found = []
    for line in example.lines:
        # A usage line ("tillerman run [--codex URL | --no-codex]") is one command, its | no pipe.
        usage = line.startswith("tillerman ") and re.search(r"\s[\[(]", line)
        for command in [shlex.split(line, comments=True)] if usage else simple_commands(line, exported):
            args = tillerman_args(command)
            if args is not None:
                try:
                    found.append(parse(args))
                except click.UsageError as exc:
                    raise AssertionError(f"{example.heading}: `{line.strip()}`: {exc.format_message()}") from exc
    if DEFAULT_LEDGER[1:] in exported:  # exported in the example: the default is that one
        found = [p if p.options.get("ledger_path") else _with_ledger(p, exported[DEFAULT_LEDGER[1:]]) for p in found]
    return found


def _with_ledger(parsed: Parsed, ledger: str) -> Parsed:
    return Parsed(parsed.path, parsed.command, {**parsed.options, "ledger_path": ledger}, parsed.synopsis)


EXAMPLES = [e for page in PAGES for e in sh_examples(page.read_text()) if any("tillerman" in line for line in e.lines)]


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{i}-{e.heading[:40]}" for i, e in enumerate(EXAMPLES)])
def test_each_example_parses_with_the_cli_and_uses_one_ledger(example: Example) -> None:
    commands = checked(example)
    ledgers = {ledger_of(p) for p in commands if not p.synopsis} - {None}
    assert len(ledgers) <= 1, f"{example.heading}: one example, several ledgers: {sorted(ledgers)}"


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_each_commands_help_example_parses_with_the_cli(path: str, command: click.Command) -> None:
    example = " ".join(command.help.split("Example:", 1)[1].split())
    assert path in [p.path for p in checked(Example(f"{path} --help", [example]))]


def test_the_examples_are_found_in_every_section_that_has_them() -> None:
    headings = {e.heading for e in EXAMPLES}
    assert {"Supervise Claude Code", "From a harness: `tillerman claude`",
            "Following session files: `tillerman run --watch DIR`"} <= headings
    assert sum(len(checked(e)) for e in EXAMPLES) > 50


# -- the checker itself: each mistake it is there for is caught --------------------------


@pytest.mark.parametrize(("block", "why"), [
    ("tillerman run --watch ~/.claude/projects --bogus\n", "No such option"),
    ("tillerman intent propse --thread T\n", "no such command"),
    ("tillerman intent propose --thread T --mode steer\n", "--text is required"),
    ("tillerman intent propose --thread T --mode nudge --text hi\n", "not a choice"),
    ("tillerman run --watch\n", "requires an argument"),
    ("tillerman status extra\n", "unexpected extra arguments"),
    ("$ tillerman intents --state queued --jsn\n[]\n", "No such option"),
    ("echo '{}' | tillerman hook claude && tillerman hooks install --cloude\n", "No such option"),
])
def test_a_wrong_command_line_fails(block: str, why: str) -> None:
    with pytest.raises(AssertionError, match=re.escape(why)):
        checked(Example("a section", _commands_of(block)))


def test_an_example_that_uses_two_ledgers_fails() -> None:
    """The wrapper section's example as it was: the wrapper recorded in a ledger the
    daemon and the proposal never opened."""
    block = """tillerman run --no-codex --watch ~/.claude/projects &
tillerman claude --ledger ~/.local/share/tillerman/ledger.sqlite3 -- --permission-prompt-tool stdio
tillerman intent propose --thread <session id> --expected-turn active --mode steer \\
    --text "Leave the migrations alone."
"""
    with pytest.raises(AssertionError, match="several ledgers"):
        test_each_example_parses_with_the_cli_and_uses_one_ledger(Example("a section", _commands_of(block)))


def test_an_exported_ledger_is_the_default_of_the_commands_after_it() -> None:
    block = """export TILLERMAN_LEDGER=postgresql://tillerman@db/tillerman
tillerman intents; tillerman status
tillerman replay --check "$TILLERMAN_LEDGER"
tillerman run --ledger "$TILLERMAN_LEDGER"
"""
    commands = checked(Example("a section", _commands_of(block)))
    assert {ledger_of(p) for p in commands} - {None} == {"postgresql://tillerman@db/tillerman"}
