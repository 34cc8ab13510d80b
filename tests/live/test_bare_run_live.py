"""A bare ``tillerman run`` as a Codex user runs it: no --codex, no config file.

Started before Codex's shared server exists, it says in one line how to start it, keeps
retrying, and meanwhile follows --watch files and beats (``status`` shows it
connecting). Once the shared server listens on ``$CODEX_HOME``'s control socket it
attaches by itself, under the TUI's name; the owner's steer, proposed with no
configuration at all, is delivered once into its turn and acknowledged.

Run twice: from the source tree, and as a new user has it — a wheel installed into a
fresh virtual environment without the dev extra, every command run from another
folder through the installed ``tillerman`` (plus ``run --spawn-codex`` with ``codex``
on PATH).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from fixtures.codex_npm import codex_under_test
from fixtures.codex_server import is_item, is_notification, make_codex_home, start_command, watched_connection
from fixtures.scripted_model import ScriptedModel
from fixtures.tui import DefaultSocketServer, default_socket
from tests.monitor.tailer_support import append, facts, rollout_name, session_meta
from tillerman.controller.codex.process import CODEX_BIN_ENV
from tillerman.ledger.sqlite import SQLiteRecorder

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class Tillerman:
    """The ``tillerman`` command: this source tree's, or an installed one's."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str]):
        self.command, self.cwd, self.env = command, cwd, env

    def spawn(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([*self.command, *args], cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def json(self, *args: str) -> dict | list | None:
        """A reporting command's ``--json`` answer; None when it exits non-zero."""
        done = subprocess.run([*self.command, *args, "--json"], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=60)
        assert "Traceback" not in done.stderr, done.stderr
        return json.loads(done.stdout) if done.returncode == 0 else None

    def status(self, ledger: Path) -> dict:
        """``status --json``; empty while the daemon has not created its ledger yet."""
        return self.json("status", "--ledger", str(ledger)) or {"daemon": {}, "threads": []}


@pytest.fixture(params=["source", "wheel"])
def tillerman(request: pytest.FixtureRequest, tmp_path: Path) -> Tillerman:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"))  # no config file anywhere
    if request.param == "source":
        return Tillerman([sys.executable, "-m", "tillerman.controller"], ROOT, env)
    bin_dir = request.getfixturevalue("installed")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env.pop("PYTHONPATH", None)
    return Tillerman([str(bin_dir / "tillerman")], elsewhere, env)


def _until(probe: Callable[[], T], what: str, proc: subprocess.Popen, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert proc.poll() is None, f"the daemon exited: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_a_bare_run_waits_for_codexs_shared_server_then_delivers_the_owners_steer(
        scripted_model: ScriptedModel, tmp_path: Path, tillerman: Tillerman) -> None:
    home = make_codex_home(scripted_model.base_url)
    workspace = home / "ws"
    workspace.mkdir()
    sessions, ledger = tmp_path / "sessions", tmp_path / "ledger.sqlite3"
    sessions.mkdir()
    tillerman.env["CODEX_HOME"] = str(home)
    socket_url = f"unix://{default_socket(home)}"
    proc = tillerman.spawn("run", "--watch", str(sessions), "--ledger", str(ledger))
    try:
        # Nothing listens yet: the daemon beats and says it is connecting ...
        codex = _until(lambda: tillerman.status(ledger)["daemon"].get("codex"), "a heartbeat", proc)
        assert codex["url"] == socket_url and not codex["connected"] and "No such file" in codex["error"]
        assert tillerman.status(ledger)["daemon"]["pid"] == proc.pid
        # ... and follows the session files meanwhile.
        append(sessions / rollout_name(), session_meta())
        with SQLiteRecorder(ledger) as reader:
            _until(lambda: facts(reader), "the session file to be followed", proc)
        time.sleep(1.5)  # several retries go by

        with DefaultSocketServer(home, workspace):
            codex = _until(lambda: (c := tillerman.status(ledger)["daemon"]["codex"])["connected"]
                           and c, "the daemon to attach", proc)
            assert codex["client_name"] == "codex-tui" and codex["server_version"]
            steer = anyio.run(_owner_steers_a_running_turn, tillerman, socket_url, ledger, workspace, proc)
            proc.send_signal(signal.SIGTERM)  # before the server goes: that would be an outage of its own
            out, err = proc.communicate(timeout=30)
        assert steer["state"] == "acknowledged"
        assert f"owner:{steer['owner']}" == tillerman.json("rules", "show")["grants"][0]["subject"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        shutil.rmtree(home, ignore_errors=True)
    assert proc.returncode == 0, err
    hints = [line for line in err.splitlines() if "codex app-server daemon start" in line]
    assert len(hints) == 1, err  # one line per outage, not one per retry
    assert "Traceback" not in err


async def _owner_steers_a_running_turn(tillerman: Tillerman, url: str, ledger: Path, workspace: Path,
                                       proc: subprocess.Popen) -> dict:
    """A harness runs a long command; the owner's steer, proposed with no --owner and no
    config, reaches that turn exactly once."""
    async with watched_connection(url, client_name="harness") as (harness, log):
        thread, turn = await start_command(harness, log, workspace, "RUN: sleep 9", timeout=30)
        with anyio.fail_after(30):
            while not any(t["thread"] == thread and t["active_turn"] == turn
                          for t in tillerman.status(ledger)["threads"]):
                assert proc.poll() is None
                await anyio.sleep(0.1)
        proposed = tillerman.json("intent", "propose", "--thread", thread, "--expected-turn", "active", "--mode", "steer",
                        "--text", "Also list the workspace when the command ends.", "--ledger", str(ledger))
        assert proposed["expected_turn"] == turn
        with anyio.fail_after(30):
            while (shown := tillerman.json("intent", "show", proposed["id"], "--ledger", str(ledger)))["state"] \
                    != "acknowledged":
                assert shown["state"] not in ("expired", "rejected"), shown
                await anyio.sleep(0.1)
        await log.wait_for(is_notification("turn/completed", threadId=thread), timeout=30)
    echoes = [m for m in log.messages if is_item("item/completed", "userMessage",
                                                  clientId=f"tillerman-{proposed['id']}")(m)]
    assert [m.params["turnId"] for m in echoes] == [turn]
    return shown


def test_the_installed_spawn_codex_runs_the_codex_on_path(
        scripted_model: ScriptedModel, tmp_path: Path, installed: Path) -> None:
    """A new user's `tillerman run --spawn-codex`, with only the wheel and `codex` on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").symlink_to(codex_under_test())
    home = make_codex_home(scripted_model.base_url)
    env = {k: v for k, v in os.environ.items() if k not in (CODEX_BIN_ENV, "PYTHONPATH")}
    env.update(PATH=f"{bin_dir}{os.pathsep}/usr/bin:/bin", CODEX_HOME=str(home), HOME=str(home))
    tillerman = Tillerman([str(installed / "tillerman")], tmp_path, env)
    ledger = tmp_path / "ledger.sqlite3"
    proc = tillerman.spawn("run", "--spawn-codex", "--ledger", str(ledger))
    try:
        codex = _until(lambda: (c := tillerman.status(ledger)["daemon"].get("codex")) and c["connected"] and c,
                       "the daemon to attach", proc, timeout=60)
        assert codex["url"] == f"unix://{home}/app-server-control/tillerman.sock" and codex["server_version"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert out.startswith("app-server listening: unix://")
