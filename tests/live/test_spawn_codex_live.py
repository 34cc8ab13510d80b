"""``tillerman run --spawn-codex`` as a user runs it: a separate process that finds
``codex`` on PATH, starts the shared app-server, attaches, and reports the server's
version in ``tillerman status``; and, with no Codex anywhere, one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.codex_npm import codex_under_test
from fixtures.codex_server import make_codex_home
from fixtures.scripted_model import ScriptedModel
from tillerman.controller.cli.main import main
from tillerman.controller.codex.process import CODEX_BIN_ENV

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/bin:/bin"  # for the login shells Codex runs; no codex lives there


def _env(path: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != CODEX_BIN_ENV}  # only PATH may name the binary
    return dict(env, PATH=path, CODEX_HOME=str(home), HOME=str(home))


def _version(binary: Path) -> str:
    """``codex --version`` prints ``codex-cli 0.171.0``."""
    return subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]


def _status(ledger: Path) -> dict:
    """The daemon's app-server connection as ``status --json`` shows it ({} before the first beat)."""
    result = CliRunner().invoke(main, ["status", "--json", "--ledger", str(ledger)])
    return (json.loads(result.output)["daemon"].get("codex") or {}) if result.exit_code == 0 else {}


def test_spawn_codex_runs_the_codex_on_path_and_status_shows_its_version(
        scripted_model: ScriptedModel, tmp_path: Path) -> None:
    binary = codex_under_test()  # the release under test
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").symlink_to(binary)
    home = make_codex_home(scripted_model.base_url)
    ledger = tmp_path / "ledger.sqlite3"
    proc = subprocess.Popen([sys.executable, "-m", "tillerman.controller", "run", "--spawn-codex",
                             "--ledger", str(ledger)], cwd=ROOT, env=_env(f"{bin_dir}{os.pathsep}{SYSTEM_PATH}", home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (daemon := _status(ledger)).get("connected"):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the daemon never attached"
            time.sleep(0.2)
        assert daemon["server_version"] == _version(binary)
        assert daemon["originator"] == "tillerman"  # it initialized first, on a server of its own
        assert daemon["url"] == f"unix://{home}/app-server-control/tillerman.sock"
        text = CliRunner().invoke(main, ["status", "--ledger", str(ledger)]).output
        assert f"server {_version(binary)}" in text and "threads' originator tillerman" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    assert proc.returncode == 0, err
    assert out.startswith("app-server listening: unix://")


@pytest.mark.parametrize(("argv", "says"), [
    (["-m", "tillerman.controller", "run", "--spawn-codex", "--codex-bin", "/nonexistent/codex"],
     "--codex-bin /nonexistent/codex: no executable file there"),
    (["-m", "tillerman.controller", "run", "--spawn-codex"], "no codex binary on PATH"),
])
def test_without_codex_spawn_codex_says_so_in_one_line(tmp_path: Path, argv: list[str], says: str) -> None:
    proc = subprocess.run([sys.executable, *argv, "--ledger", str(tmp_path / "ledger.sqlite3")],
                          cwd=ROOT, env=_env(SYSTEM_PATH, tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and "Traceback" not in proc.stderr
    assert says in proc.stderr and "--codex-bin PATH" in proc.stderr
