"""SIGKILL the daemon in the middle of the dispatch protocol, restart it, and prove the
steer is settled by readback and delivered at most once (against the real app-server).

The daemon runs as a real ``tillerman run`` process; ``TILLERMAN_KILL_AT`` makes it kill
itself at a named point of the protocol (``tillerman.controller.dispatch.driver.CHECKPOINTS``):
``dispatch_recorded`` — the durable ``dispatch_unknown`` record is written, nothing
sent yet; ``dispatch_answered`` — the server accepted the steer, the answer is not yet
recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer, is_notification, start_command, watched_connection
from fixtures.rule_texts import ANN_STEERS_ANYWHERE
from fixtures.scripted_model import ScriptedModel
from tillerman.controller.core.intent_requests import intent_view, propose
from tillerman.ledger.sqlite import SQLiteRecorder

pytestmark = [pytest.mark.live, pytest.mark.anyio]

GRANTS = ANN_STEERS_ANYWHERE


def start_daemon(server: AppServer, ledger: Path, config: Path, kill_at: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("TILLERMAN_KILL_AT", None)
    if kill_at:
        env["TILLERMAN_KILL_AT"] = kill_at
    return subprocess.Popen(
        [sys.executable, "-m", "tillerman.controller", "run", "--codex", server.url, "--ledger", str(ledger),
         "--config", str(config)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


async def wait_for(predicate, timeout: float = 20.0):
    with anyio.fail_after(timeout):
        while not (value := predicate()):
            await anyio.sleep(0.05)
    return value


def state_of(ledger: Path, intent_id: str) -> str:
    with SQLiteRecorder(ledger) as rec:
        return intent_view(rec, intent_id).state


@pytest.mark.parametrize("kill_at", ["dispatch_recorded", "dispatch_answered"])
async def test_killed_mid_dispatch_then_settled_by_readback_at_most_once(
    kill_at: str, app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    ledger, config = tmp_path / "ledger.sqlite3", tmp_path / "config.toml"
    config.write_text(GRANTS)
    async with watched_connection(app_server.url, client_name="harness") as (harness, log):
        daemon = start_daemon(app_server, ledger, config, kill_at)
        try:
            # Long enough for a daemon starting on a loaded machine to dispatch within the turn.
            thread, turn = await start_command(harness, log, workspace, "RUN: sleep 8")
            with SQLiteRecorder(ledger) as rec:
                intent = propose(rec, thread_id=thread, expected_turn=turn, mode="steer", owner="ann",
                                 text=f"KILLTEST {kill_at}: stop after this command.")
            # the daemon picks it up, records the dispatch and dies at the checkpoint
            returncode = await wait_for(lambda: daemon.poll(), timeout=20)
            assert returncode == -signal.SIGKILL, daemon.stderr.read().decode()[-2000:]
            assert state_of(ledger, intent.id) == "dispatch_unknown"

            restarted = start_daemon(app_server, ledger, config)
            try:
                final = await wait_for(lambda: (s := state_of(ledger, intent.id)) in
                                       ("acknowledged", "expired") and s, timeout=30)
                await log.wait_for(is_notification("turn/completed", threadId=thread), timeout=20)
            finally:
                restarted.send_signal(signal.SIGTERM)
                assert restarted.wait(10) == 0
        finally:
            if daemon.poll() is None:
                daemon.kill()
            daemon.wait()

        # What the server holds: our clientId appears at most once, and only in the expected turn.
        turns = (await harness.request("thread/turns/list", {"threadId": thread, "limit": 10,
                                                             "itemsView": "full"}))["data"]
    ours = [(t["id"], item) for t in turns for item in t.get("items", [])
            if item.get("type") == "userMessage" and item.get("clientId") == intent.client_user_message_id]
    delivered_to_model = sum(1 for r in scripted_model.requests if r.last_user_text and "KILLTEST " + kill_at
                             in r.last_user_text and not r.tool_output_call_id)
    if kill_at == "dispatch_recorded":
        # Never sent: restart never resends; the turn's end settles it as not delivered.
        assert ours == [] and final == "expired" and delivered_to_model == 0
        assert intent_view(SQLiteRecorder(ledger), intent.id).history[-1].reason == "not_delivered"
    else:
        # Sent once before the crash: found by the echo or the readback, never sent again.
        assert final == "acknowledged" and len(ours) == 1 and ours[0][0] == turn
        assert intent_view(SQLiteRecorder(ledger), intent.id).history[-1].reason in ("echo", "readback_found")
    with SQLiteRecorder(ledger) as rec:
        report = rec.verify()
        assert report.ok, report.problems
        assert rec._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


async def test_a_second_daemon_on_the_same_ledger_refuses_to_start(app_server: AppServer, tmp_path: Path) -> None:
    ledger, config = tmp_path / "ledger.sqlite3", tmp_path / "config.toml"
    config.write_text(GRANTS)
    first = start_daemon(app_server, ledger, config)
    try:
        await wait_for(lambda: (tmp_path / "ledger.sqlite3.lock").exists() and time.sleep(0.5) is None)
        second = start_daemon(app_server, ledger, config)
        assert second.wait(20) == 2
        assert f"pid {first.pid}" in second.stderr.read().decode()
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(10) == 0
