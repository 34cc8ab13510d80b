"""The daemon's other ways of running, against the real app-server: ``--dry-run``
decides and records but never dispatches; ``tillerman shim`` carries a stdio harness
onto the shared server; ``tillerman status`` tells who owns the ledger and what it sees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.codex_server import AppServer, codex_version
from fixtures.rule_texts import ANN_STEERS_ANYWHERE
from tests.live.daemon_support import ruleset_from, session, wait_until
from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests

pytestmark = [pytest.mark.live, pytest.mark.anyio]

GRANT = ANN_STEERS_ANYWHERE


async def test_dry_run_decides_and_records_but_never_dispatches(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, "", GRANT), dry_run=True)
        thread, turn = await s.start_command(workspace, "RUN: sleep 2")
        intent = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer", owner="ann",
                                 text="dry run: would steer")
        view = await wait_until(lambda: (v := s.intent(intent.id)).last_decision and v, "a decision")
        assert view.last_decision == ("steer", "authorized") and view.state == "proposed"
        assert await s.turn_completed(thread, turn) == "completed"
        assert s.intent(intent.id).state in ("proposed", "expired")  # never dispatched
        assert s.sent("turn/steer") == []


def test_shim_carries_a_stdio_harness_to_the_shared_server(app_server: AppServer, workspace: Path) -> None:
    lines = [
        {"id": 1, "method": "initialize", "params": {"clientInfo": {"name": "stdio-harness", "version": "1"},
                                                     "capabilities": {"experimentalApi": True}}},
        {"method": "initialized"},
        {"id": 2, "method": "thread/start", "params": {"cwd": str(workspace)}},
    ]
    proc = subprocess.Popen([sys.executable, "-m", "tillerman.controller", "shim", str(app_server.socket_path),
                             "app-server", "-c", "ignored=1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for line in lines:
            proc.stdin.write(json.dumps(line) + "\n")
            proc.stdin.flush()
        answers = {}
        while 2 not in answers:
            message = json.loads(proc.stdout.readline())
            if "id" in message:
                answers[message["id"]] = message
        assert "result" in answers[1] and answers[2]["result"]["thread"]["id"]
        proc.stdin.close()  # the harness is done: the shim exits
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_shim_says_when_the_server_is_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["shim", str(tmp_path / "nothing.sock")])
    assert result.exit_code == 2 and "is the shared app-server running?" in result.output


async def test_status_shows_the_daemon_threads_and_intents(app_server: AppServer, workspace: Path,
                                                           tmp_path: Path) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, "", GRANT))
        thread, turn = await s.start_command(workspace, "RUN: sleep 2")
        intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="queue", owner="nobody",
                        text="later")
        s.daemon._heartbeat(s.daemon.clock())
        result = CliRunner().invoke(main, ["status", "--json", "--ledger", str(tmp_path / "ledger.sqlite3")])
        assert result.exit_code == 0, result.output
        status = json.loads(result.output)
        (seen,) = [t for t in status["threads"] if t["thread"] == thread]
        assert seen["steerable"] and seen["active_turn"] == turn and seen["critical_tool"] is False
        codex = status["daemon"]["codex"]
        assert codex["url"] == app_server.url and codex["connected"]
        assert codex["server_version"] == ".".join(map(str, codex_version())) and codex["client_name"] == "tillerman"
        assert codex["originator"] == "harness" and codex["initialized_first"] is False  # the harness came first
        assert codex["server_version_checked"] is True  # the releases the live tests run are checked ones
        assert status["daemon"]["heartbeat"] and status["open_intents"] >= 0
