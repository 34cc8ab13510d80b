"""``tillerman hooks install|uninstall --claude`` merge into Claude Code's settings without
touching the user's own hooks; ``tillerman hook claude`` keeps each payload as a line."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tillerman.controller.claude.hook import keep_payload
from tillerman.controller.claude.settings import HOOK_EVENTS, HOOK_MODULE, is_ours, with_our_hooks, without_our_hooks
from tillerman.controller.cli.main import main
from tillerman.monitor.formats import detect_format

USERS = {
    "model": "sonnet",
    "hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "~/bin/guard.sh"}]}],
        "Stop": [{"matcher": "", "hooks": [{"type": "command", "command": "notify-send done"}]}],
    },
}
OURS = "/venv/bin/python -m tillerman hook claude --spool /s"


def test_install_adds_ours_to_every_event_beside_the_users_own() -> None:
    merged = with_our_hooks(USERS, OURS)
    assert merged["model"] == "sonnet"
    assert set(merged["hooks"]) == set(HOOK_EVENTS)
    assert merged["hooks"]["PreToolUse"][0] == USERS["hooks"]["PreToolUse"][0]  # first, as it was
    assert merged["hooks"]["Stop"][0] == USERS["hooks"]["Stop"][0]
    for event in HOOK_EVENTS:
        assert sum(is_ours(h) for g in merged["hooks"][event] for h in g["hooks"]) == 1


def test_installing_twice_changes_nothing_and_uninstall_gives_back_exactly_the_users_settings() -> None:
    once = with_our_hooks(USERS, OURS)
    assert with_our_hooks(once, OURS) == once
    assert without_our_hooks(once) == USERS
    assert without_our_hooks(with_our_hooks({}, OURS)) == {}


def test_a_group_shared_with_a_users_hook_keeps_the_users_hook() -> None:
    shared = {"hooks": {"Stop": [{"matcher": "", "hooks": [{"type": "command", "command": "mine"},
                                                           {"type": "command", "command": OURS}]}]}}
    assert without_our_hooks(shared) == {"hooks": {"Stop": [{"matcher": "", "hooks": [
        {"type": "command", "command": "mine"}]}]}}


def test_the_commands_write_settings_and_refuse_a_file_they_cannot_read(tmp_path: Path) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps(USERS))
    runner = CliRunner()
    result = runner.invoke(main, ["hooks", "install", "--claude", "--project", str(tmp_path),
                                  "--spool", str(tmp_path / "spool")])
    assert result.exit_code == 0, result.output
    installed = json.loads(settings.read_text())
    assert installed["hooks"]["Stop"][0] == USERS["hooks"]["Stop"][0] and len(installed["hooks"]["Stop"]) == 2
    result = runner.invoke(main, ["hooks", "uninstall", "--claude", "--project", str(tmp_path)])
    assert result.exit_code == 0 and json.loads(settings.read_text()) == USERS
    settings.write_text("{not json")
    result = runner.invoke(main, ["hooks", "install", "--claude", "--project", str(tmp_path)])
    assert result.exit_code == 2 and "cannot read it as JSON" in result.output
    assert settings.read_text() == "{not json"  # never clobbered
    result = runner.invoke(main, ["hooks", "install", "--project", str(tmp_path)])
    assert result.exit_code == 2 and "--claude" in result.output


def test_the_hook_keeps_each_payload_as_a_line_and_fails_open(tmp_path: Path) -> None:
    payload = {"session_id": "11917acb-0f47", "hook_event_name": "Stop", "stop_hook_active": False}
    runner = CliRunner()
    for _ in range(2):
        result = runner.invoke(main, ["hook", "claude", "--spool", str(tmp_path)], input=json.dumps(payload, indent=2))
        assert result.exit_code == 0 and result.output == ""  # no decision: the session goes on
    spooled = tmp_path / "11917acb-0f47.jsonl"
    lines = spooled.read_bytes().splitlines(keepends=True)
    assert [json.loads(line) for line in lines] == [payload, payload]
    assert detect_format(spooled.read_bytes(), str(spooled)) == "claude-hooks"
    result = runner.invoke(main, ["hook", "claude", "--spool", str(tmp_path)], input="{cut")
    assert result.exit_code == 0 and "payload not kept" in result.output
    assert keep_payload(b'{"session_id": "../../etc"}', tmp_path).name == "unknown-session.jsonl"


def test_the_hook_command_that_earlier_versions_installed_still_runs(tmp_path: Path) -> None:
    """Users' settings.json outlive upgrades: the line every version so far wrote must keep
    working however the controller's modules move, and new installs write the same."""
    earlier = f"{shlex.quote(sys.executable)} -m tillerman.controller.claude_hook --spool {tmp_path}"
    assert HOOK_MODULE == "tillerman.controller.claude_hook"
    payload = {"session_id": "5b4e-4d21", "hook_event_name": "Stop", "stop_hook_active": False}
    done = subprocess.run(shlex.split(earlier), input=json.dumps(payload).encode(), capture_output=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert json.loads((tmp_path / "5b4e-4d21.jsonl").read_text()) == payload


def test_install_over_a_symlinked_settings_file_writes_through_to_its_target(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles" / "claude-settings.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text(json.dumps(USERS))
    link = tmp_path / ".claude" / "settings.json"
    link.parent.mkdir()
    link.symlink_to(dotfiles)
    result = CliRunner().invoke(main, ["hooks", "install", "--claude", "--project", str(tmp_path),
                                       "--spool", str(tmp_path / "spool")])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and len(json.loads(dotfiles.read_text())["hooks"]["Stop"]) == 2
    result = CliRunner().invoke(main, ["hooks", "uninstall", "--claude", "--project", str(tmp_path)])
    assert result.exit_code == 0 and link.is_symlink() and json.loads(dotfiles.read_text()) == USERS


@pytest.mark.parametrize(("text", "words"), [
    ("[" * 600 + "]" * 600, "nested deeper than"),
    ('{"hooks": {}, "a": ' + "[" * 100 + "]" * 100 + "}", "nested deeper than"),
    ('{"cleanupPeriodDays": 1e400}', "too large to write back"),
    ('{"a": NaN}', "NaN is not a JSON number"),
    ('{"model": "a", "model": "b"}', 'the key "model" appears twice'),
    ('{"env": {"A": "1", "A": "2"}}', 'the key "A" appears twice'),
])
def test_settings_that_cannot_be_written_back_exactly_are_refused_and_left_as_they_were(
        tmp_path: Path, text: str, words: str) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(text)
    for command in ("install", "uninstall"):
        result = CliRunner().invoke(main, ["hooks", command, "--claude", "--project", str(tmp_path)])
        assert result.exit_code == 2 and words in result.output, result.output
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
        assert settings.read_text() == text
