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


# -- the design document: in the repository, and every citation of it resolves ----------

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
CODE_FOLDERS = ("ledger", "rules", "monitor", "controller", "bench", "tests", "fixtures", "tillerman")
#: docs/design.md "Section name" (a code comment or docstring citing one section)
CITATION = re.compile(r'docs/design\.md\s*(?:#:\s*)?"([^"]+)"')


def _design_headings() -> set[str]:
    return {line.lstrip("#").strip() for line in DESIGN.read_text().splitlines() if line.startswith("#")}


def _code_files():
    this_test = Path(__file__).resolve()  # it names both, to look for them
    for folder in CODE_FOLDERS:
        yield from (p for p in (ROOT / folder).rglob("*.py") if p != this_test)


def test_code_cites_the_design_document_in_the_repository_by_an_existing_section() -> None:
    headings = _design_headings()
    cited = 0
    for path in _code_files():
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        assert "DESIGN.md" not in text, f"{where} cites DESIGN.md, which is not in the repository"
        mentions = text.count("docs/design.md")
        sections = CITATION.findall(text)
        assert len(sections) == mentions, f"{where}: every docs/design.md citation names its section in quotes"
        for section in sections:
            assert section in headings, f"{where} cites docs/design.md {section!r}, which has no such heading"
        cited += mentions
    assert cited >= 6


def test_the_citation_check_finds_a_missing_section() -> None:
    assert CITATION.findall('(docs/design.md "No such section")') == ["No such section"]
    assert "No such section" not in _design_headings()
