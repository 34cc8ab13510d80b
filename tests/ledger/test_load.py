"""A load into an empty SQLite ledger (``tillerman.ledger.load``): rows prepared here,
written by the writer process. Its rows against the SQLite recorder's own, and its
failures: a writer killed, another writer first, the caller failing mid-load."""

import contextlib
import os
import signal
import sqlite3
import time

import msgspec
import pytest

from tests.ledger.recorder_contract import make_intent, proposed, turn
from tillerman.ledger.batch import none_stored, prepare, row_columns
from tillerman.ledger.errors import IntegrityError, OperationalError
from tillerman.ledger.event_keys import event_key
from tillerman.ledger.events import Envelope
from tillerman.ledger.load import LedgerLoad
from tillerman.ledger.recorder import GENESIS
from tillerman.ledger.sqlite import SQLiteRecorder


def _stored(path) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT * FROM events ORDER BY seq").fetchall()


def _appends(recorder) -> list[int]:
    """Observations appended as new, then records of the caller's own offered twice,
    once changed: what each append returned, in entries."""
    intent = make_intent()
    returned = []
    with recorder.bulk():
        returned.append(len(recorder.append_unseen([turn(i) for i in range(1, 6)]).entries))
        returned.append(len(recorder.append([proposed(intent)]).entries))
    with recorder.bulk():
        returned.append(len(recorder.append([proposed(intent)]).entries))  # a duplicate: dropped
        changed = proposed(msgspec.structs.replace(intent, text="y"))
        result = recorder.append([changed])  # the same id, other content: a conflict record
        returned.append(len(result.entries))
        assert result.conflicts == (changed.event_id,)
    return returned


def test_the_load_writes_the_rows_the_sqlite_recorder_writes(tmp_path):
    with SQLiteRecorder(tmp_path / "plain.sqlite3") as plain:
        by_appends = _appends(plain)
    with SQLiteRecorder(tmp_path / "loaded.sqlite3") as ledger:
        with ledger.load() as load:
            assert isinstance(load, LedgerLoad)
            by_load = _appends(load)
        assert ledger.verify().ok and ledger.max_seq() == 7
    assert by_load == by_appends == [5, 1, 0, 1]
    plain_rows, loaded_rows = _stored(tmp_path / "plain.sqlite3"), _stored(tmp_path / "loaded.sqlite3")
    # all but observed_at (the wall clock's, for an envelope without one) and the links that chain it
    assert [row[:3] + row[4:13] + row[15:] for row in loaded_rows] == [row[:3] + row[4:13] + row[15:] for row in plain_rows]
    assert len(loaded_rows) == 7 and loaded_rows[-1][7] == "conflict"


def test_the_load_keeps_under_60_bytes_for_each_record_of_the_callers_own(tmp_path):
    """What ``append`` stores is kept to drop a duplicate and name a conflict whole: a
    64-bit name digest in the compact id table and the 32-byte content digest. A ``dict``
    of the id and digest strings held about 280 bytes a record. (Reports: an intent's
    records keep its state too, in a table of its own.)"""
    import tracemalloc

    from tillerman.ledger.events import Report

    def report(i: int) -> Envelope:
        return Envelope(event_id=f"report:{i:020d}", event=Report(rule_id="r", rule_version=1, finding=f"f{i}"),
                        source="tillerman", at=float(i))

    records = 20_000
    with SQLiteRecorder(tmp_path / "l.sqlite3") as ledger, ledger.load() as load, load.bulk():
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for start in range(0, records, 500):
                load.append([report(i) for i in range(start, start + 500)])
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert load.ids_kept() == records
        assert load.append([report(7)]).duplicates == 1  # found again
    assert kept / records < 60, f"{kept / records:.0f} bytes a record"


def _indexes(path) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}


def _shared_key(i: int) -> Envelope:
    """Observations whose ids share one key (``tillerman.ledger.event_keys``: their first 16 digits)."""
    return msgspec.structs.replace(turn(i), event_id=f"f-0123456789abcdef{i:016x}")


def test_the_load_builds_the_key_index_last_and_keys_a_shared_key_once(tmp_path):
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as ledger:
        with ledger.load() as load:
            with load.bulk():
                load.append_new([_shared_key(1), _shared_key(2), turn(3)])
            deadline = time.monotonic() + 30
            while ledger.max_seq() < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ledger.max_seq() == 3 and "events_key" not in _indexes(path)  # not while rows go in
        assert "events_key" in _indexes(path)
        with contextlib.closing(sqlite3.connect(path)) as db:
            keys = [key for (key,) in db.execute("SELECT id_key FROM events ORDER BY seq")]
        assert keys[0] == event_key(_shared_key(1).event_id) and keys[1] is None and keys[2] is not None
        # both found again, by the key and by the id: duplicates, neither a conflict nor an error
        again = ledger.append([_shared_key(1), _shared_key(2), turn(3)])
        assert again.duplicates == 3 and not again.conflicts and ledger.verify().ok


def test_a_load_that_fails_builds_the_key_index_and_raises_its_own_failure(tmp_path):
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as ledger:
        with pytest.raises(KeyError, match="the writer's own"):
            with ledger.keys_indexed_last(), ledger.bulk():
                ledger.insert_prepared([row_columns(row) for row in prepare(
                    [_shared_key(1), _shared_key(2)], 0, GENESIS, 1.0, none_stored, lambda intent_id: None).rows])
                assert "events_key" not in _indexes(path)
                raise KeyError("the writer's own failure")
        assert "events_key" in _indexes(path) and ledger.max_seq() == 2
        assert ledger.append([_shared_key(2)]).duplicates == 1
        # the build sorted on disk, in a small cache; the connection has its own settings back
        assert ledger._query("PRAGMA temp_store") == [(2,)] and ledger._query("PRAGMA cache_size") == [(-2000,)]


def test_a_writer_appending_while_a_load_holds_the_key_index_back_looks_every_id_up(tmp_path):
    """A daemon with the ledger open since it was empty, while a replay loads into it: its
    appends cannot count on the index to refuse a stored id, so they look each one up."""
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as daemon, SQLiteRecorder(path) as writer:
        with writer.keys_indexed_last():
            with writer.bulk():
                writer.insert_prepared([row_columns(row) for row in prepare(
                    [turn(1)], 0, GENESIS, 1.0, none_stored, lambda intent_id: None).rows])
            assert daemon.append([turn(1)]).duplicates == 1  # no second row
        assert writer.max_seq() == 1 and "events_key" in _indexes(path)


def test_a_ledger_with_one_id_stored_twice_is_refused_when_its_key_index_is_built(tmp_path):
    """Written around tillerman: no shared key to leave unkeyed, an error that says so."""
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as ledger:
        ledger.append([turn(1)])
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # committed, then closed
        db.execute("DROP INDEX events_key")
        db.execute("INSERT INTO events SELECT seq + 1, event_id, at, observed_at, source, thread_id, turn_id, kind,"
                   " intent_id, offset, length, payload, digest, prev_hash, hash, id_key FROM events")
    with pytest.raises(IntegrityError, match="the id e1 is stored twice"):
        SQLiteRecorder(path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT count(*) FROM events WHERE id_key IS NOT NULL").fetchone()[0] == 2


def test_a_ledger_with_rows_is_loaded_by_the_recorder_itself(tmp_path):
    with SQLiteRecorder(tmp_path / "l.sqlite3") as ledger:
        ledger.append([turn(1)])
        with ledger.load() as load:
            assert load is ledger


def test_a_killed_writer_is_raised_and_its_commits_stay(tmp_path):
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as ledger:
        with pytest.raises(OperationalError, match=r"writing .* ended \(killed by signal 9\).*ledger verify"):
            with ledger.load() as load:
                with load.bulk():
                    load.append_new([turn(i) for i in range(1, 4)])
                deadline = time.monotonic() + 30
                while ledger.max_seq() < 3 and time.monotonic() < deadline:
                    time.sleep(0.01)  # the writer starts, then commits the block
                load.append_new([turn(4)])  # sent, never committed
                os.kill(load._writer.pid, signal.SIGKILL)
                load._writer.wait()
                with load.bulk():
                    load.append_new([turn(5)])
        report = ledger.verify()
        assert report.ok and ledger.max_seq() == 3
        assert "events_key" not in _indexes(path)  # the writer stopped before it built it
    with SQLiteRecorder(path) as again:  # the next to open the ledger builds it
        assert "events_key" in _indexes(path)
        assert again.append([turn(2)]).duplicates == 1 and again.verify().ok


def test_rows_that_do_not_chain_to_the_ledger_are_refused(tmp_path):
    """Another writer appended first: the writer's head is not the one the rows were
    prepared on, and nothing of them is written."""
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as ledger:
        ledger.append([turn(1, source="other writer")])
        load = LedgerLoad(ledger.path)  # as if the ledger had been empty when the load began
        load.append_new([turn(2), turn(3)])
        with pytest.raises(OperationalError, match="head is seq 1 where the rows loaded into it chain to seq 0:"
                                                   " another writer appended meanwhile"):
            load.close()
        assert ledger.max_seq() == 1 and ledger.verify().ok
        assert "events_key" in _indexes(path)  # a ledger with rows keeps its index


def test_what_was_sent_before_the_caller_failed_is_committed(tmp_path):
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as ledger:
        with pytest.raises(KeyError):
            with ledger.load() as load:
                load.append_new([turn(1), turn(2)])
                raise KeyError("the caller's own failure")
        assert ledger.max_seq() == 2 and ledger.verify().ok


def test_a_load_refuses_file_offsets_and_rows_outside_a_block(tmp_path):
    """A load writes events only; rows prepared elsewhere go in only inside ``bulk()``."""
    from tillerman.ledger.file_offsets import FileOffset

    with SQLiteRecorder(tmp_path / "l.sqlite3") as ledger:
        with ledger.load() as load:
            with pytest.raises(ValueError, match="not file offsets"):
                load.append([turn(1)], offsets=[FileOffset(identity="i", path="p", source="s", format="codex-rollout",
                                                            offset=1)])
        with pytest.raises(ValueError, match="inside bulk"):
            ledger.insert_prepared([(1,)])
        assert ledger.max_seq() == 0
