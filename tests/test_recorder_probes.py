"""Outside ``ledger/`` a recorder is used through its interface: what only some backends
can do is declared on ``Recorder`` with a default (``tillerman.ledger.recorder``), so no
module asks a recorder's type (``isinstance``) or probes it for a member by name
(``getattr``/``hasattr`` with a recorder member's name). A wrapper that hands every
member on (``getattr(self._recorder, name)``, the name a variable) probes nothing."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE_THE_LEDGER = ("rules", "monitor", "controller")


def recorder_classes(ledger: Path = ROOT / "ledger") -> dict[str, set[str]]:
    """Every recorder class of ``ledger/`` (``Recorder`` and what derives from it, by
    name) -> the members it defines."""
    classes: dict[str, ast.ClassDef] = {}
    for path in sorted(ledger.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node
    found = {"Recorder"}
    while grown := {name for name, node in classes.items() if name not in found
                    and any(isinstance(base, ast.Name) and base.id in found for base in node.bases)}:
        found |= grown
    return {name: _members(classes[name]) for name in found}


def _members(node: ast.ClassDef) -> set[str]:
    members = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            members.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.add(item.target.id)
        elif isinstance(item, ast.Assign):
            members.update(target.id for target in item.targets if isinstance(target, ast.Name))
    return members - {"__init__", "__enter__", "__exit__"}


def probes(path: Path, classes: dict[str, set[str]], root: Path = ROOT) -> list[str]:
    """Where a module asks a recorder's type or probes it for a member by name."""
    members = set().union(*classes.values())
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        name, args = node.func.id, node.args
        if name == "isinstance" and len(args) == 2 and _names(args[1]) & classes.keys():
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
        elif (name in ("getattr", "hasattr") and len(args) >= 2 and isinstance(args[1], ast.Constant)
              and args[1].value in members):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def _names(node: ast.expr) -> set[str]:
    """The class names an ``isinstance`` second argument holds (a name, a dotted name, a tuple, ``A | B``)."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple):
        return set().union(*map(_names, node.elts))
    if isinstance(node, ast.BinOp):
        return _names(node.left) | _names(node.right)
    return set()


def test_no_module_outside_the_ledger_probes_a_recorder() -> None:
    classes = recorder_classes()
    found = [probe for package in OUTSIDE_THE_LEDGER for path in sorted((ROOT / package).rglob("*.py"))
             for probe in probes(path, classes)]
    assert not found, "declare it on Recorder (with its default) and call it:\n" + "\n".join(found)


def test_the_check_sees_a_type_question_and_a_probe_by_name(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    (ledger / "backends.py").write_text("class Recorder:\n    path = ''\n    def read(self): ...\n"
                                        "class FileRecorder(Recorder):\n    def leases(self): ...\n"
                                        "class Elsewhere:\n    def feed(self): ...\n")
    classes = recorder_classes(ledger)
    assert classes == {"Recorder": {"path", "read"}, "FileRecorder": {"leases"}}
    module = tmp_path / "m.py"
    module.write_text("isinstance(r, (int, backends.FileRecorder))\nisinstance(r, dict)\n"
                      "getattr(r, 'leases', None)\nhasattr(r, 'feed')\ngetattr(self._recorder, name)\n")
    assert probes(module, classes, tmp_path) == [
        "m.py:1: isinstance(r, (int, backends.FileRecorder))", "m.py:3: getattr(r, 'leases', None)"]
