"""Outside text on a terminal: every command that prints what the agent's side recorded
(thread and turn ids, file names, commands, messages, reasons, rule ids) shows its
control characters as codes. A ledger seeded with an OSC 52 clipboard write, a screen
clear, a title change, a C1 CSI, a bidi override and a thread id with a newline and a
forged line: no command's output holds a raw control character, and the forged line
never stands as a line of its own. ``--json`` keeps the text exact."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from fixtures.rule_texts import grant, reviewer
from tests.hostile import FORGED, TERMINAL, hostile_session
from tillerman.controller.cli.log_format import log_handler
from tillerman.controller.cli.main import main
from tillerman.controller.core.printable import printable
from tillerman.controller.daemon.link import HEARTBEAT
from tillerman.ledger.sqlite import SQLiteRecorder

ROOT = Path(__file__).resolve().parents[2]
ROLLOUT = ROOT / "fixtures" / "sessions" / "replay" / \
    "rollout-2026-10-19T22-00-00-0199b000-0000-7000-8000-00000000bb01.jsonl"
#: What a terminal would obey: C0 but the newline between lines, DEL, C1, bidi controls.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
CLIPBOARD = printable(TERMINAL["clipboard"])  # as the escaped text reads


def test_printable_shows_each_control_character_as_its_code():
    assert printable("a\x1b]52;c;eA==\x07b") == "a\\x1b]52;c;eA==\\x07b"
    assert printable("T1\nFORGED\r\t") == "T1\\nFORGED\\r\\t"
    assert printable("\x00\x7f\x9b2J\x85") == "\\x00\\x7f\\x9b2J\\x85"
    assert printable("\u202eexe.doc\u202c\u2066\u2069\u200f\u061c") == "\\u202eexe.doc\\u202c\\u2066\\u2069\\u200f\\u061c"
    ordinary = "naïve ✓ 日本 C:\\temp rm\\s+-rf 'quoted' \u00a0"
    assert printable(ordinary) == ordinary
    assert printable(42) == "42"


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    """A ledger whose every recorded field carries a hostile string, with a running
    daemon's heartbeat that names hostile watched folders and server strings."""
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("TILLERMAN_LEDGER", str(path))
    hostile = "".join(TERMINAL.values())
    beat = {"pid": 1, "since": 1.7e9, "heartbeat": 1.7e9, "watch": [f"/home/{hostile}"],
            "codex": {"connected": True, "url": f"unix:///{hostile}", "since": 1.7e9, "client_name": hostile,
                      "server_version": hostile, "initialized_first": True, "originator": hostile, "error": hostile}}
    with SQLiteRecorder(path) as rec:
        rec.append(hostile_session(TERMINAL))
        rec.save_snapshot(HEARTBEAT, rec.max_seq(), msgspec.json.encode(beat))
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT)  # the daemon holds it while it runs
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield path
    os.close(lock)


def intent_ids(kind: str) -> list[str]:
    return [f"in-{kind}-{s}" for s in TERMINAL.values()]


def reviewer_config(tmp_path: Path) -> Path:
    answer = {"disposition": "ready_for_existing_gate", "reason": "".join(TERMINAL.values()), "confidence": 0.6,
              "required_corrections": [{"correction": TERMINAL["title"], "proof": TERMINAL["forged"]}]}
    script = tmp_path / "answer.py"
    script.write_text(f"import sys\nsys.stdin.read()\nsys.stdout.write({json.dumps(answer)!r})\n")
    config = tmp_path / "config.toml"
    config.write_text(grant("reviewer:script", ["steer"]) + reviewer("script", [sys.executable, str(script)]))
    return config


COMMANDS = ("status", "intents", "intent show", "intent show, unknown id", "overdue", "report", "timeline", "replay",
            "rules proposals", "rules show", "review try")


def patterns_config(tmp_path: Path) -> Path:
    """A config file whose command pattern holds a title change (TOML's \\u escapes)."""
    config = tmp_path / "patterns.toml"
    config.write_text('[patterns]\ncritical = ["\\u001b]0;owned\\u0007\\u000aFORGED"]\nexternal = []\n')
    return config


def commands(tmp_path: Path) -> dict[str, list[list[str]]]:
    """Every command that prints recorded data for a person, with the arguments that make
    it print the hostile strings."""
    session = tmp_path / f"rollout{TERMINAL['clipboard']}{TERMINAL['forged']}{TERMINAL['bidi']}.jsonl"
    shutil.copy(ROLLOUT, session)
    return {
        "status": [["status"]],
        "intents": [["intents"]],
        "intent show": [["intent", "show", i] for i in intent_ids("rejected") + intent_ids("waiting")],
        "intent show, unknown id": [["intent", "show", f"in-{TERMINAL['clipboard']}{TERMINAL['forged']}"]],
        "overdue": [["overdue"]],
        "report": [["report"]],
        "timeline": [["timeline", "--html", str(tmp_path / f"page{TERMINAL['title']}{TERMINAL['forged']}.html")]],
        "replay": [["replay", str(session)]],
        "rules proposals": [["rules", "proposals"]],
        "rules show": [["rules", "show", "--config", str(patterns_config(tmp_path))]],
        "review try": [["review", "try", "--reviewer", "script", "--checkpoint", "before_dispatch", "--intent", i,
                        "--config", str(reviewer_config(tmp_path))] for i in intent_ids("waiting")[:1]],
    }


def assert_shown_safely(output: str, what: str) -> None:
    raw = RAW.search(output)
    assert raw is None, f"{what}: raw {raw.group()!r} at {output[max(0, raw.start() - 40):raw.end() + 40]!r}"
    forged = [line for line in output.splitlines() if line.startswith(FORGED)]
    assert not forged, f"{what}: a recorded newline forged the line {forged[0]!r}"


@pytest.mark.parametrize("what", COMMANDS)
def test_every_command_that_prints_recorded_data_shows_control_characters_as_codes(ledger, tmp_path, what):
    for args in commands(tmp_path)[what]:
        result = CliRunner().invoke(main, args, color=True)  # color: nothing stripped, as on a terminal
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert_shown_safely(result.output, what)
        assert any(printable(hostile) in result.output for hostile in TERMINAL.values()), \
            f"{what} printed no hostile string, so it checks nothing: {result.output[-500:]!r}"


def test_json_output_keeps_the_recorded_text_exact(ledger):
    shown = json.loads(CliRunner().invoke(main, ["intent", "show", intent_ids("rejected")[0], "--json"]).stdout)
    assert shown["thread"] == f"thread-{TERMINAL['clipboard']}"


def test_runs_text_log_shows_control_characters_as_codes_and_keeps_a_tracebacks_lines():
    stream = io.StringIO()
    log = logging.getLogger("tillerman.test-printable")
    log.propagate = False
    log.addHandler(log_handler("text", stream))
    try:
        log.warning("thread %s: turn %s ended", f"T{TERMINAL['forged']}", TERMINAL["clipboard"])
        try:
            raise ValueError(f"bad name {TERMINAL['title']}{TERMINAL['c1']}")
        except ValueError:
            log.exception("watching %s failed", TERMINAL["bidi"])
    finally:
        log.handlers.clear()
    text = stream.getvalue()
    assert_shown_safely(text, "run's text log")
    assert f"thread T\\n{FORGED}: turn {CLIPBOARD} ended" in text
    assert "Traceback (most recent call last):" in text.splitlines()  # a traceback still reads as one
    assert "ValueError: bad name \\x1b]0;owned\\x07\\x9b2J" in text


def test_replays_progress_line_shows_a_hostile_file_name_as_codes(capsys):
    from tillerman.controller.cli.replay import _Progress

    _Progress()(f"/sessions/{TERMINAL['title']}{TERMINAL['forged']}.jsonl", 1 << 20, 2 << 20)
    line = capsys.readouterr().err
    assert line.startswith("\r") and RAW.search(line[1:]) is None and "\n" not in line
    assert printable(TERMINAL["title"]) in line
