"""Dependencies point controller -> monitor/rules -> ledger: each module's imports, read
with ``ast`` (so an import inside a function counts too), stay within what its package
may use."""

import ast
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


def imported_packages(path: Path) -> set[str]:
    """The tillerman packages a module imports (``tillerman.X`` and ``from tillerman import X``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "tillerman" else [f"tillerman.{a.name}" for a in node.names]
        else:
            continue
        found.update(name.split(".")[1] for name in names if name.startswith("tillerman.") and name.count(".") >= 1)
    return found & set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_the_ones_below_it(package: str) -> None:
    modules = sorted((ROOT / package).glob("*.py"))
    assert modules
    wrong = {f"{package}/{m.name} imports {sorted(bad)}"
             for m in modules if (bad := imported_packages(m) - ALLOWED[package] - {package})}
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package]) or 'nothing of ours'}: {sorted(wrong)}"


def test_the_check_sees_every_import_form(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import tillerman.rules.files\nfrom tillerman.monitor.x import y\n"
                      "from tillerman import controller\ndef f():\n    import tillerman.ledger\n")
    assert imported_packages(module) == {"rules", "monitor", "controller", "ledger"}
