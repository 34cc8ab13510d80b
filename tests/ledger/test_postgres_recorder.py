"""The PostgreSQL ledger: the shared recorder contract, and what only a shared database has."""

import threading

import psycopg
import pytest

from tests.ledger.recorder_contract import RecorderContract, turn
from tillerman.ledger import postgres, projections
from tillerman.ledger.errors import AnchorMismatch, IntegrityError, OperationalError, SchemaError
from tillerman.ledger.postgres import PostgresRecorder


class TestPostgres(RecorderContract):
    shares_daemons = True

    @pytest.fixture
    def recorder(self, postgres_dsn):
        rec = PostgresRecorder(postgres_dsn)
        yield rec
        assert rec.verify().ok, rec.verify().problems
        rec.close()

    def second_writer(self, recorder):
        return PostgresRecorder(recorder._dsn)


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def test_concurrent_writers_get_contiguous_ordered_seqs(postgres_dsn):
    """Four writers, each its own recorder (its own pool), append at once: every seq is
    used once, none is skipped, and the chain verifies."""
    PostgresRecorder(postgres_dsn).close()
    errors = []

    def writer(n: int) -> None:
        try:
            with PostgresRecorder(postgres_dsn) as rec:
                for i in range(25):
                    rec.append([turn(1000 * n + i, thread=f"t{n}")])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with PostgresRecorder(postgres_dsn) as rec:
        assert [e.seq for e in rec.read()] == list(range(1, 101))
        assert rec.verify().ok


def test_a_writer_frozen_inside_a_block_does_not_hold_the_others(postgres_dsn):
    """A process frozen inside ``bulk()`` (its head-row lock taken) is ended by the server
    after its ``idle_transaction_limit``: another writer appends while it is still frozen,
    the frozen block's rows are rolled back when it wakes, and the chain verifies."""
    PostgresRecorder(postgres_dsn).close()
    other_done = threading.Event()

    def other_writer() -> None:
        with PostgresRecorder(postgres_dsn) as rec:
            rec.append([turn(2, thread="other")])
        other_done.set()

    with PostgresRecorder(postgres_dsn, idle_transaction_limit=1.0) as frozen:
        with pytest.raises(OperationalError):
            with frozen.bulk():
                frozen.append([turn(1, thread="frozen")])
                writer = threading.Thread(target=other_writer)
                writer.start()
                # Frozen: no statement for far longer than the limit. The other writer
                # gets through meanwhile (never, before: it waited on the head row).
                assert other_done.wait(timeout=30)
        writer.join()
    with PostgresRecorder(postgres_dsn) as rec:
        assert [e.envelope.event.thread_id for e in rec.read()] == ["other"]
        assert rec.verify().ok


def test_writers_opening_an_empty_database_at_once_create_one_ledger(postgres_dsn):
    start = threading.Barrier(4)
    opened, errors = [], []

    def open_it() -> None:
        start.wait()
        try:
            opened.append(PostgresRecorder(postgres_dsn))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(opened) == 4
    for n, rec in enumerate(opened):
        rec.append([turn(n)])
        rec.close()
    with PostgresRecorder(postgres_dsn) as rec:
        assert rec.max_seq() == 4 and rec.verify().ok


def test_the_events_table_refuses_edits(postgres_dsn):
    with PostgresRecorder(postgres_dsn) as rec:
        rec.append([turn(1), turn(2)])
    for statement in ("DELETE FROM events WHERE seq = 2", "UPDATE events SET source = 'x'", "TRUNCATE events"):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            _sql(postgres_dsn, statement)


def test_a_cut_tail_is_found_and_refused_until_accepted(postgres_dsn):
    """Whoever disables the trigger and deletes the last rows: the head row still names
    the seq they had, so verify reports the cut and appends are refused."""
    with PostgresRecorder(postgres_dsn) as rec:
        rec.append([turn(1), turn(2), turn(3)])
    _sql(postgres_dsn, "ALTER TABLE events DISABLE TRIGGER USER", "DELETE FROM events WHERE seq > 1",
         "ALTER TABLE events ENABLE TRIGGER USER")
    with PostgresRecorder(postgres_dsn) as rec:
        report = rec.verify()
        assert not report.ok and "2 row(s) cut off the tail" in report.problems[0]
        with pytest.raises(AnchorMismatch, match="missing from the tail"):
            rec.append([turn(4)])
        problem, seq = rec.accept_tail("ann")
        assert "missing from the tail" in problem and seq == 2
        assert rec.append([turn(4)]).seqs == (3,)
        assert rec.verify().ok


def test_rows_written_around_the_recorder_are_found(postgres_dsn):
    with PostgresRecorder(postgres_dsn) as rec:
        rec.append([turn(1)])
    _sql(postgres_dsn, "ALTER TABLE events DISABLE TRIGGER USER", "UPDATE chain_head SET seq = 0",
         "ALTER TABLE events ENABLE TRIGGER USER")
    with PostgresRecorder(postgres_dsn) as rec:
        assert any("rows written around tillerman" in p for p in rec.verify().problems)


def test_a_writer_committing_while_the_ledger_is_checked_is_not_taken_for_rows_around_it(
        postgres_dsn, monkeypatch):
    """Another daemon commits between the check's read of the head row and its read of the
    table: both reads see one moment, so the check never finds rows past the head."""
    with PostgresRecorder(postgres_dsn) as rec, PostgresRecorder(postgres_dsn) as other:
        rec.append([turn(1)])
        appended = iter(range(2, 100))
        committing = []

        def commit_first(original):
            def run(*args, **kwargs):
                if not committing:  # not inside the other's append, which checks its head too
                    committing.append(True)
                    other.append([turn(next(appended))])
                    committing.clear()
                return original(*args, **kwargs)
            return run

        monkeypatch.setattr(psycopg.ServerCursor, "execute", commit_first(psycopg.ServerCursor.execute))
        monkeypatch.setattr(PostgresRecorder, "_anchor_problem",
                            staticmethod(commit_first(PostgresRecorder._anchor_problem)))
        report = rec.verify()
        assert report.ok, report.problems
        assert rec.tail_problem() is None
        monkeypatch.undo()
        assert rec.max_seq() == 3 and rec.verify().ok and rec.verify().rows == 3


def test_a_reader_never_writes_and_needs_a_ledger(postgres_dsn):
    with pytest.raises(SchemaError, match="no tillerman ledger"):
        PostgresRecorder(postgres_dsn, readonly=True)
    PostgresRecorder(postgres_dsn).close()
    with PostgresRecorder(postgres_dsn, readonly=True) as reader:
        with pytest.raises(Exception, match="read-only"):
            reader.append([turn(1)])
        assert reader.max_seq() == 0


def test_a_database_with_other_tables_is_refused(postgres_dsn):
    _sql(postgres_dsn, "CREATE TABLE events (x int)")
    with pytest.raises(SchemaError, match="other tables"):
        PostgresRecorder(postgres_dsn)


def test_driver_errors_become_the_ledgers_own(postgres_dsn):
    with PostgresRecorder(postgres_dsn) as rec:
        rec.append([turn(1)])
        with pytest.raises(IntegrityError, match="duplicate key"), rec._transaction() as conn:
            conn.execute("INSERT INTO meta (key, value) VALUES ('chain_version', '2')")


def test_a_replay_into_postgresql_decides_and_chains_as_into_sqlite(postgres_dsn, tmp_path, monkeypatch):
    """The same sessions replayed into each backend: the same decisions digest, summary,
    entries and chain head (replay's own rows observed at one fixed wall-clock time)."""
    import types

    from tillerman.controller.replay.replayer import Replayer
    from tillerman.ledger import postgres, sqlite
    from tillerman.ledger.sqlite import SQLiteRecorder
    from tillerman.rules.config import load_effective

    fixed = types.SimpleNamespace(time=lambda: 1_790_000_000.25)
    monkeypatch.setattr(sqlite, "time", fixed)
    monkeypatch.setattr(postgres, "time", fixed)
    effective = load_effective(None, None)
    with SQLiteRecorder(tmp_path / "l.sqlite3") as lite, PostgresRecorder(postgres_dsn) as pg:
        into_sqlite = Replayer(lite, effective.ruleset, patterns=effective.patterns).run(["fixtures/sessions"])
        into_postgres = Replayer(pg, effective.ruleset, patterns=effective.patterns).run(["fixtures/sessions"])
        assert into_postgres.decisions > 0
        assert into_postgres.decisions_digest == into_sqlite.decisions_digest
        assert into_postgres == into_sqlite
        assert list(pg.read()) == list(lite.read())
        assert _head(pg) == _head(lite)
        assert pg.verify().ok and lite.verify().ok


def _head(recorder) -> tuple[int, str]:
    (last,) = recorder.read(after_seq=recorder.max_seq() - 1)
    return last.seq, last.hash


@pytest.mark.parametrize(("given", "shown"), [(None, "20s"), (3.0, "3s")])
def test_a_writers_transactions_are_bounded_by_its_limit(postgres_dsn, given, shown):
    """The default for any writer; a daemon gives its lease length (``tillerman run``)."""
    with PostgresRecorder(postgres_dsn, idle_transaction_limit=given) as rec, rec._reading() as conn:
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == shown


def test_a_commit_during_verify_is_not_taken_for_a_forged_snapshot(postgres_dsn, monkeypatch):
    """A daemon commits a row and saves its fold snapshot while ``verify`` walks the
    chain: the snapshot verify reads is of the walk's moment, never past its last row."""
    walk = postgres.verify_ledger

    def a_daemon_commits_before_the_snapshot_is_read(*args, snapshot, **kwargs):
        def read(name):
            with PostgresRecorder(postgres_dsn) as daemon:
                daemon.append([turn(99)])
                projections.save(daemon, projections.load(daemon))
            return snapshot(name)
        return walk(*args, snapshot=read, **kwargs)

    with PostgresRecorder(postgres_dsn) as rec:
        rec.append([turn(i) for i in range(1, 4)])
        projections.save(rec, projections.load(rec))
        monkeypatch.setattr(postgres, "verify_ledger", a_daemon_commits_before_the_snapshot_is_read)
        report = rec.verify()
        monkeypatch.undo()
        assert report.ok, report.problems
        assert rec.verify().ok
