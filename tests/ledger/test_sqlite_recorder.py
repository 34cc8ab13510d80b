import os
import sqlite3
import stat

import msgspec
import pytest

from tests.ledger.recorder_contract import RecorderContract, turn
from tillerman.ledger import sqlite as sqlite_ledger
from tillerman.ledger.errors import IntegrityError, OperationalError, SchemaError
from tillerman.ledger.events import Envelope, TurnStarted, kind_of
from tillerman.ledger.sqlite import SQLiteRecorder


class TestSQLiteFile(RecorderContract):
    def make_recorder(self, tmp_path):
        return SQLiteRecorder(tmp_path / "ledger.sqlite3")

    def second_writer(self, recorder):
        return SQLiteRecorder(recorder.path)


class TestSQLiteMemory(RecorderContract):
    def make_recorder(self, tmp_path):
        return SQLiteRecorder(":memory:")


def test_files_are_private(tmp_path):
    path = tmp_path / "state" / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([turn(1)])
    for p in (path, path.with_name(path.name + ".head")):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_wal_and_busy_timeout(tmp_path):
    with SQLiteRecorder(tmp_path / "l.sqlite3") as rec:
        assert rec._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert rec._db.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000


def _run_sql(path, statement):
    """``statement`` committed on the file by a plain SQLite connection, not a recorder."""
    db = sqlite3.connect(path)
    db.execute(statement)
    db.commit()
    db.close()


def test_a_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.db"
    _run_sql(path, "CREATE TABLE x (y)")
    with pytest.raises(SchemaError, match="not a tillerman ledger"):
        SQLiteRecorder(path)


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "l.sqlite3"
    SQLiteRecorder(path).close()
    _run_sql(path, "PRAGMA user_version = 99")
    with pytest.raises(SchemaError, match="upgrade tillerman"):
        SQLiteRecorder(path)


def test_garbage_file_is_refused(tmp_path):
    path = tmp_path / "l.sqlite3"
    path.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(SchemaError):
        SQLiteRecorder(path)


def test_busy_ledger_raises_operational_error(tmp_path):
    path = tmp_path / "l.sqlite3"
    rec = SQLiteRecorder(path)
    rec._db.execute("PRAGMA busy_timeout = 50")
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OperationalError, match="busy"):
            rec.append([turn(1)])
    finally:
        blocker.execute("ROLLBACK")
    assert rec.append([turn(1)]).seqs == (1,)  # and it resumes once the writer lets go
    rec.close()


def test_read_only_ledger_raises_operational_error(tmp_path):
    path = tmp_path / "l.sqlite3"
    SQLiteRecorder(path).close()
    rec = SQLiteRecorder(path)
    rec._db.execute("PRAGMA query_only = ON")  # SQLite's own read-only error path
    with pytest.raises(OperationalError):
        rec.append([turn(1)])
    rec.close()


def test_anchor_lag_after_a_crash_is_a_note_and_healed_by_the_next_write(tmp_path):
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([turn(1)])
        head = path.with_name(path.name + ".head").read_text()
        rec.append([turn(2)])
    path.with_name(path.name + ".head").write_text(head)  # as if killed before the rewrite
    with SQLiteRecorder(path) as rec:
        report = rec.verify()
    assert report.ok and report.notes and "lags by 1" in report.notes[0]
    with SQLiteRecorder(path) as rec:
        rec.append([turn(3)])
        report = rec.verify()
    assert report.ok and report.notes == ()


def _event_indexes(db) -> set[str]:
    return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'"
                                            " AND tbl_name = 'events'")}


def test_every_index_of_the_events_table_serves_a_query_the_ledger_runs(tmp_path):
    """An index costs every append; the ones kept are those a lookup uses."""
    with SQLiteRecorder(tmp_path / "l.sqlite3") as rec:
        rec.append([turn(1)])
        used = set()
        for sql, params in [
            ("SELECT event_id, digest FROM events WHERE id_key IN (?, ?)", (1, 2)),  # _known_digests
            ("SELECT event_id, digest FROM events INDEXED BY events_unkeyed WHERE id_key IS NULL"
             " AND event_id IN (?, ?)", ("e1", "e2")),
            ("SELECT event_id FROM events WHERE id_key = ?", (1,)),  # _insert: who holds a key
            ("SELECT kind, payload FROM events WHERE intent_id = ? AND kind IN ('intent_proposed',"
             " 'intent_transition') ORDER BY seq DESC LIMIT 1", ("i",)),  # _intent_state
        ]:
            plan = " ".join(row[-1] for row in rec._db.execute("EXPLAIN QUERY PLAN " + sql, params))
            assert "USING INDEX" in plan, plan
            used.add(plan.split("USING INDEX ")[1].split()[0])
        assert _event_indexes(rec._db) == used == {"events_key", "events_unkeyed", "events_intent"}


def test_a_ledger_with_the_dropped_indexes_opens_and_loses_them(tmp_path):
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([turn(1), turn(2)])
    for statement in ("CREATE INDEX events_thread ON events (thread_id, seq)",
                      "CREATE INDEX events_kind ON events (kind, seq)", "PRAGMA user_version = 3"):
        _run_sql(path, statement)  # as the previous release left it
    with SQLiteRecorder(path) as rec:
        assert "events_thread" not in _event_indexes(rec._db) and "events_kind" not in _event_indexes(rec._db)
        rec.append([turn(3)])
        assert [e.seq for e in rec.read()] == [1, 2, 3] and rec.verify().ok


def _id_lookups(rec: SQLiteRecorder) -> list[str]:
    """The statements ``rec`` runs from now on (the list fills as it runs them)."""
    statements: list[str] = []
    rec._db.set_trace_callback(statements.append)
    return statements


def _looked_up(statements: list[str]) -> list[str]:
    return [s for s in statements if "id_key IN" in s or "event_id IN" in s]


def test_new_events_are_appended_without_looking_their_ids_up(tmp_path):
    with SQLiteRecorder(tmp_path / "l.sqlite3") as rec:
        statements = _id_lookups(rec)
        rec.append([turn(1), turn(2)])
        with rec.bulk():
            rec.append([turn(3)])
            rec.append([turn(4), turn(5)])
        assert not _looked_up(statements)
        assert [e.seq for e in rec.read()] == [1, 2, 3, 4, 5]


@pytest.fixture(params=["own keys", "one key for every id"])
def keys(request, monkeypatch):
    """Each id under its own key, or every id under the same one: ids that share a key
    (``tillerman.ledger.event_keys``) must make no difference to what is stored."""
    if request.param == "one key for every id":
        monkeypatch.setattr(sqlite_ledger, "event_key", lambda event_id: 7)
    return request.param


def test_a_stored_id_among_new_ones_is_found_after_all(tmp_path, keys):
    """The insert that meets a stored id is undone and the batch prepared on the stored
    digests: a duplicate dropped, a changed offer recorded as a conflict, the rest
    chained on, in bulk and out of it, and lookups again only until a batch meets none."""
    with SQLiteRecorder(tmp_path / "l.sqlite3") as rec:
        rec.append([turn(1), turn(2)])
        with rec.bulk():
            result = rec.append([turn(3), turn(1), turn(4)])
            assert result.seqs == (3, 4) and result.duplicates == 1
            changed = Envelope(event_id="e2", event=TurnStarted(thread_id="t1", turn_id="other"), source="test", at=2.0)
            result = rec.append([changed, turn(5)])
            assert result.conflicts == ("e2",)
            assert [kind_of(e.envelope.event) for e in result.entries] == ["turn_started", "conflict"]
        assert rec.append([turn(6)]).seqs == (7,)  # looked up: the batch before met stored ids
        statements = _id_lookups(rec)
        assert rec.append([turn(7)]).seqs == (8,)  # the one before met none: not looked up
        assert not _looked_up(statements)
        assert rec.verify().ok
        assert [e.seq for e in rec.read()] == list(range(1, 9))


def test_ids_that_share_a_key_are_stored_unkeyed_and_still_refused_twice(tmp_path, keys):
    """A key another id holds: the row goes in without one (the rows around it keep
    theirs), in a batch, one by one and through ``append_unseen``; offered again, each id
    is still a duplicate, and a stored id in an unseen batch still breaks the block."""
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as rec:
        assert rec.append([turn(1), turn(2), turn(3)]).seqs == (1, 2, 3)
        assert rec.append([turn(4)]).seqs == (4,)
        with rec.bulk():
            assert rec.append_unseen([turn(5), turn(6)]).seqs == (5, 6)
        assert rec.append([turn(i) for i in range(1, 7)]).duplicates == 6
        with pytest.raises(IntegrityError):
            with rec.bulk():
                rec.append_unseen([turn(7), turn(3)])  # e3 is stored
        assert rec.append([turn(7)]).seqs == (7,)
        assert rec.verify().ok
    unkeyed = sqlite3.connect(path).execute("SELECT count(*) FROM events WHERE id_key IS NULL").fetchone()[0]
    assert unkeyed == (6 if keys == "one key for every id" else 0)


def test_a_row_that_breaks_another_constraint_is_refused_not_stored_unkeyed(tmp_path, keys):
    """Only a key held by another id sends a row in unkeyed: a new id on a seq already
    taken raises, whether its key is held or free, and nothing of the batch stays."""
    from tillerman.ledger.batch import prepare
    from tillerman.ledger.recorder import GENESIS

    with SQLiteRecorder(tmp_path / "l.sqlite3") as rec:
        rec.append([turn(1)])
        rows = prepare([turn(8), turn(9)], 0, GENESIS, 1.0, lambda ids: {}, lambda intent_id: None).rows
        rec._db.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.IntegrityError):
            rec._insert(rec._db, rows)  # seq 1 is e1's
        rec._db.execute("ROLLBACK")
        assert [(e.seq, e.envelope.event_id) for e in rec.read()] == [(1, "e1")] and rec.verify().ok


def test_a_ledger_of_schema_4_gets_its_ids_keyed_and_keeps_every_row(tmp_path, monkeypatch):
    """Schema 5 builds the table again with a key per id; of ids that share one, the
    first keeps it and the others none, and each is still refused when offered again."""
    from tillerman.ledger import migrations

    made, path = tmp_path / "made.sqlite3", tmp_path / "l.sqlite3"
    with SQLiteRecorder(made) as rec:
        rec.append([turn(i) for i in range(1, 5)])
        before = [(e.seq, e.envelope.event_id, e.hash) for e in rec.read()]
        rows = rec._db.execute(f"SELECT {sqlite_ledger.COLUMNS} FROM events").fetchall()
        meta = rec._db.execute("SELECT key, value FROM meta").fetchall()
    schema_4 = sqlite3.connect(path, isolation_level=None)  # as the previous release made it
    for statements in migrations.MIGRATIONS[:4]:
        for statement in statements:
            schema_4.execute(statement)
    schema_4.executemany(f"INSERT INTO events ({sqlite_ledger.COLUMNS}) VALUES ({', '.join('?' * 15)})", rows)
    schema_4.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta)
    schema_4.execute("PRAGMA user_version = 4")
    schema_4.close()
    os.replace(str(made) + ".head", str(path) + ".head")

    shared = {"e1", "e3"}  # these two share a key
    def key(event_id: str) -> int:
        return 7 if event_id in shared else hash(event_id)

    monkeypatch.setattr(migrations, "event_key", key)
    monkeypatch.setattr(sqlite_ledger, "event_key", key)
    with SQLiteRecorder(path) as rec:
        assert [(e.seq, e.envelope.event_id, e.hash) for e in rec.read()] == before and rec.verify().ok
        assert rec.append([turn(1), turn(3)]).duplicates == 2
        assert _event_indexes(rec._db) == {"events_key", "events_unkeyed", "events_intent"}
        keyed = dict(rec._db.execute("SELECT event_id, id_key FROM events"))
    assert keyed["e1"] == 7 and keyed["e3"] is None and keyed["e2"] == hash("e2")


def test_a_new_ledger_gets_large_pages_and_an_existing_one_keeps_its_own(tmp_path, monkeypatch):
    new, old = tmp_path / "new.sqlite3", tmp_path / "old.sqlite3"
    with monkeypatch.context() as patched:  # a ledger made before: SQLite's default pages
        patched.setattr(sqlite_ledger, "PAGE_SIZE", 4096)
        SQLiteRecorder(old).close()
    for path in (new, old):
        with SQLiteRecorder(path) as rec:
            rec.append([turn(1)])
    for path, size in ((new, sqlite_ledger.PAGE_SIZE), (old, 4096)):
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA page_size").fetchone()[0] == size, path
        db.close()
        with SQLiteRecorder(path) as rec:
            assert rec.verify().ok
    assert sqlite_ledger.PAGE_SIZE > 4096


def test_a_connection_that_loads_many_rows_gets_a_larger_page_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_ledger, "LOAD_ROWS", 3)
    with SQLiteRecorder(tmp_path / "l.sqlite3") as rec:
        default = rec._db.execute("PRAGMA cache_size").fetchone()[0]
        with rec.bulk():  # a round of a daemon: fewer rows
            rec.append([turn(1), turn(2)])
        assert rec._db.execute("PRAGMA cache_size").fetchone()[0] == default
        with rec.bulk():
            rec.append([turn(3), turn(4)])
            rec.append([turn(5)])
        assert rec._db.execute("PRAGMA cache_size").fetchone()[0] == -sqlite_ledger.LOAD_CACHE_KIB != default


def test_unseen_events_are_stored_as_append_stores_them_without_a_savepoint(tmp_path):
    """``append_unseen`` (a replay's observations of a file read once) writes the rows
    ``append`` writes, inside ``bulk()`` with no savepoint: its journal of every page a
    batch changes was most of a replay's writes."""
    rows = {}
    for how in ("append", "append_unseen"):
        with SQLiteRecorder(tmp_path / f"{how}.sqlite3") as rec:
            statements = []
            rec._db.set_trace_callback(statements.append)
            with rec.bulk():
                result = getattr(rec, how)([observed(turn(1)), observed(turn(2))])
                getattr(rec, how)([observed(turn(3))])
            assert result.seqs == (1, 2)
            assert bool([s for s in statements if "SAVEPOINT" in s]) == (how == "append")
            assert rec.verify().ok
            rows[how] = [(e.seq, e.envelope, e.hash) for e in rec.read()]
    assert rows["append_unseen"] == rows["append"]


def observed(env: Envelope) -> Envelope:
    return msgspec.structs.replace(env, observed_at=100.0)


def test_an_unseen_event_that_was_stored_after_all_rolls_the_whole_block_back(tmp_path):
    with SQLiteRecorder(tmp_path / "l.sqlite3") as rec:
        rec.append([turn(1)])
        with pytest.raises(IntegrityError):
            with rec.bulk():
                rec.append_unseen([turn(2)])
                rec.append_unseen([turn(3), turn(1)])  # a promise broken: e1 is stored
        assert [e.seq for e in rec.read()] == [1]
        assert rec.verify().ok


def test_savepoints_journal_in_memory_not_in_a_temporary_file(tmp_path):
    with SQLiteRecorder(tmp_path / "l.sqlite3") as rec:
        assert rec._db.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY
