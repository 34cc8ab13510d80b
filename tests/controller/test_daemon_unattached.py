"""A daemon whose app-server is not there yet still reports what is overdue: the
connection is one task among others, and nothing waits for it."""

from __future__ import annotations

import json
import time

import anyio

from tillerman.controller.core import intent_requests
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.ruleset import Grant, build_ruleset

ANN_MAY_QUEUE = build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"queue"})),))


def test_an_overdue_intent_is_reported_while_the_server_is_unreachable(tmp_path):
    notices = tmp_path / "notices.jsonl"
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        # allowed, decided, never sent (no server): its acknowledgement deadline went by
        late = intent_requests.propose(recorder, now=time.time() - 10, thread_id="T1", mode="queue", text="later",
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


def test_a_cut_tail_holds_every_decision_until_a_person_accepts_it(tmp_path, caplog):
    """Rows cut off the ledger's tail (or lost to a power cut) are not history the daemon
    may build on: it records nothing — so it dispatches nothing — until `ledger
    accept-tail` puts the shorter history on record."""
    from click.testing import CliRunner

    from tests.ledger.test_ledger_faults import cut_tail
    from tillerman.controller.cli.main import main

    ledger = tmp_path / "ledger.sqlite3"
    (tmp_path / "sessions").mkdir()
    with SQLiteRecorder(ledger) as recorder:
        intent = intent_requests.propose(recorder, thread_id="T1", mode="queue", text="later", owner="ann")
        intent_requests.propose(recorder, thread_id="T2", mode="queue", text="cut off", owner="ann")
    cut_tail(ledger, 1)  # the second proposal is gone; the anchor still names it
    with SQLiteRecorder(ledger) as recorder:
        daemon = Daemon(recorder, ANN_MAY_QUEUE, DaemonOptions(watch=(str(tmp_path / "sessions"),)))

        def decisions() -> int:
            return sum(1 for h in intent_requests.intent_view(recorder, intent.id).history if h.kind == "decision")

        async def run():
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                with anyio.fail_after(10):
                    while "accept-tail" not in caplog.text:
                        await anyio.sleep(0.05)
                await anyio.sleep(1.5)
                assert decisions() == 0  # held: nothing recorded, so nothing can be sent
                accepted = CliRunner().invoke(main, ["ledger", "accept-tail", "--ledger", str(ledger), "--by", "ann"])
                assert accepted.exit_code == 0, accepted.output
                with anyio.fail_after(10):
                    while decisions() == 0:
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()

        anyio.run(run)
