"""How often a replay into a SQLite ledger commits: every COMMIT_EVERY rows or so through
the ledger's own appends, every LOAD_COMMIT_EVERY through its load (the writer process,
``tillerman.ledger.load``), whose commits each rewrite the id index pages they touched."""

from bench.sessions import rollout_name, write_rollout
from tillerman.controller import replay
from tillerman.controller.replay import Replayer
from tillerman.ledger import sqlite
from tillerman.ledger.load import LedgerLoad
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.config import load_effective


class _CountingLoad(LedgerLoad):
    commits = 0

    def bulk(self):
        _CountingLoad.commits += 1
        return super().bulk()


def _commits(session, loaded: bool, monkeypatch, tmp_path) -> tuple[int, int]:
    """(commits, rows) of a replay of ``session`` into a new SQLite ledger."""
    monkeypatch.setattr(replay, "LOAD_BYTES", 0 if loaded else 1 << 62)
    _CountingLoad.commits = 0
    blocks = []
    with SQLiteRecorder(tmp_path / f"ledger-{loaded}.sqlite3") as ledger:
        bulk = ledger.bulk
        monkeypatch.setattr(ledger, "bulk", lambda: blocks.append(1) or bulk())
        Replayer(ledger, load_effective(None, None).ruleset, parse_ahead=True).run([str(session)])
        assert ledger.verify().ok
        rows = ledger.max_seq()
    assert (_CountingLoad.commits > 0) == loaded
    return (_CountingLoad.commits if loaded else len(blocks)), rows


def test_a_load_commits_less_often_than_the_ledgers_own_appends(monkeypatch, tmp_path):
    session = tmp_path / rollout_name(3)
    write_rollout(str(session), 20_000, seed=3)
    # Observations are appended replay.BATCH at a time: a commit follows the append that
    # reaches the count.
    monkeypatch.setattr(replay, "COMMIT_EVERY", replay.BATCH)
    monkeypatch.setattr(replay, "LOAD_COMMIT_EVERY", 4 * replay.BATCH)
    monkeypatch.setattr(replay, "_may_fork", lambda: False)
    monkeypatch.setattr(sqlite, "LedgerLoad", _CountingLoad)
    own, rows = _commits(session, False, monkeypatch, tmp_path)
    loaded, loaded_rows = _commits(session, True, monkeypatch, tmp_path)
    assert rows == loaded_rows > 16 * replay.BATCH
    assert loaded >= 4 and own >= 3 * loaded  # four times the rows in a commit, about
