"""Finding a ``codex`` binary and running ``codex app-server`` from it.

``AppServer(codex_home, binary=...).start()`` runs ``codex app-server --listen
unix://SOCKET`` on a CODEX_HOME and waits until the socket accepts connections;
``tillerman run --spawn-codex`` (with the binary `find_codex_binary` picks), the tests
and the demo (with the release ``fixtures.codex_npm`` fetches, or
``$TILLERMAN_CODEX_BIN``) all start it this way. Codex replaces the
socket path with a symlink to ``/tmp/codex-daemon-<uid>/<sha256>`` (mode 0600), so
only the same uid can connect.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

CODEX_BIN_ENV = "TILLERMAN_CODEX_BIN"
INSTALL_HINT = "install Codex (npm install -g @openai/codex) or pass --codex-bin PATH"


class CodexBinaryMissing(RuntimeError):
    """No usable Codex binary where we looked."""


def find_codex_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The ``codex`` to run: `explicit` (``--codex-bin``), else ``$TILLERMAN_CODEX_BIN``,
    else ``codex`` on PATH, where ``npm install -g @openai/codex`` puts it."""
    for origin, value in (("--codex-bin", explicit), (CODEX_BIN_ENV, os.environ.get(CODEX_BIN_ENV))):
        if value:
            binary = Path(value).expanduser()
            if not (binary.is_file() and os.access(binary, os.X_OK)):
                raise CodexBinaryMissing(f"{origin} {binary}: no executable file there; {INSTALL_HINT}")
            return binary
    on_path = shutil.which("codex")
    if on_path is None:
        raise CodexBinaryMissing(f"no codex binary on PATH; {INSTALL_HINT}")
    return Path(on_path)


def helper_path_dir(binary: Path) -> Path | None:
    """The helper directory (ripgrep) a packaged Codex expects on PATH: ``codex-path``
    beside the binary's ``bin/``, in the layout of the openai-codex-cli-bin package.
    Read from the binary's location, so a binary of another release, or one installed
    without Python, gets its own helpers or none."""
    helpers = binary.resolve().parent.parent / "codex-path"
    return helpers if helpers.is_dir() else None


def codex_environment(codex_home: Path, binary: Path, *, isolated_home: bool = True) -> dict[str, str]:
    """The environment every Codex process of one CODEX_HOME runs with (server, TUI, daemon)."""
    env = dict(os.environ, CODEX_HOME=str(codex_home))
    if isolated_home:
        # For tests and the demo, HOME is the CODEX_HOME too, so the agent's `bash -lc`
        # sources no user dotfiles: a login shell that runs e.g. `pyenv init` and is
        # terminated mid-rehash leaves a lock that stalls every later shell for a minute.
        env["HOME"] = str(codex_home)
    path_dir = helper_path_dir(binary)
    if path_dir is not None:
        env["PATH"] = f"{path_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


class AppServerStartError(RuntimeError):
    pass


class AppServer:
    """One `codex app-server --listen unix://…` process on a given CODEX_HOME."""

    def __init__(self, codex_home: Path, socket_path: Path | None = None, *, binary: Path | None = None,
                 isolated_home: bool = True, cwd: Path | None = None):
        self.codex_home = codex_home
        self.binary = binary  # None: the one `find_codex_binary` finds
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
        self.binary = self.binary or find_codex_binary()
        env = codex_environment(self.codex_home, self.binary, isolated_home=self.isolated_home)
        with open(self.stderr_path, "ab") as stderr:
            self.process = subprocess.Popen(
                [str(self.binary), "app-server", "--listen", self.listen_url],
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


