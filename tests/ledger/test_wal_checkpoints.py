"""The daemon's write-ahead log is copied into the database on a thread of its own
(``tillerman.ledger.wal_checkpoints``): its commits never checkpoint, the log is
checkpointed anyway, and a checkpoint that cannot run is a reason kept, not a crash."""

from __future__ import annotations

import os
import threading
import time

from tests.ledger.recorder_contract import turn
from tillerman.controller.daemon import daemon as daemon_module
from tillerman.controller.daemon.daemon import DaemonOptions, run_daemon
from tillerman.ledger import wal_checkpoints
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.ledger.wal_checkpoints import BackgroundCheckpoints
from tillerman.rules.files import default_ruleset


def _fill(recorder: SQLiteRecorder, rows: int) -> None:
    for start in range(0, rows, 500):
        recorder.append([turn(i) for i in range(start, start + 500)])


def _sizes(path) -> tuple[int, int]:
    return os.path.getsize(path), os.path.getsize(str(path) + "-wal")


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.01)


def _checkpointing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tillerman-checkpoint"]


SMALL_LOG = 50  # pages: SQLite's own threshold (1000) made small, so that a few rows cross it


def test_no_commit_checkpoints_and_the_thread_does(tmp_path, monkeypatch):
    def filled(background: bool) -> tuple[int, int]:
        path = tmp_path / f"{background}.sqlite3"
        with SQLiteRecorder(path) as recorder:
            recorder._db.execute(f"PRAGMA wal_autocheckpoint = {SMALL_LOG}")
            checkpoints = recorder.checkpoint_in_background() if background else None
            database, _ = _sizes(path)
            _fill(recorder, 6000)
            grown, _ = _sizes(path)
            assert checkpoints is None or checkpoints.done == 0
        return database, grown

    monkeypatch.setattr(wal_checkpoints, "CHECKPOINT_EVERY", 3600.0)  # not now
    database, grown = filled(background=False)
    assert grown > database  # the commits that crossed the threshold copied the log in
    database, grown = filled(background=True)
    assert grown == database  # with the thread, none did
    assert not _checkpointing_threads()  # closing the ledger stops it

    path = tmp_path / "l.sqlite3"

    monkeypatch.setattr(wal_checkpoints, "CHECKPOINT_EVERY", 0.02)
    with SQLiteRecorder(path) as recorder:
        checkpoints = recorder.checkpoint_in_background()
        database, _ = _sizes(path)
        _fill(recorder, 6000)
        _wait_for(lambda: checkpoints.done >= 2 and _sizes(path)[0] > database)
        assert checkpoints.error is None
        assert recorder.checkpoint_in_background() is checkpoints  # one thread per ledger
        assert len(_checkpointing_threads()) == 1
        assert len(list(recorder.read())) == 6000
    assert not _checkpointing_threads()


def test_an_idle_ledger_is_not_checkpointed_until_a_commit_asks(tmp_path, monkeypatch):
    monkeypatch.setattr(wal_checkpoints, "CHECKPOINT_EVERY", 0.01)
    with SQLiteRecorder(tmp_path / "l.sqlite3") as recorder:
        checkpoints = recorder.checkpoint_in_background()
        time.sleep(0.3)  # thirty periods: an idle daemon's thread sleeps through them
        assert checkpoints.done == 0
        recorder.append([turn(1)])
        _wait_for(lambda: checkpoints.done == 1)
        time.sleep(0.1)
        assert checkpoints.done == 1  # one commit, one checkpoint


def test_a_ledger_in_memory_or_read_only_has_none(tmp_path):
    with SQLiteRecorder(":memory:") as recorder:
        assert recorder.checkpoint_in_background() is None
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as recorder:
        recorder.append([turn(1)])
    with SQLiteRecorder(path, readonly=True) as reader:
        assert reader.checkpoint_in_background() is None


def test_a_checkpoint_that_fails_is_a_reason_kept_and_the_thread_goes_on(tmp_path):
    not_a_ledger = tmp_path / "garbage"
    not_a_ledger.write_bytes(b"not a database" * 100)
    checkpoints = BackgroundCheckpoints(str(not_a_ledger), every=0.01)
    try:
        checkpoints.committed()
        _wait_for(lambda: checkpoints.error is not None)
        assert "checkpoint of" in checkpoints.error and "garbage" in checkpoints.error
        assert checkpoints._thread.is_alive()  # it tries again, with no commit to ask it
    finally:
        checkpoints.stop()
    unopenable = BackgroundCheckpoints(str(tmp_path / "missing" / "dir" / "l.sqlite3"), every=0.01)
    unopenable._thread.join(10)
    assert unopenable.error is not None and unopenable.error.startswith("cannot open")
    unopenable.stop()


def test_the_daemon_checkpoints_its_ledger_in_the_background(tmp_path, monkeypatch):
    seen = {}

    def run(main, *args, **kwargs):  # what the daemon's connection is like once it runs
        seen["autocheckpoint"] = recorder._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        seen["threads"] = len(_checkpointing_threads())

    monkeypatch.setattr(daemon_module.anyio, "run", run)
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as recorder:
        run_daemon(recorder, str(path), default_ruleset(), DaemonOptions())
    assert seen == {"autocheckpoint": 0, "threads": 1}


def test_checkpointing_in_commits_again_stops_the_thread_and_restores_sqlites_own(tmp_path, monkeypatch):
    """Replay stops the thread before it forks its next reader: none is left, and the
    connection's commits checkpoint again (SQLite's default threshold is back)."""
    monkeypatch.setattr(wal_checkpoints, "CHECKPOINT_EVERY", 3600.0)
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as recorder:
        recorder.checkpoint_in_background()
        assert recorder._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        recorder.checkpoint_in_commits()
        assert _checkpointing_threads() == []
        assert recorder._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        recorder.checkpoint_in_commits()  # none runs: nothing to stop
        recorder._db.execute(f"PRAGMA wal_autocheckpoint = {SMALL_LOG}")
        database, _ = _sizes(path)
        _fill(recorder, 6000)
        assert _sizes(path)[0] > database  # the commits copied the log in themselves
        assert recorder.checkpoint_in_background() is not None  # and a thread may start again
    assert _checkpointing_threads() == []


def test_a_stop_just_before_the_wake_up_is_cleared_still_ends_the_thread(tmp_path):
    """``stop`` sets both events; the thread, between its wait and its ``clear``, took the
    wake-up away and then waited on ``_grown`` for ever: closing the ledger hung."""
    with SQLiteRecorder(tmp_path / "l.sqlite3"):
        pass
    checkpoints = wal_checkpoints.BackgroundCheckpoints(str(tmp_path / "l.sqlite3"), every=0.01)

    class StoppedJustBeforeTheClear(threading.Event):
        def clear(self) -> None:
            checkpoints._stop.set()  # what stop() does, at the worst moment
            self.set()
            super().clear()

    first, checkpoints._grown = checkpoints._grown, StoppedJustBeforeTheClear()
    first.set()  # a commit, on whichever event the thread waits: it wakes, waits ``every``, clears
    threading.Event.set(checkpoints._grown)
    checkpoints._thread.join(timeout=10)
    assert not checkpoints._thread.is_alive()
