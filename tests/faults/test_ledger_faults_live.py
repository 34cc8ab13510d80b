"""The ledger is locked by another writer: the daemon dispatches nothing while it cannot
record, says why, and delivers once the ledger is writable again (real app-server)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import (
    AppServer,
    held_command,
    is_item,
    is_notification,
    start_command,
    watched_connection,
)
from tillerman.controller.core.intent_requests import intent_view, propose
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.ruleset import Grant, build_ruleset

pytestmark = [pytest.mark.live, pytest.mark.anyio]

GRANTS = build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"steer"})),))


async def test_busy_ledger_holds_dispatch_then_delivers_once(
    app_server: AppServer, workspace: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.sqlite3"
    async with watched_connection(app_server.url, client_name="harness") as (harness, log):
        gate = workspace / "gate"
        thread, turn = await start_command(harness, log, workspace, held_command(gate))
        with SQLiteRecorder(path) as rec:
            intent = propose(rec, thread_id=thread, expected_turn=turn, mode="steer", owner="ann",
                             text="BUSYTEST: finish this command, then stop.")
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds the ledger
        recorder = SQLiteRecorder(path, busy_timeout_ms=100)
        daemon = Daemon(recorder, GRANTS, DaemonOptions(url=app_server.url))
        caplog.set_level(logging.ERROR, logger="tillerman")
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            await anyio.sleep(1.5)
            # nothing may leave while nothing can be recorded
            assert intent_view(recorder, intent.id).state == "proposed"
            assert not [m for m in log.messages if is_item("item/started", "userMessage",
                                                           clientId=intent.client_user_message_id)(m)]
            assert "ledger not writable" in caplog.text
            blocker.execute("ROLLBACK")
            with anyio.fail_after(20):  # the server took the steer into the running turn
                while intent_view(recorder, intent.id).state not in ("queued", "acknowledged"):
                    await anyio.sleep(0.05)
            gate.touch()  # only now may the command end: the model reads the steer after it
            with anyio.fail_after(20):
                while intent_view(recorder, intent.id).state != "acknowledged":
                    await anyio.sleep(0.05)
            await log.wait_for(is_notification("turn/completed", threadId=thread), timeout=20)
            tg.cancel_scope.cancel()
    echoes = [m for m in log.messages
              if is_item("item/completed", "userMessage", clientId=intent.client_user_message_id)(m)]
    assert len(echoes) == 1 and echoes[0].params["turnId"] == turn
    assert recorder.verify().ok
    recorder.close()
