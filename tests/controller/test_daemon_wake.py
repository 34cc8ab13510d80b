"""The daemon wakes on another process's ledger write (the WAL watcher), whatever form
the ledger path was given in: a relative path once left it to the slow safety poll."""

from __future__ import annotations

import threading

import anyio
import pytest

import tillerman.controller.daemon.daemon as daemon_module
from tillerman.controller.core import intent_requests
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger import events as ev
from tillerman.ledger.events import Envelope
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.files import default_ruleset


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
                    intent = intent_requests.propose(other, thread_id="T1", mode="queue", text="later", owner="ann")
                with anyio.fail_after(10):  # far below the poll: the watcher woke it
                    while intent.id not in daemon.projection.intents:
                        await anyio.sleep(0.02)
                tg.cancel_scope.cancel()

    anyio.run(run)


def test_a_proposal_committed_during_a_round_is_decided_by_the_next(tmp_path, monkeypatch):
    """Another process proposes while a round (started by an observation on another
    thread) decides: the round holds the ledger (one transaction), so the proposal
    commits after it, and the round never saw it. The next round must decide it at
    once (the ledger watcher wakes the daemon), not when something else happens on its
    thread."""
    monkeypatch.setattr(daemon_module, "POLL_INTERVAL", 60.0)  # neither the poll nor a timer may rescue it
    (tmp_path / "sessions").mkdir()
    path = tmp_path / "ledger.sqlite3"

    async def run():
        with SQLiteRecorder(path) as recorder, SQLiteRecorder(path) as other:
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions(watch=(str(tmp_path / "sessions"),)))
            proposed: list[intent_requests.Intent] = []
            proposers: list[threading.Thread] = []
            judge = daemon.watches.finding  # the threads a round judges, asked as it decides

            def propose() -> None:
                proposed.append(intent_requests.propose(other, thread_id="T1", mode="queue", text="later", owner="ann"))

            def judge_while_another_process_proposes(threads, now):
                threads = list(threads)
                if "T0" in threads and not proposers:  # waits for this round's commit
                    proposers.append(threading.Thread(target=propose))
                    proposers[0].start()
                return judge(threads, now)

            daemon.watches.finding = judge_while_another_process_proposes
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                await anyio.sleep(0.5)  # the first round (every open intent decided once) is over
                seen = Envelope(event_id="seen:T0", source="test", at=None,
                                event=ev.ThreadStarted(thread_id="T0", source_format="appserver"))
                await daemon._inbox_send.send([seen])
                with anyio.fail_after(20):  # far below any deadline, the poll (60 s), or the next event on T1
                    while not proposed or (view := daemon.projection.intents.get(proposed[0].id)) is None \
                            or view.last_decision is None:
                        await anyio.sleep(0.02)
                assert view.last_decision == ("reconcile_turn", "thread_unknown")
                tg.cancel_scope.cancel()
            proposers[0].join()

    anyio.run(run)


def test_a_rounds_commits_move_the_head_anchor_together(tmp_path, monkeypatch):
    """Every decision round runs inside ``one_anchor``: its commits (the proposal's
    decision among them) are anchored once, when the round ends."""
    (tmp_path / "sessions").mkdir()
    path = tmp_path / "ledger.sqlite3"
    rounds: list[int] = []
    one_anchor = SQLiteRecorder.one_anchor

    def counted(self):
        rounds.append(self.max_seq())
        return one_anchor(self)

    monkeypatch.setattr(SQLiteRecorder, "one_anchor", counted)

    async def run():
        with SQLiteRecorder(path) as recorder:
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions(watch=(str(tmp_path / "sessions"),)))
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                with SQLiteRecorder(path) as other:
                    intent_requests.propose(other, thread_id="T1", mode="queue", text="later", owner="ann")
                with anyio.fail_after(10):
                    while not any(isinstance(e.envelope.event, ev.DecisionRecorded) for e in recorder.read()):
                        await anyio.sleep(0.02)
                tg.cancel_scope.cancel()

    anyio.run(run)
    assert rounds
    with SQLiteRecorder(path) as rec:
        head = list(rec.read())[-1]
        assert rec._read_anchor() == (head.seq, head.hash)  # the last round's move is made by close
