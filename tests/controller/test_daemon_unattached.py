"""A daemon whose app-server is not there yet still reports what is overdue: the
connection is one task among others, and nothing waits for it."""

from __future__ import annotations

import json
import time

import anyio

from controller import intents
from controller.daemon import Daemon, DaemonOptions
from ledger.sqlite import SQLiteRecorder
from rules.ruleset import Grant, build_ruleset

ANN_MAY_QUEUE = build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"queue"})),))


def test_an_overdue_intent_is_reported_while_the_server_is_unreachable(tmp_path):
    notices = tmp_path / "notices.jsonl"
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        # allowed, decided, never sent (no server): its acknowledgement deadline went by
        late = intents.propose(recorder, now=time.time() - 10, thread_id="T1", mode="queue", text="later",
                               owner="ann", ack_deadline=1.0)
        daemon = Daemon(recorder, ANN_MAY_QUEUE, DaemonOptions(
            url=f"unix://{tmp_path}/nobody-listens.sock", default_socket=True, on_overdue=f"cat >> {notices}"))

        async def run():
            with anyio.fail_after(20):  # a daemon that waited for its server would never start
                async with anyio.create_task_group() as tg:
                    await tg.start(daemon.run)
                    while not (notices.exists() and notices.read_text().strip()):
                        await anyio.sleep(0.05)
                    assert not daemon.connected.is_set() and "nobody-listens.sock" in (daemon.link.url or "")
                    assert daemon.link.error  # and it knows why it is not connected
                    tg.cancel_scope.cancel()

        anyio.run(run)
    assert json.loads(notices.read_text().splitlines()[0])["intent"] == late.id


def test_a_head_anchor_that_could_not_be_moved_is_logged_once(tmp_path, caplog):
    (tmp_path / "sessions").mkdir()
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        daemon = Daemon(recorder, ANN_MAY_QUEUE, DaemonOptions(watch=(str(tmp_path / "sessions"),)))

        async def run():
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                recorder.anchor_error = "the head anchor was not moved to seq 7 (No space left on device)"
                with anyio.fail_after(10):
                    while "No space left" not in caplog.text:
                        await anyio.sleep(0.05)
                await anyio.sleep(1.2)  # more rounds go by
                tg.cancel_scope.cancel()

        anyio.run(run)
    assert caplog.text.count("No space left") == 1
