"""tillerman's hooks installed in a scratch HOME, the real Claude Code CLI 2.1.332 run
headless against the scripted model: every hook payload is kept, and replaying the
spool gives the turns the CLI's own stdout reports."""

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.anthropic_model import AnthropicModel
from fixtures.claude_cli import ClaudeSession, is_result, is_tool_use
from tillerman.controller.cli.main import main

pytestmark = pytest.mark.live


def test_installed_hooks_keep_every_payload_and_replay_to_the_clis_turns(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path) -> None:
    home, spool = tmp_path / "home", tmp_path / "spool"
    home.mkdir()
    (home / ".claude").mkdir()
    (home / ".claude" / "settings.json").write_text(json.dumps({"hooks": {"Stop": [{"matcher": "", "hooks": [
        {"type": "command", "command": f"touch {tmp_path / 'users-own-hook-ran'}"}]}]}}))
    runner = CliRunner(env={"HOME": str(home)})
    assert runner.invoke(main, ["hooks", "install", "--claude", "--user", "--spool", str(spool)]).exit_code == 0
    with ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        session.user("RUN: sleep 1")
        session.wait_for(is_tool_use)
        session.user("STEER: hooked")  # folded into the running turn
        session.wait_for(is_result)
        session.user("FAIL: 400")
        session.wait_for(lambda line: is_result(line) and line.get("terminal_reason") == "api_error")
        session_id = session.session_id
        spooled = spool / f"{session_id}.jsonl"
        # StopFailure's hook runs after the result line: with stdin closed at once its
        # payload was missing in our runs, so the test waits for it first.
        _until(lambda: "StopFailure" in spooled.read_text())
        assert session.close() == 1
    assert (tmp_path / "users-own-hook-ran").exists()  # the user's hook still runs beside ours
    names = [json.loads(line)["hook_event_name"] for line in spooled.read_text().splitlines()]
    assert names[0] == "SessionStart" and names[-1] == "SessionEnd"
    assert {"UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "StopFailure"} <= set(names), names
    assert names.count("UserPromptSubmit") == 3  # two prompts and the folded message
    result = runner.invoke(main, ["replay", "--json", str(spooled)])
    assert result.exit_code == 0, result.output
    [replayed] = json.loads(result.output)["files"]
    assert replayed["format"] == "claude-hooks"
    assert (replayed["turns"], replayed["interrupted_turns"], replayed["unclosed_turns"]) == (2, 0, 0)
    assert replayed["quarantined"] == 0
    # Uninstalling leaves exactly the user's own hook.
    assert runner.invoke(main, ["hooks", "uninstall", "--claude", "--user"]).exit_code == 0
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    assert settings == {"hooks": {"Stop": [{"matcher": "", "hooks": [
        {"type": "command", "command": f"touch {tmp_path / 'users-own-hook-ran'}"}]}]}}


def _until(done, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
