"""Tampering with a ledger: every edit, deletion, reorder or cut tail is named."""

import sqlite3

import pytest
from click.testing import CliRunner

from tests.ledger.recorder_contract import turn
from tillerman.controller.cli.main import main
from tillerman.ledger import projections
from tillerman.ledger.sqlite import SQLiteRecorder


@pytest.fixture
def ledger_file(tmp_path):
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([turn(i) for i in range(1, 11)])
    return path


def _tamper(path, *statements):
    db = sqlite3.connect(path)
    for sql in statements:
        db.execute(sql)
    db.commit()
    db.close()


def _verify(path):
    result = CliRunner().invoke(main, ["ledger", "verify", "--ledger", str(path)])
    return result.exit_code, result.output


def test_intact_ledger_verifies(ledger_file):
    code, out = _verify(ledger_file)
    assert code == 0 and out.startswith("ok: 10 rows, last seq 10")


@pytest.mark.parametrize(
    ("statements", "names"),
    [
        (["UPDATE events SET payload = replace(payload, 'u5', 'u9') WHERE seq = 5"], "seq 5"),
        (["UPDATE events SET thread_id = 'other' WHERE seq = 4"], "seq 4: thread/turn/kind/intent columns"),
        (["UPDATE events SET intent_id = 'in-forged' WHERE seq = 4"], "seq 4: thread/turn/kind/intent columns"),
        (["UPDATE events SET at = 99 WHERE seq = 3"], "seq 3"),
        (["DELETE FROM events WHERE seq = 6"], "seq 7: expected seq 6"),
        # reorder: swap the contents of two rows, keeping seqs
        (["UPDATE events SET seq = -2 WHERE seq = 2", "UPDATE events SET seq = 2 WHERE seq = 3",
          "UPDATE events SET seq = 3 WHERE seq = -2"], "seq 2"),
        (["DELETE FROM events WHERE seq > 8"], "cut off the tail"),
    ],
    ids=["edit-payload", "edit-column", "edit-intent-column", "edit-time", "delete-middle", "reorder", "truncate-tail"],
)
def test_damage_exits_1_and_names_where(ledger_file, statements, names):
    _tamper(ledger_file, *statements)
    code, out = _verify(ledger_file)
    assert code == 1, out
    assert "DAMAGED" in out and names in out


def test_verify_json(ledger_file):
    result = CliRunner().invoke(main, ["ledger", "verify", "--ledger", str(ledger_file), "--json"])
    assert result.exit_code == 0
    assert '"ok": true' in result.output


def test_missing_ledger_is_a_usage_error(tmp_path):
    code, out = _verify(tmp_path / "nope.sqlite3")
    assert code == 2 and "no ledger at" in out


def test_a_commit_during_verify_is_not_taken_for_a_forged_snapshot(ledger_file, monkeypatch):
    """A daemon commits a row and saves its fold snapshot while ``verify`` walks the
    chain: verify sees the ledger of one moment, so the snapshot it reads is never past
    the last row it walked (statement by statement it was: "beyond the chain (forged?)")."""
    read_snapshot = SQLiteRecorder._verifiable_snapshot

    def a_daemon_commits_first(self, name):
        with SQLiteRecorder(ledger_file) as daemon:
            daemon.append([turn(99)])
            projections.save(daemon, projections.load(daemon))
        return read_snapshot(self, name)

    with SQLiteRecorder(ledger_file) as rec:
        projections.save(rec, projections.load(rec))
        monkeypatch.setattr(SQLiteRecorder, "_verifiable_snapshot", a_daemon_commits_first)
        report = rec.verify()
    assert report.ok, report.problems
    with SQLiteRecorder(ledger_file) as rec:  # and the ledger the daemon left verifies too
        assert rec.verify().ok
