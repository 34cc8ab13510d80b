"""The scripted Anthropic model drives the real Claude Code CLI 2.1.332, headless and
offline: what the other Claude live tests stand on."""

import time
from pathlib import Path

import pytest

from fixtures.anthropic_model import AnthropicModel
from fixtures.claude_cli import ClaudeSession, ClaudeUnavailable, claude_binary, is_result, is_tool_use

pytestmark = pytest.mark.live


def test_a_tool_turn_runs_and_a_mid_turn_message_reaches_the_model(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path) -> None:
    with ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        session.user("RUN: sleep 2")
        session.wait_for(is_tool_use)
        session.user("STEER: also mention bananas")
        result = session.wait_for(is_result)
        assert result["terminal_reason"] == "completed"
        assert "STEER: also mention bananas" in result["result"]  # folded in at the tool round
        assert len(result["user_message_uuids"]) == 2
        assert session.close() == 0
    assert session.transcript.exists()
    assert all(r.path.startswith("/v1/messages") for r in anthropic_model.requests)


def test_wait_holds_the_turn_until_the_file_exists_and_an_interrupt_cuts_it(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path) -> None:
    release = tmp_path / "release"
    with ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        session.user(f"WAIT: {release}")
        session.wait_for(lambda line: line.get("type") == "system" and line.get("subtype") == "init")
        time.sleep(1.0)
        assert not session.results()  # held
        request_id = session.control("interrupt")
        answer = session.wait_for(lambda line: line.get("type") == "control_response")
        assert answer["response"]["request_id"] == request_id
        result = session.wait_for(is_result)
        assert result["terminal_reason"] == "aborted_streaming"
        session.user(f"WAIT: {release}")
        release.touch()
        start = len(session.lines)
        released = session.wait_for(is_result, start=start)
        assert released["result"] == f"released: {release}"


def test_an_api_failure_is_an_error_result(claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path) -> None:
    with ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        session.user("FAIL: 400")
        result = session.wait_for(is_result)
        assert (result["is_error"], result["terminal_reason"]) == (True, "api_error")
        assert session.close() == 1


def test_without_npm_the_install_fails_with_a_reason_to_skip(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TILLERMAN_CLAUDE_BIN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ClaudeUnavailable, match="npm is not installed"):
        claude_binary()
