"""A ledger is known by its real path: a symlink to it, or a path through a symlinked
folder, names the same lock, head anchor and archive segments (tillerman.ledger.paths)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger.test_archive import BEFORE, cli, history_ledger, live_seqs
from tillerman.ledger.errors import LedgerLocked
from tillerman.ledger.lock import LedgerLock
from tillerman.ledger.paths import ledger_files
from tillerman.ledger.segments import segment_dir


@pytest.fixture
def ledger(tmp_path) -> Path:
    (tmp_path / "real").mkdir()
    return history_ledger(tmp_path / "real" / "l.sqlite3")


def _other_names(ledger: Path) -> list[Path]:
    """The ledger through a symlink to the file, and through a symlinked folder."""
    link = ledger.parent.parent / "link.sqlite3"
    link.symlink_to(ledger)
    folder = ledger.parent.parent / "folder-link"
    folder.symlink_to(ledger.parent, target_is_directory=True)
    return [link, folder / ledger.name]


def test_every_name_of_a_ledger_names_the_same_files(ledger):
    for other in _other_names(ledger):
        assert ledger_files(other) == ledger_files(ledger)
        assert segment_dir(other) == segment_dir(ledger)


def test_verify_through_a_symlink_finds_the_anchor(ledger):
    for other in _other_names(ledger):
        result = cli("ledger", "verify", "--ledger", str(other))
        assert result.exit_code == 0, result.output
        assert result.output.startswith("ok: 10 rows")


def test_a_daemon_on_the_real_path_refuses_a_second_through_a_symlink(ledger):
    for other in _other_names(ledger):
        with LedgerLock(ledger), pytest.raises(LedgerLocked, match="another tillerman daemon"):
            LedgerLock(other).acquire()
        with LedgerLock(other), pytest.raises(LedgerLocked):
            LedgerLock(ledger).acquire()


def test_archive_through_a_symlink_is_refused_while_the_daemon_holds_the_real_path(ledger):
    (link, _) = _other_names(ledger)
    with LedgerLock(ledger):
        result = cli("ledger", "archive", "--before", BEFORE, "--ledger", str(link))
    assert result.exit_code == 2 and "stop it before archiving" in result.output
    assert live_seqs(ledger) == list(range(1, 11))


def test_archive_through_a_symlink_puts_the_segment_beside_the_real_ledger(ledger):
    (link, _) = _other_names(ledger)
    result = cli("ledger", "archive", "--before", BEFORE, "--ledger", str(link))
    assert result.exit_code == 0, result.output
    assert list(Path(f"{ledger}.segments").glob("seq-*.sqlite3"))
    assert not Path(f"{link}.segments").exists() and not Path(f"{link}.head").exists()
    for name in (ledger, link):
        verified = cli("ledger", "verify", "--ledger", str(name))
        assert verified.exit_code == 0 and verified.output.startswith("ok:"), verified.output
