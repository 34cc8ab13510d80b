"""The throwaway PostgreSQL server the PostgreSQL tests run against."""

import os

import psycopg

from fixtures.postgres_server import _alive


def test_the_server_listens_on_its_socket_only(postgres_server, postgres_dsn):
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT current_setting('listen_addresses')").fetchone() == ("",)
        assert conn.execute("SELECT current_setting('unix_socket_directories')").fetchone() == (
            str(postgres_server.socket_dir),)
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    assert _alive(postgres_server.pid)
    assert os.stat(postgres_server.root / "data").st_uid != 0 or os.geteuid() != 0  # never run as root


def test_a_stopped_server_is_gone_with_its_folder(postgres_server):
    from fixtures.postgres_server import ThrowawayPostgres

    server = ThrowawayPostgres().start()
    pid, root = server.pid, server.root
    server.stop()
    assert not _alive(pid) and not root.exists()


def test_without_a_server_a_developer_is_told_why_and_ci_fails(monkeypatch):
    import pytest

    import fixtures.postgres_server as server
    from tests.conftest import require_postgres

    monkeypatch.setattr(server, "BIN_FOLDERS", ("/nonexistent",))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL server binaries"):
        require_postgres()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI runs the PostgreSQL tests"):
        require_postgres()
