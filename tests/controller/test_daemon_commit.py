"""A round's commit runs on a worker thread: the loop goes on meanwhile (reading the
socket, in the daemon), and any other use of the ledger waits at the gate for that
commit, so what it writes lands after the round's rows."""

from __future__ import annotations

import threading
import time

import anyio

from tests.controller.test_daemon_fold import _full_fold, _setup, seen
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger import events as ev
from tillerman.ledger import projections
from tillerman.ledger.events import Envelope
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.files import default_ruleset

SLOW = 0.3  # seconds a round's commit takes (a busy disk)


class _SlowCommits:
    """A connection whose first ``COMMIT`` after the round's rows takes ``SLOW`` seconds;
    says on which thread it ran."""

    def __init__(self, db, recorder: "SlowDisk") -> None:
        self._db, self._recorder = db, recorder

    def execute(self, sql, *args):
        if sql == "COMMIT" and self._recorder.armed and self._recorder.committed_on is None:
            self._recorder.committed_on = threading.current_thread()
            time.sleep(SLOW)
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


class SlowDisk(SQLiteRecorder):
    """Once ``armed``, a commit takes ``SLOW`` seconds; says on which thread it ran."""

    armed = False
    committed_on: threading.Thread | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._db = _SlowCommits(self._db, self)


def _daemon_and_ticks(recorder):
    """A daemon on ``recorder``, and a task that notes the time every 10 ms the loop lets
    it run (its ticks)."""
    daemon = Daemon(recorder, default_ruleset(), DaemonOptions(), clock=lambda: 1000.0)
    daemon.projection = projections.load(recorder)
    ticks: list[float] = []

    async def ticking():
        while True:
            ticks.append(time.monotonic())
            await anyio.sleep(0.01)

    return daemon, ticks, ticking


def test_the_loop_runs_while_a_round_commits_and_other_writes_wait_for_it(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    _setup(path)
    with SlowDisk(path) as recorder:
        daemon, ticks, ticking = _daemon_and_ticks(recorder)

        async def another_writer():
            await anyio.sleep(SLOW / 3)  # while the round commits
            daemon.recorder.append([Envelope(event_id="later", event=ev.ThreadStarted(thread_id="T2"),
                                             source="appserver:x", at=2.0)])

        async def run():
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticking)
                await anyio.sleep(0.05)
                tg.start_soon(another_writer)
                started = time.monotonic()
                daemon._due = daemon.clock()
                recorder.armed = True
                await daemon._think(tg, [seen("T1", 1)])
                during = [t for t in ticks if started < t < started + SLOW]
                tg.cancel_scope.cancel()
            return during

        during = anyio.run(run)
        assert recorder.committed_on is not None and recorder.committed_on is not threading.main_thread()
        assert len(during) >= 3  # the loop went on while the round committed
        kinds = [type(e.envelope.event) for e in recorder.read(after_seq=2)]
        assert kinds[0] is ev.TurnStarted and kinds[-1] is ev.ThreadStarted  # the other write waited
    fold = daemon.projection
    assert fold.intents == _full_fold(path).intents


def test_a_delivery_record_is_written_off_the_loop_and_a_round_waits_its_turn(tmp_path):
    """A delivery's durable record (a commit and a flush) is written on the commit thread:
    the loop goes on meanwhile, the delivery waits for it, and a round asked for during
    the write starts only once it is done (its rows after the record)."""
    path = tmp_path / "ledger.sqlite3"
    _setup(path)
    record = Envelope(event_id="dispatch-record", event=ev.ThreadStarted(thread_id="T2"), source="tillerman", at=2.0)
    with SlowDisk(path) as recorder:
        daemon, ticks, ticking = _daemon_and_ticks(recorder)

        async def run():
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticking)
                await anyio.sleep(0.05)
                recorder.armed = True
                started = time.monotonic()
                async with anyio.create_task_group() as both:
                    both.start_soon(lambda: daemon.recorder.append_off_loop([record], durable=True))
                    await anyio.sleep(SLOW / 3)  # the record is being written
                    daemon._due = daemon.clock()
                    await daemon._think(tg, [seen("T1", 1)])
                waiting = [t for t in ticks if started + SLOW / 2 < t < started + SLOW]
                tg.cancel_scope.cancel()
            return waiting

        waiting = anyio.run(run)
        assert recorder.committed_on is not None and recorder.committed_on is not threading.main_thread()
        assert len(waiting) >= 3  # the loop went on while the record was written and the round waited
        kinds = [type(e.envelope.event) for e in recorder.read(after_seq=2)]
        assert kinds[0] is ev.ThreadStarted and kinds[1] is ev.TurnStarted  # the round waited its turn
