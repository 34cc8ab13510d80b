"""A bare ``tillerman run`` as a Codex user runs it: no --codex, no config file.

Started before Codex's shared server exists, it says in one line how to start it, keeps
retrying, and meanwhile follows --watch files and beats (``status`` shows it
connecting). Once the shared server listens on ``$CODEX_HOME``'s control socket it
attaches by itself, under the TUI's name; the owner's steer, proposed with no
configuration at all, is delivered once into its turn and acknowledged.
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
from click.testing import CliRunner

from controller.cli import main
from fixtures.codex_server import is_item, is_notification, make_codex_home, watched_connection
from fixtures.scripted_model import ScriptedModel
from fixtures.tui import DefaultSocketServer, default_socket
from ledger.sqlite import SQLiteRecorder
from tests.monitor.tailer_support import append, facts, rollout_name, session_meta

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def _cli(*args: str) -> dict | list:
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _status(ledger: Path) -> dict:
    """``status --json``; {} while the daemon has not created its ledger yet."""
    result = CliRunner().invoke(main, ["status", "--json", "--ledger", str(ledger)])
    return json.loads(result.output) if result.exit_code == 0 else {"daemon": {}, "threads": []}


def _until(probe: Callable[[], T], what: str, proc: subprocess.Popen, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert proc.poll() is None, f"the daemon exited: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_a_bare_run_waits_for_codexs_shared_server_then_delivers_the_owners_steer(
        scripted_model: ScriptedModel, tmp_path: Path) -> None:
    home = make_codex_home(scripted_model.base_url)
    workspace = home / "ws"
    workspace.mkdir()
    sessions, ledger = tmp_path / "sessions", tmp_path / "ledger.sqlite3"
    sessions.mkdir()
    env = dict(os.environ, CODEX_HOME=str(home))  # XDG_CONFIG_HOME is empty: no config file
    socket_url = f"unix://{default_socket(home)}"
    proc = subprocess.Popen([sys.executable, "-m", "controller", "run", "--watch", str(sessions),
                             "--ledger", str(ledger)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # Nothing listens yet: the daemon beats and says it is connecting ...
        codex = _until(lambda: _status(ledger)["daemon"].get("codex"), "a heartbeat", proc)
        assert codex["url"] == socket_url and not codex["connected"] and "No such file" in codex["error"]
        assert _status(ledger)["daemon"]["pid"] == proc.pid
        # ... and follows the session files meanwhile.
        append(sessions / rollout_name(), session_meta())
        with SQLiteRecorder(ledger) as reader:
            _until(lambda: facts(reader), "the session file to be followed", proc)
        time.sleep(1.5)  # several retries go by

        with DefaultSocketServer(home, workspace):
            codex = _until(lambda: (c := _status(ledger)["daemon"]["codex"])["connected"]
                           and c, "the daemon to attach", proc)
            assert codex["client_name"] == "codex-tui" and codex["server_version"]
            steer = anyio.run(_owner_steers_a_running_turn, socket_url, ledger, workspace, proc)
        assert steer["state"] == "acknowledged"
        assert steer["owner"] == _cli("rules", "show")["grants"][0]["subject"].removeprefix("owner:")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    assert proc.returncode == 0, err
    hints = [line for line in err.splitlines() if "codex app-server daemon start" in line]
    assert len(hints) == 1, err  # one line per outage, not one per retry
    assert "Traceback" not in err


async def _owner_steers_a_running_turn(url: str, ledger: Path, workspace: Path, proc: subprocess.Popen) -> dict:
    """A harness runs a long command; the owner's steer, proposed with no --owner and no
    config, reaches that turn exactly once."""
    async with watched_connection(url, client_name="harness") as (harness, log):
        thread = (await harness.request("thread/start", {"cwd": str(workspace)}))["thread"]["id"]
        turn = (await harness.request("turn/start", {"threadId": thread, "input": [
            {"type": "text", "text": "RUN: sleep 4"}]}))["turn"]["id"]
        await log.wait_for(is_item("item/started", "commandExecution"), timeout=30)
        with anyio.fail_after(30):
            while not any(t["thread"] == thread and t["active_turn"] == turn
                          for t in _status(ledger)["threads"]):
                assert proc.poll() is None
                await anyio.sleep(0.1)
        proposed = _cli("intent", "propose", "--thread", thread, "--expected-turn", "active", "--mode", "steer",
                        "--text", "Also list the workspace when the command ends.", "--ledger", str(ledger))
        assert proposed["expected_turn"] == turn
        with anyio.fail_after(30):
            while (shown := _cli("intent", "show", proposed["id"], "--ledger", str(ledger)))["state"] != "acknowledged":
                assert shown["state"] not in ("expired", "rejected"), shown
                await anyio.sleep(0.1)
        await log.wait_for(is_notification("turn/completed", threadId=thread), timeout=30)
    echoes = [m for m in log.messages if is_item("item/completed", "userMessage",
                                                  clientId=f"tillerman-{proposed['id']}")(m)]
    assert [m.params["turnId"] for m in echoes] == [turn]
    return shown
