"""Which app-server a bare ``tillerman run`` attaches to, and under which name."""

from __future__ import annotations

import pytest

from tillerman.monitor.codex_home import resolve_target

HOME = {"CODEX_HOME": "/h/codex"}
DEFAULT = "unix:///h/codex/app-server-control/app-server-control.sock"


@pytest.mark.parametrize("url, client_name, expected", [
    (None, None, (DEFAULT, "codex-tui", True)),  # no --codex: Codex's shared server, the TUI's name
    ("unix://", None, (DEFAULT, "codex-tui", True)),  # a bare unix:// means the same, as it does to Codex
    (DEFAULT, None, (DEFAULT, "codex-tui", True)),
    (None, "my-ide", (DEFAULT, "my-ide", True)),  # an explicit name always wins
    ("unix:///run/other.sock", None, ("unix:///run/other.sock", "tillerman", False)),
    ("ws://127.0.0.1:4500", None, ("ws://127.0.0.1:4500", "tillerman", False)),
])
def test_target(url, client_name, expected):
    target = resolve_target(url, client_name, HOME)
    assert (target.url, target.client_name, target.default_socket) == expected


def test_codex_home_defaults_to_dot_codex(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    target = resolve_target(None, None, {})
    assert target.url == f"unix://{tmp_path}/.codex/app-server-control/app-server-control.sock"


def test_a_relative_socket_path_is_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert resolve_target("unix://s.sock", None, HOME).url == f"unix://{tmp_path}/s.sock"
