"""Running the real ``codex app-server`` from the pinned ``openai-codex-cli-bin`` package.

``AppServer(codex_home).start()`` runs ``codex app-server --listen unix://SOCKET`` on a
CODEX_HOME and waits until the socket accepts connections; ``tillerman run
--spawn-codex``, the tests and the demo all start it this way. Codex replaces the
socket path with a symlink to ``/tmp/codex-daemon-<uid>/<sha256>`` (mode 0600), so
only the same uid can connect.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

INSTALL_HINT = "pip install -e '.[dev]'"


class CodexBinaryMissing(RuntimeError):
    """The pinned Codex binary is not installed in this environment."""


def find_codex_binary() -> Path:
    """The `codex` executable shipped by the installed `openai-codex-cli-bin` package."""
    try:
        import codex_cli_bin
    except ImportError:
        raise CodexBinaryMissing(
            f"the real Codex binary comes from the openai-codex-cli-bin package, which is "
            f"not installed; run {INSTALL_HINT}"
        ) from None
    try:
        binary = codex_cli_bin.bundled_codex_path()
    except FileNotFoundError as exc:
        raise CodexBinaryMissing(f"{exc}; reinstall with {INSTALL_HINT}") from None
    if not os.access(binary, os.X_OK):
        raise CodexBinaryMissing(f"{binary} is not executable; reinstall with {INSTALL_HINT}")
    return binary


def _codex_path_dir() -> Path | None:
    """The package's helper dir (ripgrep) that Codex expects on PATH."""
    import codex_cli_bin

    return codex_cli_bin.bundled_path_dir()


def codex_environment(codex_home: Path, *, isolated_home: bool = True) -> dict[str, str]:
    """The environment every Codex process of one CODEX_HOME runs with (server, TUI, daemon)."""
    env = dict(os.environ, CODEX_HOME=str(codex_home))
    if isolated_home:
        # For tests and the demo, HOME is the CODEX_HOME too, so the agent's `bash -lc`
        # sources no user dotfiles: a login shell that runs e.g. `pyenv init` and is
        # terminated mid-rehash leaves a lock that stalls every later shell for a minute.
        env["HOME"] = str(codex_home)
    path_dir = _codex_path_dir()
    if path_dir is not None:
        env["PATH"] = f"{path_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


class AppServerStartError(RuntimeError):
    pass


class AppServer:
    """One `codex app-server --listen unix://…` process on a given CODEX_HOME."""

    def __init__(self, codex_home: Path, socket_path: Path | None = None, *, isolated_home: bool = True,
                 cwd: Path | None = None):
        self.codex_home = codex_home
        self.cwd = cwd  # a client that sends no cwd (`codex --remote`) works here
        self.isolated_home = isolated_home
        self.socket_path = socket_path or codex_home / "app-server.sock"
        self.stderr_path = codex_home / "app-server.stderr.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def listen_url(self) -> str:
        """What ``--listen`` gets; a subclass may name the socket differently (e.g. ``unix://``)."""
        return self.url

    @property
    def sessions_dir(self) -> Path:
        return self.codex_home / "sessions"

    def rollout_files(self) -> list[Path]:
        """The rollout JSONL files the server has written so far, oldest name first."""
        return sorted(self.sessions_dir.rglob("rollout-*.jsonl"))

    def start(self, timeout: float = 15.0) -> AppServer:
        env = codex_environment(self.codex_home, isolated_home=self.isolated_home)
        with open(self.stderr_path, "ab") as stderr:
            self.process = subprocess.Popen(
                [str(find_codex_binary()), "app-server", "--listen", self.listen_url],
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                start_new_session=True,  # a Ctrl-C in the test terminal is ours to handle
            )
        self._wait_until_accepting(timeout)
        return self

    def _wait_until_accepting(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise AppServerStartError(
                    f"codex app-server exited with {self.process.returncode}: {self.stderr_tail()}"
                )
            if self._accepts_connections():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise AppServerStartError(
                    f"codex app-server did not listen on {self.socket_path} within {timeout}s: "
                    f"{self.stderr_tail()}"
                )
            time.sleep(0.02)

    def _accepts_connections(self) -> bool:
        if not self.socket_path.exists():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket_path))
            except OSError:
                return False
        return True

    def stderr_tail(self, max_chars: int = 2000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-max_chars:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM (the server exits 0 on it), then SIGKILL if it lingers. Returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, for fault tests: no cleanup happens on the server side."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


