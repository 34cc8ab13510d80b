"""The wheel installs one top-level package, ``tillerman``: the four folders at the top
of the repository become ``tillerman.ledger``, ``tillerman.rules``, ``tillerman.monitor``
and ``tillerman.controller``, so a distribution that owns one of those bare names (PyPI's
``rules`` is django-rules) installs beside it and neither overwrites the other."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.installs import fresh_venv


def _top_level(paths: list[str]) -> set[str]:
    return {p.split("/", 1)[0] for p in paths if not p.split("/", 1)[0].endswith(".dist-info")}


def test_the_wheel_holds_only_the_tillerman_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (info,) = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
        top_level = archive.read(f"{info}/top_level.txt").decode().split()
        recorded = [line.split(",", 1)[0] for line in archive.read(f"{info}/RECORD").decode().splitlines()]
        metadata = archive.read(f"{info}/METADATA").decode()
    assert _top_level(names) == {"tillerman"}
    assert _top_level(recorded) == {"tillerman"}
    assert top_level == ["tillerman"]
    for package in ("ledger", "rules", "monitor", "controller"):
        assert f"tillerman/{package}/__init__.py" in names
    assert "tillerman/rules/defaults.toml" in names  # the built-in rules travel as package data
    # declared dependencies are used ones: sqlite-utils writes `tillerman report --db` (controller/report/db.py)
    assert "Requires-Dist: sqlite-utils>=3.36" in metadata


def _run(command: list[str | Path], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture
def elsewhere(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder outside the source tree and an environment without its paths or a config file."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    (tmp_path / "cwd").mkdir()
    return tmp_path / "cwd", env


def test_tillerman_and_another_rules_package_install_side_by_side(
        wheel: Path, tmp_path_factory: pytest.TempPathFactory, elsewhere: tuple[Path, dict[str, str]]) -> None:
    cwd, env = elsewhere
    bin_dir = fresh_venv(tmp_path_factory.mktemp("beside-rules") / "venv", wheel, "rules")
    _run([bin_dir / "tillerman", "--help"], cwd, env)
    _run([bin_dir / "python", "-m", "tillerman", "--help"], cwd, env)
    # `import rules` is django-rules' package ...
    other = _run([bin_dir / "python", "-c", "import rules, rules.predicates; print(rules.__file__)"], cwd, env)
    assert Path(other.stdout.strip()).parent.name == "rules" and "tillerman" not in other.stdout
    # ... and tillerman still loads its own built-in rule file, the same one as this tree's.
    shown = json.loads(_run([bin_dir / "tillerman", "rules", "show", "--json"], cwd, env).stdout)
    here = json.loads(_run([sys.executable, "-m", "tillerman", "rules", "show", "--json"], ROOT, env).stdout)
    assert shown["rules"] and shown["digest"] == here["digest"]


def test_another_user_runs_the_installed_wheel_not_this_checkout(other_user) -> None:
    """The tests that run tillerman as another user must pass from a checkout in a private
    folder (0700, as a home directory is), which that user cannot enter: their tillerman
    is the wheel, in a folder they can read."""
    done = subprocess.run(other_user.command("-c", "import tillerman.controller as c; print(c.__file__)"), cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = Path(done.stdout.strip())
    assert not imported.is_relative_to(ROOT) and "site-packages" in imported.parts
    assert all(os.stat(folder).st_mode & 0o005 == 0o005 for folder in imported.parents)  # each one open to others
