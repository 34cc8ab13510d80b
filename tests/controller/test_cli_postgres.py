"""The commands on a PostgreSQL ledger: ``--ledger postgresql://…`` or ``$TILLERMAN_LEDGER``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.controller.test_recheck import supervised
from tillerman.controller.cli.main import main
from tillerman.ledger.postgres import PostgresRecorder


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_writing_and_reading_commands_use_the_database(postgres_dsn, monkeypatch):
    propose = run("intent", "propose", "--thread", "T1", "--mode", "queue", "--text", "hello", "--json",
                  "--ledger", postgres_dsn)
    assert propose.exit_code == 0, propose.output
    intent_id = json.loads(propose.output)["id"]
    monkeypatch.setenv("TILLERMAN_LEDGER", postgres_dsn)  # the environment selects it as well
    listed = run("intents", "--json")
    assert listed.exit_code == 0, listed.output
    assert [i["id"] for i in json.loads(listed.output)] == [intent_id]
    verified = run("ledger", "verify")
    assert verified.exit_code == 0 and verified.output.startswith("ok: "), verified.output
    exported = run("ledger", "export")
    assert [json.loads(line)["seq"] for line in exported.output.splitlines()] == [1]
    status = run("status", "--json")
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["daemon"]["running"] is False
    cancelled = run("intent", "cancel", intent_id)
    assert cancelled.exit_code == 0, cancelled.output
    with PostgresRecorder(postgres_dsn, readonly=True) as ledger:
        assert ledger.max_seq() == 2 and ledger.verify().ok


def test_a_reading_command_on_an_empty_database_says_so_and_creates_nothing(postgres_dsn):
    result = run("intents", "--ledger", postgres_dsn)
    assert result.exit_code == 2 and "no tillerman ledger in" in result.output
    assert run("ledger", "verify", "--ledger", postgres_dsn).exit_code == 2
    result = run("intent", "propose", "--thread", "T1", "--mode", "queue", "--text", "x", "--ledger", postgres_dsn)
    assert result.exit_code == 0  # a writing command creates it


def test_replay_into_the_database(postgres_dsn):
    replayed = run("replay", "--json", "--ledger", postgres_dsn, "fixtures/sessions")
    assert replayed.exit_code == 0, replayed.output
    summary = json.loads(replayed.output)
    assert summary["ledger"] == postgres_dsn and summary["events"] > 0
    with PostgresRecorder(postgres_dsn, readonly=True) as ledger:
        assert ledger.verify().ok and ledger.max_seq() >= summary["events"]


def test_replay_check_decides_a_database_ledgers_decisions_again(postgres_dsn):
    with PostgresRecorder(postgres_dsn) as recorder:
        supervised(recorder)
    checked = run("replay", "--check", postgres_dsn, "--json")
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.output)["decisions"] == 3


def test_archive_refuses_a_database_in_one_line(postgres_dsn):
    result = run("ledger", "archive", "--before", "2026-01-01T00:00:00Z", "--ledger", postgres_dsn)
    assert result.exit_code == 2 and "works on a SQLite ledger file" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_several_daemons_share_a_database_and_status_shows_each(postgres_dsn, tmp_path):
    """``tillerman run`` on a database takes no lock: a second daemon starts beside the
    first, ``status`` lists both (id, host, pid, last renewal), and a daemon stopped
    cleanly leaves the list."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "tillerman", "run", "--no-codex", "--watch", str(tmp_path), "--ledger", postgres_dsn,
            "--lease", "3s"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    PostgresRecorder(postgres_dsn).close()  # the ledger, for status to read from the start
    daemons = [subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while len(listed := json.loads(run("status", "--json", "--ledger", postgres_dsn).output)["daemons"]) < 2:
            assert time.monotonic() < deadline and all(d.poll() is None for d in daemons), \
                [d.communicate() for d in daemons if d.poll() is not None]
            time.sleep(0.2)
        assert sorted(d["pid"] for d in listed) == sorted(d.pid for d in daemons)
        assert all(d["alive"] and d["lease_seconds"] == 3 and d["renewed_at"] for d in listed)
        data = json.loads(run("status", "--json", "--ledger", postgres_dsn).output)
        assert data["daemon"]["running"] is True
        shown = run("status", "--ledger", postgres_dsn).output
        assert all(f"pid {d.pid}, renewing" in shown for d in daemons), shown
    finally:
        daemons[0].send_signal(signal.SIGTERM)
        assert daemons[0].wait(30) == 0, daemons[0].communicate()
    assert [d["pid"] for d in json.loads(run("status", "--json", "--ledger", postgres_dsn).output)["daemons"]] == \
        [daemons[1].pid]  # a clean stop leaves
    daemons[1].send_signal(signal.SIGTERM)
    assert daemons[1].wait(30) == 0
    assert json.loads(run("status", "--json", "--ledger", postgres_dsn).output)["daemon"]["running"] is False


def test_lease_is_for_a_database_ledger(tmp_path):
    result = run("run", "--no-codex", "--watch", str(tmp_path), "--ledger", str(tmp_path / "l.sqlite3"),
                 "--lease", "10s")
    assert result.exit_code == 2 and "--lease is for several daemons on a PostgreSQL ledger" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_password_is_never_shown(postgres_dsn):
    with_password = postgres_dsn.replace("postgres@", "postgres:sekrit@")
    result = run("status", "--json", "--ledger", with_password)
    assert "sekrit" not in result.output


def test_a_password_in_the_query_is_never_shown_by_status(postgres_dsn):
    PostgresRecorder(postgres_dsn).close()  # the ledger's tables
    result = run("status", "--json", "--ledger", f"{postgres_dsn}&password=s3kr1t-query")
    assert result.exit_code == 0, result.output
    assert "s3kr1t" not in result.output and json.loads(result.output)["ledger"].endswith("&password=***")


@pytest.mark.parametrize("location", [
    "postgresql://alice:s3kr1t%zz@/tm?host=/nonexistent",  # libpq's own error quotes this token
    "postgresql://alice@/tm?host=/nonexistent&password=s3kr1t-query",
    "postgresql://alice@/tm?host=/nonexistent&pass%77ord=s3kr1t-encoded",
    "postgresql://alice:s3kr1t-userinfo@/tm?host=/nonexistent,/nowhere",
])
def test_a_connection_error_never_shows_the_password(location):
    result = run("intents", "--ledger", location)
    assert result.exit_code != 0 and "cannot connect to the ledger database" in result.output, result.output
    assert "s3kr1t" not in result.output and len(result.output.strip().splitlines()) == 1
