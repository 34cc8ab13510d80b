"""Every command has help that ends in an example, and README.md documents it."""

import re
from pathlib import Path

import click
import pytest

from tillerman.controller.cli import main

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _commands(group: click.Group, prefix: str = "tillerman"):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the lazily loaded ones too
        command = group.get_command(ctx, name)
        path = f"{prefix} {name}"
        if isinstance(command, click.Group):
            yield from _commands(command, path)
        else:
            yield path, command


COMMANDS = list(_commands(main))


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_each_command_has_help_with_an_example(path, command):
    assert command.help and "Example:" in command.help, path


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_each_command_is_in_the_readme(path, command):
    *group, name = path.split()
    # documented alone (`tillerman intents`) or in a group heading (`tillerman intent propose | cancel`)
    listed = re.escape(" ".join(group)) + r" (?:[a-z-]+ \| )*" + re.escape(name) + r"\b"
    assert re.search(listed, README), path
