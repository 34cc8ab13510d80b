import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

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


def fresh_venv(root: Path, *requirements: str | Path) -> Path:
    """A new virtual environment in ``root`` with ``requirements`` pip-installed; its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", root], check=True)
    pip = [root / "bin" / "python", "-m", "pip", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", *requirements], check=True, timeout=600)
    return root / "bin"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this tree, built as a user's ``pip install`` builds it, once per run."""
    # From a copy of the files git would ship (tracked, or new and not ignored): setuptools
    # packs whatever a local build/ folder still holds, so a stale build of an older layout
    # would slip into a wheel of the working tree.
    source, dist = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check", "wheel", "--no-deps",
                    "--wheel-dir", dist, source], check=True, timeout=600)
    (built,) = dist.glob("tillerman-*.whl")
    return built


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """The wheel in a fresh virtual environment, without the dev extra; its bin folder."""
    return fresh_venv(tmp_path_factory.mktemp("installed") / "venv", wheel)


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
