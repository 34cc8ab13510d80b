"""No unused imports or names, no undefined names, no bugbear patterns, no bare package
names (ruff, as configured in pyproject.toml) anywhere in the project's code."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", *args],
                          cwd=ROOT, input=stdin, capture_output=True, text=True)


def test_ruff_finds_nothing():
    result = _ruff("tillerman", "ledger", "rules", "monitor", "controller", "fixtures", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("statement", ["import ledger", "from rules import policy", "import monitor.tailer",
                                       "from controller.cli import main"])
def test_ruff_bans_the_bare_package_names(statement: str):
    """The folders install as tillerman.*; a bare name would import another distribution's package."""
    result = _ruff("--stdin-filename", "probe.py", "-", stdin=f"{statement}\n")
    assert "TID251" in result.stdout, result.stdout + result.stderr
