import functools
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.installs import OtherUser, build_wheel, fresh_venv, install_for_other_user, why_no_other_user

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    """No test reads or writes the user's real ledger, config or Codex home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("TILLERMAN_LEDGER", raising=False)
    os.umask(0o022)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this tree, built as a user's ``pip install`` builds it, once per run."""
    return build_wheel(tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """The wheel in a fresh virtual environment, without the dev extra; its bin folder."""
    return fresh_venv(tmp_path_factory.mktemp("installed") / "venv", wheel)


@pytest.fixture(scope="session")
def other_user(wheel: Path) -> Iterator[OtherUser]:
    """``nobody``, with the wheel in a virtual environment of theirs: the checkout may sit
    in a private folder that nobody cannot enter (pytest's own temporary folders are
    private too, so this one is made apart and removed afterwards). Skipped, with the
    reason, where this run cannot act as another user."""
    if (reason := why_no_other_user()) is not None:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="tillerman-other-user-"))
    try:
        yield install_for_other_user(folder, wheel)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """One throwaway PostgreSQL server for the run (``fixtures.postgres_server``). Where
    none can start the test is skipped with the reason; under CI it fails instead, since
    ``.ci/run`` installs the server."""
    from fixtures.postgres_server import ThrowawayPostgres

    require_postgres()
    server = ThrowawayPostgres().start()
    yield server
    server.stop()


def require_postgres() -> None:
    """Install Debian's server with apt where none is found (as the browser tests install
    chromium), then skip (with the reason) where no throwaway server can start; under CI,
    fail."""
    from fixtures.postgres_server import install, server_bin, unavailable

    if server_bin() is None and shutil.which("apt-get") is not None and os.geteuid() == 0:
        try:
            install()
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"installing PostgreSQL failed: {exc}")
    if (reason := unavailable()) is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the PostgreSQL tests, but {reason}")
        pytest.skip(f"PostgreSQL tests skipped: {reason}")


@pytest.fixture
def postgres_dsn(postgres_server):
    """A new, empty database on the run's server, dropped after the test; its DSN."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    dsn = postgres_server.create_database(name)
    yield dsn
    postgres_server.drop_database(name)


def pytest_collection_modifyitems(items):
    """A test that needs the server is marked ``postgres`` (``-m 'not postgres'`` leaves them out)."""
    for item in items:
        if "postgres_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A live test runs the Codex release under test (``fixtures.codex_npm``), fetched from
    npm the first time; where it cannot be, the test is skipped with the reason, and
    under CI it fails instead."""
    if item.get_closest_marker("live") is None:
        return
    if (reason := why_no_codex()) is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the live tests, but {reason}")
        pytest.skip(f"live tests skipped: {reason}")


@functools.cache
def why_no_codex() -> str | None:
    """Asked once per run: a registry that is not there is not asked again for each test."""
    from fixtures.codex_npm import CodexUnavailable, codex_under_test

    try:
        codex_under_test()
    except CodexUnavailable as reason:
        return str(reason)
    return None
