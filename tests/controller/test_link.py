"""What ``status`` says about the daemon's connection (tillerman.controller.daemon.link)."""

from __future__ import annotations

import pytest

from tillerman.controller.daemon.link import Link

AGENT = "codex-tui/0.163.0 (Debian 12.0.0; x86_64) xterm-256color (tillerman; 0.1.0)"


@pytest.mark.parametrize("client_name, default_socket, agent, first", [
    ("tillerman", False, "tillerman/0.163.0 (x)", True),  # no harness is called tillerman
    ("tillerman", False, "harness/0.163.0 (x)", False),
    ("codex-tui", True, "codex-tui/0.163.0 (x)", None),  # the TUI's own name: cannot tell who was first
    ("codex-tui", True, "codex_app_server_daemon/0.163.0 (x)", False),
])
def test_who_initialized_the_server_first(client_name, default_socket, agent, first):
    link = Link("unix:///s", client_name, default_socket)
    link.up({"userAgent": agent}, 10.0)
    assert link.first_initializer is first and link.connected and link.error is None


def test_a_failure_while_nothing_listens_on_codexs_socket_says_how_to_start_it():
    link = Link("unix:///h/app-server-control/app-server-control.sock", "codex-tui", True, since=1.0)
    line = link.failed("[Errno 2] No such file or directory", 5.0, nothing_listens=True)
    assert "codex app-server daemon start" in line and "\n" not in line
    assert link.as_dict()["error"] == "[Errno 2] No such file or directory" and link.since == 1.0
    other = Link("unix:///run/x.sock", "tillerman", False)
    assert "daemon start" not in other.failed("refused", 5.0, nothing_listens=True)


def test_a_lost_connection_restarts_the_clock_of_connecting():
    link = Link("unix:///s", "tillerman", False, since=1.0)
    link.up({"userAgent": AGENT}, 2.0)
    link.failed("the server closed the connection", 9.0, nothing_listens=False)
    assert link.since == 9.0 and not link.connected
