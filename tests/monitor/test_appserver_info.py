"""Reading the server's identity from `initialize`, and one line for a failed connection."""

from __future__ import annotations

import pytest
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosedError, InvalidMessage, InvalidStatus
from websockets.frames import Close
from websockets.http11 import Response

from tillerman.monitor.appserver_info import ServerIdentity, describe_failure, server_identity

# As the real servers send them (tests/live/test_spawn_codex_live.py reads the live one).
AGENT_0163 = "harness-x/0.163.0 (Debian 12.0.0; x86_64) xterm (tillerman; 0.1.0)"
AGENT_0154 = "codex_vscode/0.154.0 (Debian 12.0.0; x86_64) xterm (tillerman; 0.1.0)"


@pytest.mark.parametrize(("user_agent", "expected"), [
    (AGENT_0163, ServerIdentity("0.163.0", "harness-x")),
    (AGENT_0154, ServerIdentity("0.154.0", "codex_vscode")),
    ("tillerman/0.170.0-alpha.2 (Mac OS 15.1; arm64) iTerm.app/3.5 (tillerman; 0.1.0)",
     ServerIdentity("0.170.0-alpha.2", "tillerman")),
    ("tillerman/0.163.0", ServerIdentity("0.163.0", "tillerman")),
])
def test_version_and_originator_come_from_the_user_agent(user_agent, expected):
    assert server_identity({"userAgent": user_agent, "platformOs": "linux"}) == expected


@pytest.mark.parametrize("result", [
    {}, None, [], {"userAgent": None}, {"userAgent": 163}, {"userAgent": "codex"},
    {"userAgent": "tillerman/next (linux)"}, {"userAgent": " tillerman/0.163.0"},
])
def test_an_unreadable_user_agent_is_unknown_never_an_error(result):
    assert server_identity(result) == ServerIdentity(None, None)


def _refused(status: int, reason: str, body: bytes) -> InvalidStatus:
    return InvalidStatus(Response(status, reason, Headers(), body))


def test_an_http_refusal_names_status_reason_and_body():
    line = describe_failure(_refused(403, "Forbidden", b"Origin header\nnot allowed\n"))
    assert line == "server answered HTTP 403 Forbidden: Origin header not allowed"


def test_a_long_body_is_cut():
    line = describe_failure(_refused(500, "Internal Server Error", b"x" * 5000))
    assert line.startswith("server answered HTTP 500 Internal Server Error: xxx") and line.endswith("…")
    assert len(line) < 300


def test_a_timeout_names_the_refusal_it_kept_getting():
    """What Codex up to 0.155.1 did to a compression offer: closed the socket unanswered;
    the retry loop then timed out, and the daemon logged `connection lost ()`."""
    try:
        try:
            raise InvalidMessage("did not receive a valid HTTP response") from EOFError(
                "connection closed while reading HTTP status line")
        except InvalidMessage as last:
            raise TimeoutError("no connection to unix:///s within 10s") from last
    except TimeoutError as exc:
        line = describe_failure(exc)
    assert line == ("no connection to unix:///s within 10s: did not receive a valid HTTP response: "
                    "connection closed while reading HTTP status line")


def test_an_empty_message_becomes_the_exception_type_and_the_version_is_added():
    assert describe_failure(TimeoutError()) == "TimeoutError"
    assert describe_failure(TimeoutError(), "0.163.0") == "TimeoutError (server 0.163.0)"


def test_a_close_frame_is_described_and_the_line_is_one_line():
    closed = ConnectionClosedError(Close(1011, "internal\nerror"), None)
    line = describe_failure(closed)
    assert "1011" in line and "\n" not in line


def test_a_suppressed_context_is_not_shown():
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise ConnectionResetError("reset by peer") from None
    except ConnectionResetError as exc:
        assert describe_failure(exc) == "reset by peer"
