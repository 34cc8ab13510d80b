"""The Claude Code hook never exits 2 unless it delivers a decision: Claude Code reads
exit 2 as "block this action". Every other failure, through either entry point (the
``-m`` module the installed hook runs, and ``tillerman hook claude``), exits 0 with one
line on stderr and prints no decision; ``hooks install`` refuses a spool the hook could
not use, before the settings are touched."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tillerman.controller.claude import hook as claude_hook
from tillerman.controller.cli.main import main

PAYLOAD = json.dumps({"session_id": "s1", "hook_event_name": "Stop"}).encode()
TILLERMAN = str(Path(sys.executable).with_name("tillerman"))
ENTRY_POINTS = {
    "module": [sys.executable, "-m", "tillerman.controller.claude_hook"],
    "cli": [TILLERMAN, "hook", "claude"],
}


def _run(entry: str, args: list[str], tmp_path: Path, *, stdin: bytes | None = PAYLOAD) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}  # never the real default spool
    command = ENTRY_POINTS[entry] + args
    if stdin is None:  # started with stdin closed, as a careless launcher might
        command = ["sh", "-c", 'exec "$@" <&-', "sh", *command]
    return subprocess.run(command, input=stdin, capture_output=True, cwd=tmp_path, env=env, timeout=60)


def _failed_open(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr
    assert result.stdout == b""  # no decision
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tillerman hook claude: payload not kept ("), lines


CASES = {
    "unknown option": (["--bogus"], PAYLOAD),
    "unknown short option": (["-x"], PAYLOAD),
    "an extra argument": (["--spool", "spool", "extra"], PAYLOAD),
    "missing value": (["--spool"], PAYLOAD),
    "empty spool": (["--spool", ""], PAYLOAD),
    "spool that is a file": (["--spool", "a-file"], PAYLOAD),
    "spool under a file": (["--spool", "a-file/spool"], PAYLOAD),
    "unwritable spool": (["--spool", "/proc/tillerman-spool"], PAYLOAD),
    "invalid UTF-8 stdin": (["--spool", "spool"], b'{"session_id": "\xff\xfe"}'),
    "stdin closed": (["--spool", "spool"], None),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_failure_exits_0_with_one_line(tmp_path: Path, entry: str, case: str) -> None:
    args, stdin = CASES[case]
    (tmp_path / "a-file").write_text("the user's\n")
    _failed_open(_run(entry, args, tmp_path, stdin=stdin))
    assert (tmp_path / "a-file").read_text() == "the user's\n"
    assert not (tmp_path / "s1.jsonl").exists()  # an empty --spool never writes into the working directory
    assert not (tmp_path / "state").exists()  # a wrong option never falls back to the default spool


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_both_spellings_of_the_spool_keep_the_payload(tmp_path: Path, entry: str) -> None:
    for args in (["--spool", "one"], ["--spool=two"]):
        result = _run(entry, args, tmp_path)
        assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert [json.loads((tmp_path / d / "s1.jsonl").read_bytes()) for d in ("one", "two")] == [json.loads(PAYLOAD)] * 2


def test_an_exception_anywhere_exits_0_with_one_escaped_line(tmp_path: Path, monkeypatch, capsys) -> None:
    def broken(*_args, **_kwargs):
        raise RuntimeError("first line\nsecond line \x1b]52;c;Zm9v\x07")

    monkeypatch.setattr(claude_hook, "keep_payload", broken)
    result = CliRunner().invoke(main, ["hook", "claude", "--spool", str(tmp_path)], input=PAYLOAD)
    assert result.exit_code == 0
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "\x1b" not in line and "first line\\nsecond line \\x1b]52" in line


ANSWERING_HOOK = """
import sys
from tillerman.controller.claude import hook as claude_hook
claude_hook.deliver = lambda payload, spool: ({"decision": "block", "reason": "x"}, {"delivered": "in-1"})
sys.exit(claude_hook.main(sys.argv[1:]))
"""


def test_an_answer_claude_code_no_longer_reads_exits_0_with_one_line(tmp_path: Path) -> None:
    """Claude Code closed our stdout before the decision was written: the payload's line
    is kept (it says what was answered), the hook says the answer was lost, exit 0. With
    stdout buffered, as Claude Code starts the hook (PYTHONUNBUFFERED unset), the answer
    left in the buffer is not written again, and fails again, at exit."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads the answer
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    try:
        result = subprocess.run([sys.executable, "-c", ANSWERING_HOOK, "--spool", str(tmp_path)], input=PAYLOAD,
                                stdout=write_end, stderr=subprocess.PIPE, env=buffered, timeout=60)
    finally:
        os.close(write_end)
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.decode().splitlines()
    assert line.startswith("tillerman hook claude: payload kept, its answer not written (")
    kept = json.loads((tmp_path / "s1.jsonl").read_bytes())
    assert kept["tillerman"] == {"delivered": "in-1"}


def test_install_refuses_an_empty_spool_and_leaves_the_settings_alone(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text('{"model": "sonnet"}\n')
    for spool, why in (("", "--spool '' names no folder"), ("a-file/spool", "cannot make the spool folder")):
        (tmp_path / "a-file").write_text("")
        result = CliRunner().invoke(main, ["hooks", "install", "--claude", "--project", str(tmp_path),
                                           "--spool", spool])
        assert result.exit_code == 2 and why in result.output and len(result.output.splitlines()) == 1
        assert settings.read_text() == '{"model": "sonnet"}\n'


def test_install_makes_the_spool_it_tells_you_to_watch(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    result = CliRunner().invoke(main, ["hooks", "install", "--claude", "--project", str(tmp_path)])
    assert result.exit_code == 0, result.output
    spool = tmp_path / "state" / "tillerman" / "claude-hooks"
    assert f"tillerman run --watch {spool}" in result.output
    assert spool.is_dir() and spool.stat().st_mode & 0o777 == 0o700
