"""No unused imports or names, no undefined names, no bugbear patterns (ruff, as
configured in pyproject.toml) anywhere in the project's code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise",
         "ledger", "rules", "monitor", "controller", "fixtures", "tests", "bench"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
