"""The systemd user unit and the launchd agent in the docs (Running as a service) parse, and run `tillerman run`."""

from __future__ import annotations

import configparser
import plistlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SECTION = (Path(__file__).resolve().parent.parent / "docs" / "operations" / "service.md").read_text()


def _block(language: str) -> str:
    return re.search(rf"```{language}\n(.*?)```", SECTION, re.S).group(1)


def test_the_launchd_agent_parses_and_runs_tillerman_run_at_login():
    agent = plistlib.loads(_block("xml").encode())
    assert agent["Label"] == "dev.tillerman.run" and agent["RunAtLoad"] is True
    assert Path(agent["ProgramArguments"][0]).name == "tillerman" and agent["ProgramArguments"][1] == "run"
    assert agent["KeepAlive"] == {"SuccessfulExit": False}


def test_the_systemd_unit_parses_and_runs_tillerman_run_at_login():
    unit = configparser.ConfigParser(interpolation=None)
    unit.optionxform = str
    unit.read_string(_block("ini"))
    command = unit["Service"]["ExecStart"].split()
    assert Path(command[0]).name == "tillerman" and command[1] == "run"
    assert unit["Install"]["WantedBy"] == "default.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    # the installed tillerman stands in for ~/.local/bin/tillerman, which verify checks exists
    tillerman = Path(sys.executable).with_name("tillerman")
    text = _block("ini").replace("%h/.local/bin/tillerman", str(tillerman))
    (tmp_path / "tillerman.service").write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "tillerman.service")],
                          capture_output=True, text=True, timeout=60)
    problems = [line for line in done.stderr.splitlines() if "tillerman.service" in line]
    assert done.returncode == 0 and problems == [], done.stderr
