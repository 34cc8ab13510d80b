"""``tillerman ledger copy``: SQLite to PostgreSQL and back, the copy verified."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.controller.test_recheck import supervised
from tests.ledger.recorder_contract import turn
from tillerman.controller.cli.main import main
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger.copy import TargetNotEmpty, copy_ledger
from tillerman.ledger.errors import IntegrityError
from tillerman.ledger.events import Envelope, TurnStarted
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.postgres import PostgresRecorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.config import load_effective


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def _history(path) -> None:
    """Observations, a conflict, intents decided, a file offset: what a daemon leaves."""
    with SQLiteRecorder(path) as rec:
        effective = load_effective(None, None)
        Replayer(rec, effective.ruleset, patterns=effective.patterns).run(["fixtures/sessions"])
        supervised(rec)
        rec.append([Envelope(event_id="e1", event=TurnStarted(thread_id="t1", turn_id="u1"), source="t", at=1.0)])
        rec.append([Envelope(event_id="e1", event=TurnStarted(thread_id="t1", turn_id="u2"), source="t", at=1.0)],
                   offsets=[FileOffset(identity="d:1:x", path="/s/a", source="file:/s/a", format="codex-rollout",
                                       offset=7)])


def test_sqlite_to_postgresql_and_back_keeps_every_row_and_the_chain_head(tmp_path, postgres_dsn):
    source, back = tmp_path / "ledger.sqlite3", tmp_path / "back.sqlite3"
    _history(source)
    there = run("ledger", "copy", source, postgres_dsn, "--json")
    assert there.exit_code == 0, there.output
    with SQLiteRecorder(source, readonly=True) as lite:
        rows = list(lite.read())
        offsets = lite.file_offsets()
    assert json.loads(there.output)["rows"] == len(rows) and json.loads(there.output)["head"] == rows[-1].hash
    with PostgresRecorder(postgres_dsn, readonly=True) as pg:
        assert list(pg.read()) == rows and pg.file_offsets() == offsets and pg.verify().ok
    again = run("ledger", "copy", postgres_dsn, back)
    assert again.exit_code == 0 and "the copy verifies" in again.output, again.output
    with SQLiteRecorder(back, readonly=True) as copy, SQLiteRecorder(source, readonly=True) as original:
        assert list(copy.read()) == rows and copy.verify().ok
        assert list(copy.rows()) == list(original.rows())  # byte for byte


def test_a_target_with_rows_is_refused_and_left_alone(tmp_path, postgres_dsn):
    source = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(source) as rec:
        rec.append([turn(1)])
    with PostgresRecorder(postgres_dsn) as pg:
        pg.append([turn(7)])
        with SQLiteRecorder(source, readonly=True) as src, pytest.raises(TargetNotEmpty):
            copy_ledger(src, pg)
        assert pg.max_seq() == 1
    result = run("ledger", "copy", source, postgres_dsn)
    assert result.exit_code == 2 and "already holds 1 rows" in result.output


def test_a_source_that_does_not_verify_is_not_copied(tmp_path, postgres_dsn):
    import sqlite3

    source = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(source) as rec:
        rec.append([turn(1), turn(2)])
    db = sqlite3.connect(source)
    db.execute("UPDATE events SET source = 'forged' WHERE seq = 1")
    db.commit()
    db.close()
    with SQLiteRecorder(source, readonly=True) as src, PostgresRecorder(postgres_dsn) as pg:
        with pytest.raises(IntegrityError, match="does not verify"):
            copy_ledger(src, pg)
        assert pg.max_seq() == 0
