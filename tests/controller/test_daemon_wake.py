"""The daemon wakes on another process's ledger write (the WAL watcher), whatever form
the ledger path was given in: a relative path once left it to the slow safety poll."""

from __future__ import annotations

import anyio
import pytest

import controller.daemon as daemon_module
from controller import intents
from controller.daemon import Daemon, DaemonOptions
from ledger.sqlite import SQLiteRecorder
from rules.files import default_ruleset


@pytest.mark.parametrize("relative", [True, False])
def test_a_proposal_from_another_process_wakes_the_daemon(tmp_path, monkeypatch, relative):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(daemon_module, "POLL_INTERVAL", 60.0)  # only the watcher can wake it in time
    (tmp_path / "sessions").mkdir()
    given = "ledger.sqlite3" if relative else str(tmp_path / "ledger.sqlite3")

    async def run():
        with SQLiteRecorder(given) as recorder:
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions(watch=(str(tmp_path / "sessions"),)))
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                await anyio.sleep(0.5)  # the first round (every open intent decided once) is over
                with SQLiteRecorder(tmp_path / "ledger.sqlite3") as other:
                    intent = intents.propose(other, thread_id="T1", mode="queue", text="later", owner="ann")
                with anyio.fail_after(10):  # far below the poll: the watcher woke it
                    while intent.id not in daemon.projection.intents:
                        await anyio.sleep(0.02)
                tg.cancel_scope.cancel()

    anyio.run(run)
