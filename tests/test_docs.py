"""The documentation: every command has help that ends in an example, is described in the
docs pages and appears in the CLI reference generated from click; the site builds with
``mkdocs build --strict`` (a broken link or anchor fails); the design document is in the
repository and every citation of it resolves."""

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tillerman.controller.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: What a person reads: the README and every page of the site (their Markdown source).
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


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
def test_each_command_is_described_in_the_docs(path, command):
    *group, name = path.split()
    # documented alone (`tillerman intents`) or in a group heading (`tillerman intent propose | cancel`)
    listed = re.escape(" ".join(group)) + r" (?:[a-z-]+ \| )*" + re.escape(name) + r"\b"
    assert any(re.search(listed, page.read_text()) for page in PAGES), path


# -- the site: built strict, with the generated CLI reference --------------------------------


def build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about MkDocs 2.0
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    built = build_site(ROOT / "mkdocs.yml", site)
    assert built.returncode == 0, built.stderr
    return site


def test_the_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file() and (site / "design" / "index.html").is_file()


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The check above can fail: the same site with one link to an anchor that does not
    exist does not build."""
    copy = tmp_path / "copy"
    (copy / "docs").mkdir(parents=True)
    (copy / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    for page in DOCS.rglob("*"):
        if page.is_file():
            target = copy / "docs" / page.relative_to(DOCS)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(page.read_bytes())
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the ledger](concepts/ledger.md#no-such-section).\n")
    built = build_site(copy / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0 and "no-such-section" in built.stderr


def _cli_reference():
    """docs/cli_reference.py, the generator of the CLI reference page (not a package module)."""
    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_what_the_commands_print() -> None:
    generator = _cli_reference()
    assert generator.PAGE.read_text() == generator.render(), "run: python docs/cli_reference.py"


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_each_command_is_in_the_generated_cli_reference(site: Path, path, command):
    reference = (site / "reference" / "cli" / "index.html").read_text()
    assert f'id="{path.replace(" ", "-")}"' in reference, path
    ctx = click.Context(command, info_name=path.split()[-1], terminal_width=88, max_content_width=88)
    usage = command.collect_usage_pieces(ctx)
    assert html.escape(f"Usage: {path} {' '.join(usage)}".split("\n")[0][:60], quote=False) in reference, path


# -- the design document: in the repository, and every citation of it resolves ----------

DESIGN = DOCS / "design.md"
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
