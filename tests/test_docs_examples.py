"""The shell examples of README.md and of every docs page are checked against the real
CLI: every `tillerman …` line of every ```sh block (and every `$ tillerman …` line of an
unlabelled block, the rest being its output; indented blocks in a list item too) parses with the click commands (an unknown command or option, a
missing value, a choice that does not exist or a required option left out fails), and
the commands of one example use one ledger (all the default, or all the same
`--ledger`). Followed literally, an example whose commands write different ledgers
leaves the daemon blind to what the others record.

Parsing runs nothing: each line is split as the shell would and parsed by the command's
own parser, without converting values (a path in an example need not exist here).

The examples that can run here are then run, each as `python -m tillerman.controller …`
from the repository's root, with `TILLERMAN_LEDGER`, `HOME`, `XDG_*` and `CODEX_HOME`
in the test's folder, and must exit 0 (a redirection's file is not written: the output
is captured). The ledger is a fresh, empty one (what `tillerman run` leaves before its
first event); the runnable lines of one example run in order on it, each line's test
running the ones above it first. A line of an example runs when:

- every command on it is tillerman (no pipe into `jq`, no `sqlite-utils` after it), and
  none is a usage line;
- none needs a live agent or server, or changes an agent's settings: `run`, `claude`,
  `shim`, `hook`, `hooks` and `review try` are not run;
- every word is written out: no `~`, no `$VAR` but `$TILLERMAN_LEDGER`, no `…` or
  `<placeholder>`, no URL (a `postgresql://` ledger, a `unix://` server);
- it uses the example's default ledger: no `--ledger` of its own (other than
  `$TILLERMAN_LEDGER`), in an example that does not export another;
- every path it takes (a click.Path parameter, or the inputs of `replay`, `report`,
  `timeline` and `rules diff`) names a file or folder of the repository, by a relative
  path (`fixtures/sessions/codex-rollout/`), or is `$TILLERMAN_LEDGER`;
- it names no intent (`intent show in-3f2a…`): an intent's id is made at random, so no
  example can name one that the fresh ledger holds;
- its comment does not put it in a state the example has not set up (`# after someone
  edited a row`).

None of the lines that run states an exit code for a fresh ledger (`overdue --check`'s
"exit 1 when anything is overdue" has nothing overdue), so each must exit 0."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from tests.test_docs import COMMANDS, PAGES, ROOT
from tillerman.controller.cli.main import main
from tillerman.controller.cli.shared import LEDGER_HELP
from tillerman.ledger.backends import open_recorder

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
    # A fence may be indented (a block inside a list item): it closes at the same indent.
    for match in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```|^(#+ [^\n]*)$", text, re.M | re.S):
        if match.group(4):
            heading = match.group(4).lstrip("# ")
        elif match.group(2) == "sh":
            examples.append(Example(heading, _commands_of(match.group(3))))
        elif match.group(2) == "":  # a terminal's copy: only its prompted lines
            examples.append(Example(heading, _commands_of(match.group(3), prompted_only=True)))
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
    # With each command's context settings, as click makes its contexts: click keeps the help
    # option it first builds on a command, so main's without "-h" would change its --help.
    ctx = click.Context(main, info_name="tillerman", **main.context_settings)
    path = "tillerman"
    while True:
        options, rest, _ = command.make_parser(ctx).parse_args(list(args))
        if not isinstance(command, click.Group) or not rest:
            break
        name, sub = rest[0], command.get_command(ctx, rest[0])
        if sub is None:
            raise click.UsageError(f"no such command {name!r} in {path}")
        command, args, path = sub, rest[1:], f"{path} {name}"
        ctx = click.Context(sub, info_name=name, parent=ctx, **sub.context_settings)
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


def line_commands(line: str, exported: dict[str, str]) -> list[list[str]]:
    """The simple commands of an example's line (see simple_commands). A usage line
    ("tillerman run [--codex URL | --no-codex]") is one command, its | no pipe."""
    if line.startswith("tillerman ") and re.search(r"\s[\[(]", line):
        return [shlex.split(line, comments=True)]
    return simple_commands(line, exported)


def checked(example: Example) -> list[Parsed]:
    exported: dict[str, str] = {}
    found = []
    for line in example.lines:
        for command in line_commands(line, exported):
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


# -- the examples that can run here are run (the rule is in the module's docstring) -------

LIVE_COMMANDS = ("tillerman run", "tillerman claude", "tillerman shim", "tillerman hook", "tillerman hooks",
                 "tillerman review try")
#: Inputs that are strings, not click.Path, because a PostgreSQL URL may stand there too.
INPUT_ARGUMENTS = {"paths", "sessions"}
PRECONDITION = re.compile(r"\s#\s*after\b")  # "# after someone edited a row"
RUN_MINIMUM = 17  # the lines run when the rule was written: fewer means examples were lost


@dataclass(frozen=True)
class Line:
    page: str  # the page's path in the repository
    example: int  # the example's number on its page
    text: str
    commands: list[list[str]]  # the tillerman arguments of each command on it
    why_not_run: str | None


@dataclass(frozen=True)
class Run:
    line: Line
    before: list[Line]  # the example's runnable lines above it, run first on the same ledger

    @property
    def id(self) -> str:
        commands = "; ".join(shlex.join(["tillerman", *c]) for c in self.line.commands)
        return f"{self.line.page}[{self.line.example}] {commands}"


def lines_of(page: str, number: int, example: Example) -> list[Line]:
    """The lines of an example that run tillerman, each with why it is not run here."""
    exported: dict[str, str] = {}
    found = []
    for text in example.lines:
        commands = [tillerman_args(c) for c in line_commands(text, exported)]
        if any(c is not None for c in commands):
            found.append(Line(page, number, text, [c for c in commands if c is not None],
                              why_not_run(text, commands, exported)))
    return found


def why_not_run(text: str, commands: list[list[str] | None], exported: dict[str, str]) -> str | None:
    if None in commands:
        return "runs another program"
    if DEFAULT_LEDGER[1:] in exported:
        return "the example exports its own ledger"
    if PRECONDITION.search(text):
        return "needs a state the example does not set up"
    return next(filter(None, (_why_not_run_command(args) for args in commands)), None)


def _why_not_run_command(args: list[str]) -> str | None:
    parsed = parse(args)
    if parsed.synopsis:
        return "a usage line"
    if any(parsed.path == live or parsed.path.startswith(f"{live} ") for live in LIVE_COMMANDS):
        return f"{parsed.path} needs a live agent or server, or changes an agent's settings"
    for word in args:
        if word.startswith("~"):
            return f"{word}: a path in someone's home folder"
        if "$" in word.replace(DEFAULT_LEDGER, ""):
            return f"{word}: a variable the example does not set"
        if "…" in word or "PLACEHOLDER" in word:
            return f"{word}: elided"
        if "://" in word:
            return f"{word}: a server or a database"
    if parsed.options.get("ledger_path") not in (None, DEFAULT_LEDGER):
        return "names its own ledger"
    if parsed.options.get("intent_id"):
        return "names an intent: ids are random, a fresh ledger holds none"
    return next((f"{path}: not in the repository" for path in _paths(parsed) if not _in_repository(path)), None)


def _paths(parsed: Parsed) -> list[str]:
    found = []
    for param in parsed.command.params:
        value = parsed.options.get(param.name)
        if value and param.name != "ledger_path" and (isinstance(param.type, click.Path)
                                                      or param.name in INPUT_ARGUMENTS):
            found += value if isinstance(value, tuple | list) else [value]
    return found


def _in_repository(path: str) -> bool:
    if path == DEFAULT_LEDGER:
        return True
    resolved = (ROOT / path).resolve()
    return not Path(path).is_absolute() and resolved.is_relative_to(ROOT) and resolved.exists()


LINES = [line for page in PAGES for number, example in enumerate(sh_examples(page.read_text()))
         for line in lines_of(str(page.relative_to(ROOT)), number, example)]
RUNS = [Run(line, [b for b in LINES[:i] if (b.page, b.example) == (line.page, line.example) and not b.why_not_run])
        for i, line in enumerate(LINES) if not line.why_not_run]


def tillerman(args: list[str], home: Path) -> subprocess.CompletedProcess:
    """``tillerman ARGS`` from the repository's root, everything it keeps under ``home``."""
    ledger = home / "ledger.sqlite3"
    env = {**os.environ, "TILLERMAN_LEDGER": str(ledger), "HOME": str(home / "home"), "CODEX_HOME": str(home / "codex"),
           "XDG_STATE_HOME": str(home / "state"), "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_DATA_HOME": str(home / "data"), "XDG_CACHE_HOME": str(home / "cache")}
    args = [_expanded(word, {DEFAULT_LEDGER[1:]: str(ledger)}) for word in args]
    return subprocess.run([sys.executable, "-m", "tillerman.controller", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("run", RUNS, ids=[r.id for r in RUNS])
def test_each_example_that_can_run_here_exits_0(run: Run, tmp_path: Path) -> None:
    open_recorder(tmp_path / "ledger.sqlite3").close()  # the fresh ledger of a daemon's first start
    for line in [*run.before, run.line]:
        for args in line.commands:
            done = tillerman(args, tmp_path)
            assert done.returncode == 0, (f"{line.page}: `{line.text.strip()}` exited {done.returncode}\n"
                                          f"{done.stdout}{done.stderr}")


def test_the_examples_that_run_are_not_lost() -> None:
    assert len(RUNS) >= RUN_MINIMUM, [r.id for r in RUNS]
    ran = {shlex.join(c) for r in RUNS for c in r.line.commands}
    assert {"replay fixtures/sessions/codex-rollout/", "ledger verify", "rules show",
            "rules validate fixtures/disagreement/candidate.toml"} <= ran
    assert any(c.startswith("rules diff --against fixtures/") for c in ran)


@pytest.mark.parametrize(("line", "why"), [
    ("tillerman replay fixtures/sessions/codex-rollout/", None),
    ('tillerman replay --check "$TILLERMAN_LEDGER"', None),
    ("tillerman intents; tillerman status", None),
    ("tillerman replay --json fixtures/sessions/codex-rollout/ | jq .decisions_digest", "another program"),
    ("tillerman replay [--json] PATH...", "a usage line"),
    ("tillerman run --no-codex --watch fixtures/sessions", "live agent"),
    ("tillerman hooks uninstall --claude --user", "live agent"),
    ("tillerman replay ~/.codex/sessions", "home folder"),
    ("tillerman replay $SESSIONS", "variable"),
    ("tillerman intent propose --thread 019a… --mode steer --text hi", "elided"),
    ("tillerman intent propose --thread <session id> --mode steer --text hi", "elided"),
    ("tillerman intents --ledger postgresql://db/tillerman", "a server or a database"),
    ("tillerman status --ledger ledger.sqlite3", "its own ledger"),
    ("tillerman intent show in-3f2a9c0d1e2b4a5f6c7d", "names an intent"),
    ("tillerman replay --check changed.sqlite3", "not in the repository"),
    ("tillerman rules validate /etc/hostname", "not in the repository"),
    ("tillerman replay fixtures/../..", "not in the repository"),
    ("tillerman rules diff --against nowhere.toml fixtures/disagreement", "not in the repository"),
    ("tillerman ledger verify   # after someone edited a row", "a state"),
])
def test_the_rule_chooses_what_runs(line: str, why: str | None) -> None:
    [found] = lines_of("a page", 0, Example("a section", [line]))
    assert (found.why_not_run is None) if why is None else why in (found.why_not_run or ""), found.why_not_run


def test_an_example_that_exports_another_ledger_is_not_run() -> None:
    block = "export TILLERMAN_LEDGER=ledger.sqlite3\ntillerman status\n"
    [found] = lines_of("a page", 0, Example("a section", _commands_of(block)))
    assert found.why_not_run == "the example exports its own ledger"
