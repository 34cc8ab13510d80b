"""Dependencies point one way. Between the four packages: controller -> monitor/rules ->
ledger. Inside controller/, between its sub-packages: the pure core at the bottom, the
command line at the top (``CONTROLLER``). Every module of every package is read with
``ast``, sub-packages included, so an import inside a function (or under
``TYPE_CHECKING``) counts too: a lazy import is still an arrow."""

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: What each package may import of tillerman besides itself.
ALLOWED = {
    "ledger": set(),
    "rules": {"ledger"},
    "monitor": {"ledger"},
    "controller": {"ledger", "rules", "monitor"},
}
#: What each sub-package of controller/ may import of controller/ besides itself.
CONTROLLER = {
    "core": set(),  # pure: the decisions, written once
    "dispatch": {"core"},
    "claude": {"core", "dispatch"},
    "review": {"core"},
    "notify": {"core"},
    "report": {"core"},
    "codex": {"core"},
    "replay": {"core", "review"},
    "daemon": {"core", "dispatch", "claude", "review", "notify", "report"},  # report: --metrics counts usage as it does
    # the web page: reads as report and status do, acts through core as the CLI does
    "dashboard": {"core", "report", "notify"},
    "cli": {"core", "dispatch", "claude", "review", "notify", "report", "codex", "replay", "daemon", "dashboard"},
}
#: The only modules at controller/'s top: entry points people run by path.
CONTROLLER_TOP = {"__init__": set(), "__main__": {"cli"}, "claude_hook": {"claude"}}


def module_name(path: Path, root: Path) -> str:
    """``controller/core/delivery.py`` -> ``tillerman.controller.core.delivery``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(("tillerman", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every dotted tillerman name a module imports, anywhere in it. ``from X import y``
    gives ``X`` and ``X.y`` (``y`` may be a module); a relative import is resolved."""
    own = module_name(path, root).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("tillerman.")}


def imported_packages(path: Path, root: Path = ROOT) -> set[str]:
    """The tillerman packages a module imports (``tillerman.X`` and ``from tillerman import X``)."""
    return {name.split(".")[1] for name in imported_modules(path, root)} & set(ALLOWED)


def imported_subpackages(path: Path, root: Path = ROOT) -> set[str]:
    """The controller sub-packages (and top modules) a module imports."""
    return {name.split(".")[2] for name in imported_modules(path, root)
            if name.startswith("tillerman.controller.")}


def package_violations(package: str, root: Path = ROOT) -> set[str]:
    return {f"{module.relative_to(root)} imports {sorted(bad)}"
            for module in sorted((root / package).rglob("*.py"))
            if (bad := imported_packages(module, root) - ALLOWED[package] - {package})}


def controller_violations(root: Path = ROOT) -> set[str]:
    """Each controller module against the table of the sub-package it is in."""
    wrong = set()
    for module in sorted((root / "controller").rglob("*.py")):
        where = module.relative_to(root / "controller").parts
        allowed = CONTROLLER.get(where[0], set()) if len(where) > 1 else CONTROLLER_TOP.get(module.stem, set())
        own = {where[0]} if len(where) > 1 else set()
        if bad := imported_subpackages(module, root) - allowed - own:
            wrong.add(f"{module.relative_to(root)} imports {sorted(bad)}")
    return wrong


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_the_ones_below_it(package: str) -> None:
    assert list((ROOT / package).rglob("*.py"))
    wrong = package_violations(package)
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package]) or 'nothing of ours'}: {sorted(wrong)}"


def test_each_controller_subpackage_imports_only_the_ones_below_it() -> None:
    wrong = controller_violations()
    assert not wrong, f"allowed: {CONTROLLER}; found: {sorted(wrong)}"


def test_every_controller_module_is_in_a_subpackage_of_the_table() -> None:
    """A new folder or a new top module would escape the table: each must be named in it."""
    folders = {p.name for p in (ROOT / "controller").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(CONTROLLER)
    assert {p.stem for p in (ROOT / "controller").glob("*.py")} == set(CONTROLLER_TOP)
    assert not [p for p in (ROOT / "controller").glob("*/*/*.py")], "one level of sub-packages"
    assert all((ROOT / "controller" / folder / "__init__.py").is_file() for folder in folders)


def test_the_subpackage_order_has_no_circle() -> None:
    order = list(graphlib.TopologicalSorter(CONTROLLER).static_order())  # CycleError on a circle
    assert order[0] == "core" and order[-1] == "cli"


def test_the_check_sees_every_import_form(tmp_path: Path) -> None:
    module = tmp_path / "controller" / "daemon" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text("import tillerman.rules.files\nfrom tillerman.monitor.x import y\n"
                      "from tillerman import controller\ndef f():\n    import tillerman.ledger\n"
                      "from tillerman.controller import replay\nfrom ..cli import main\n"
                      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from tillerman.controller.report.fold import Facts\n")
    assert imported_packages(module, tmp_path) == {"rules", "monitor", "controller", "ledger"}
    assert imported_subpackages(module, tmp_path) == {"replay", "cli", "report"}


def test_a_core_module_that_imports_a_shell_fails_the_check(tmp_path: Path) -> None:
    core = tmp_path / "controller" / "core"
    core.mkdir(parents=True)
    (core / "pure.py").write_text("from tillerman.controller.core import delivery\n\n\ndef later():\n"
                                  "    from tillerman.controller.daemon.daemon import Daemon\n")
    (tmp_path / "controller" / "stray.py").write_text("import tillerman.controller.core.delivery\n")
    assert controller_violations(tmp_path) == {"controller/core/pure.py imports ['daemon']",
                                              "controller/stray.py imports ['core']"}
