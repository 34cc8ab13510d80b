"""``tillerman status`` names the Codex release the daemon is attached to, and warns when
the error classification was not checked against it."""

from __future__ import annotations

import json

import msgspec
import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.controller.cli.status import version_warning
from tillerman.controller.core.rpc_errors import CHECKED_CODEX_VERSIONS
from tillerman.controller.daemon.link import HEARTBEAT
from tillerman.ledger.lock import LedgerLock
from tillerman.ledger.sqlite import SQLiteRecorder


@pytest.fixture
def ledger_with_daemon(tmp_path):
    """A ledger whose daemon is running (its lock held) and wrote `beat`."""
    path = tmp_path / "ledger.sqlite3"
    lock = LedgerLock(path)
    lock.acquire()

    def write(**link):
        codex = {"url": "unix:///s", "connected": True, "client_name": "tillerman", "since": 0.5, "error": None,
                 "server_version": None, "originator": None, "initialized_first": None} | link
        with SQLiteRecorder(path) as recorder:
            recorder.save_snapshot(HEARTBEAT, 0, msgspec.json.encode(
                {"pid": 1, "since": 0.0, "heartbeat": 1.0, "codex": codex}))
        return path

    yield write
    lock.release()


def _status(path, *flags):
    result = CliRunner().invoke(main, ["status", "--ledger", str(path), *flags])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_checked_release_is_shown_without_a_warning(ledger_with_daemon):
    path = ledger_with_daemon(server_version=CHECKED_CODEX_VERSIONS[-1], originator="codex_vscode")
    text = _status(path)
    assert f"server {CHECKED_CODEX_VERSIONS[-1]}" in text and "threads' originator codex_vscode" in text
    assert "warning" not in text
    daemon = json.loads(_status(path, "--json"))["daemon"]["codex"]
    assert (daemon["server_version"], daemon["originator"], daemon["server_version_checked"]) == (
        CHECKED_CODEX_VERSIONS[-1], "codex_vscode", True)


def test_an_unchecked_release_gets_one_warning_line(ledger_with_daemon):
    path = ledger_with_daemon(server_version="0.170.0", originator="tillerman")
    lines = [line for line in _status(path).splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "Codex 0.170.0 is not a release" in lines[0]
    assert all(version in lines[0] for version in CHECKED_CODEX_VERSIONS)
    assert json.loads(_status(path, "--json"))["daemon"]["codex"]["server_version_checked"] is False


def test_an_unknown_version_says_nothing(ledger_with_daemon):
    """A heartbeat from before the daemon recorded versions, or before the first attach."""
    path = ledger_with_daemon()
    assert "version unknown" in _status(path) and "warning" not in _status(path)
    daemon = json.loads(_status(path, "--json"))["daemon"]["codex"]
    assert daemon["server_version"] is None and daemon["server_version_checked"] is None


def test_version_warning_only_for_a_known_unchecked_version():
    assert version_warning({"server_version": None, "server_version_checked": None}) is None
    assert version_warning({"server_version": "0.163.0", "server_version_checked": True}) is None
    assert version_warning({"server_version": "0.1.0", "server_version_checked": False}).startswith(
        "warning: Codex 0.1.0")
