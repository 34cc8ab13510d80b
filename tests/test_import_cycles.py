"""No import circle among our own modules. Every module of ledger/, rules/, monitor/ and
controller/ (sub-packages included) is read with ``ast``, so an import inside a function
is an arrow too: cutting a circle by moving an import into a function still leaves the
two modules each needing the other. Third-party modules are not in the graph (a lazy
``import psycopg`` is no circle)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ledger", "rules", "monitor", "controller")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """``tillerman.<package>.<...>`` -> its file, for every module of the four packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("tillerman", *parts))] = path
    return found


def imported_names(path: Path, module: str) -> Iterator[str]:
    """Every dotted name a module imports, anywhere in it; ``from X import y`` yields
    ``X.y`` (a module when ``y`` is one) and ``X``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, up level - 1
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (for each name, the most specific module
    it is or lies in). A package whose ``__init__`` imports nothing is a node with no
    arrows out, so naming it (``from tillerman.ledger import events``) closes no circle."""
    files = module_files(root)
    graph = {}
    for module, path in files.items():
        targets = set()
        for name in imported_names(path, module):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle as the list of its modules, the first repeated at the end; None if none."""
    finished: set[str] = set()

    def walk(path: list[str]) -> list[str] | None:
        for successor in sorted(graph.get(path[-1], ())):
            if successor in path:
                return path[path.index(successor):] + [successor]
            if successor not in finished and (cycle := walk([*path, successor])):
                return cycle
        finished.add(path[-1])
        return None

    return next((cycle for start in sorted(graph) if start not in finished and (cycle := walk([start]))), None)


def test_no_import_circle_among_our_modules() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_graph_counts_function_level_and_relative_imports(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text('"""docstring only"""\n')
    (tmp_path / "ledger" / "sub").mkdir()
    (tmp_path / "ledger" / "sub" / "__init__.py").write_text("")
    (tmp_path / "ledger" / "a.py").write_text("from tillerman.ledger import b\n")
    (tmp_path / "ledger" / "b.py").write_text("def f():\n    from tillerman.ledger.sub.c import x\n")
    (tmp_path / "ledger" / "sub" / "c.py").write_text("def g():\n    from .. import a\n")
    graph = import_graph(tmp_path)
    assert graph["tillerman.ledger.b"] == {"tillerman.ledger.sub.c"}
    assert find_cycle(graph) == ["tillerman.ledger.a", "tillerman.ledger.b", "tillerman.ledger.sub.c",
                                 "tillerman.ledger.a"]
    (tmp_path / "ledger" / "sub" / "c.py").write_text("import json\n")
    assert find_cycle(import_graph(tmp_path)) is None
