"""Hook logs people already have (fixtures/hook-logs, shapes of the common hook-logging
scripts): a JSON-lines log wrapping each payload with the hook's name and a time is read
on its own clock; the per-hook-type JSON arrays are told apart and said what they are,
by replay and by the watcher, never read as nothing."""

from __future__ import annotations

import json
import logging
import shutil
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.monitor.support import events, kinds, parse
from tests.monitor.tailer_support import drive, facts, quarantines
from tillerman.controller.cli.main import main
from tillerman.ledger import events as ev
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.claude_hook_log import hook_name
from tillerman.monitor.formats import detect_format, layout_note
from tillerman.monitor.tailer import UNKNOWN_FORMAT, Tailer

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "hook-logs"
SESSION = "3f0c9a52-6b1e-4d7a-9c2f-8e4b1d6a0c37"
TURNS = [("a1c0e7d2-4f3b-4e8a-9b61-2d5c7f0e9a14", "completed"), ("b7e2f4a9-1c6d-4b3e-8f20-6a9d3c5e1b72", "interrupted"),
         ("c4d8a1f6-9e2b-4c7d-a350-1f6b8e2d4c93", "completed")]


def replay(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["replay", *map(str, args)])
    return result.exit_code, result.output


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


# -- the JSON-lines log: read, on the times it holds -------------------------------------

def test_a_jsonl_hook_log_replays_its_turns_and_tool_calls_at_their_logged_times():
    """Its lines were "cannot tell its format" (exit 2, nothing read)."""
    code, out = replay("--json", LOGS / "hooks.jsonl")
    assert code == 0, out
    (summary,) = json.loads(out)["files"]
    assert (summary["format"], summary["records"], summary["quarantined"], summary["threads"], summary["turns"],
            summary["interrupted_turns"], summary["unclosed_turns"]) == ("claude-hook-log", 12, 0, 1, 3, 1, 0)
    parsed = _parsed(LOGS / "hooks.jsonl")
    ended = [(p.event.turn_id, p.event.status) for p in parsed if isinstance(p.event, ev.TurnCompleted)]
    assert ended == TURNS
    tools = [(p.event.item_id, p.event.status) for p in parsed if isinstance(p.event, ev.ItemCompleted)]
    assert tools == [("toolu_01Hk7", "completed"), ("toolu_01Mq2", "interrupted"), ("toolu_01Rz9", "completed")]
    first_tool = next(p for p in parsed if isinstance(p.event, ev.ItemStarted))
    assert first_tool.at == epoch("2026-12-01T09:00:03.410+00:00")  # the line's ts is the record's time


def _parsed(path: Path):
    return parse("claude-hook-log", path.read_bytes())[0]


@pytest.mark.parametrize("line", [
    {"ts": "2026-12-01T09:00:03Z", "event": "PreToolUse", "session_id": "S", "tool_name": "Bash",
     "tool_input": {"command": "ls"}, "tool_use_id": "t1"},
    {"timestamp": "2026-12-01T09:00:03Z", "event": "pre_tool_use",
     "payload": {"session_id": "S", "tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_use_id": "t1"}},
    {"ts": 1796115603, "payload": {"session_id": "S", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                                   "tool_input": {"command": "ls"}, "tool_use_id": "t1"}},
    {"ts": 1796115603.0, "session_id": "S", "hook_event_name": "PreToolUse", "tool_name": "Bash",
     "tool_input": {"command": "ls"}, "tool_use_id": "t1"},
], ids=["fields-beside-event-and-ts", "payload-under-payload-snake-case-name", "epoch-ts-payload-with-its-name",
        "payload-as-it-came-with-a-ts"])
def test_each_wrapping_the_logging_scripts_use_is_read_as_the_payload_it_holds(line):
    data = json.dumps(line).encode() + b"\n"
    assert detect_format(data, "hooks.jsonl") == "claude-hook-log"
    parsed, _ = parse("claude-hook-log", data)
    assert kinds([p.event for p in parsed]) == ["thread_started", "item_started"]
    assert parsed[1].event.item_id == "t1" and parsed[1].at == epoch("2026-12-01T09:00:03+00:00")


def test_a_hook_log_line_with_a_time_of_the_wrong_type_is_quarantined_and_reading_goes_on():
    data = (json.dumps({"ts": ["x"], "event": "Stop", "session_id": "S"}) + "\n"
            + json.dumps({"ts": 10 ** 30, "event": "SessionStart", "session_id": "S"}) + "\n").encode()
    found = events("claude-hook-log", data)
    assert kinds(found) == ["quarantined", "thread_started"]  # a time beyond any date is no time, not an error


def test_hook_names_are_claude_code_s_whatever_spelling_the_script_used():
    assert [hook_name(n) for n in ("pre_tool_use", "user_prompt_submit", "stop", "PostToolUse", "session_end")] == [
        "PreToolUse", "UserPromptSubmit", "Stop", "PostToolUse", "SessionEnd"]


def test_a_logged_session_takes_no_delivery_through_hooks():
    """Only tillerman's own spool (format claude-hooks) is a hook delivery channel."""
    started = next(e for e in events("claude-hook-log", (LOGS / "hooks.jsonl").read_bytes())
                   if isinstance(e, ev.ThreadStarted))
    assert started.thread_id == SESSION and started.source_format == "claude-hook-log"


# -- the per-hook-type JSON arrays: said what they are, never read as nothing -------------

ARRAYS = LOGS / "arrays" / "logs"


def test_a_folder_of_per_hook_type_arrays_is_refused_in_one_line_with_why():
    """It replayed with exit 0, every line quarantined, no events."""
    code, out = replay(ARRAYS)
    assert code == 2
    assert out.count("\n") == 1 and "a JSON array of Claude Code hook payloads" in out
    assert "carry no times" in out and "one hook's history" in out and "Traceback" not in out
    code, out = replay(ARRAYS / "stop.json")
    assert code == 2 and out.startswith(f"Error: {ARRAYS / 'stop.json'}: a JSON array of Claude Code hook payloads")


def test_a_json_array_that_holds_no_hook_payloads_is_not_read_as_lines_either():
    head = b'[\n  {\n    "sessionId": "s",\n    "type": "user"\n  }\n]'
    assert detect_format(head, "chat.json") is None  # was claude-transcript, every line quarantined
    assert layout_note(head) == "a JSON array, not JSON lines: tillerman reads one JSON object a line"
    assert layout_note(b'{"type": "user"}\n') is None


def test_the_watcher_records_an_array_log_once_says_what_it_is_and_never_follows_it(tmp_path, caplog):
    """It was followed as hook payloads, every line quarantined. Its opening tells what it
    is, though a small one ends without a newline (a JSON-lines file that does is waited on
    until its line is whole)."""
    folder = tmp_path / "logs"
    shutil.copytree(ARRAYS, folder)
    tailer = Tailer()
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as ledger, caplog.at_level(logging.WARNING, "tillerman"):
        drive(tailer, ledger, *sorted(folder.iterdir()))
        drive(tailer, ledger, *sorted(folder.iterdir()))
        assert [q.reason for q in quarantines(ledger)] == [UNKNOWN_FORMAT] * 5
        assert [e for e in facts(ledger) if not isinstance(ev.decode(e[1]), ev.Quarantined)] == []
    noted = [r.getMessage() for r in caplog.records if "JSON array of Claude Code hook payloads" in r.getMessage()]
    assert len(noted) == 5 and all(m.endswith(": not followed") for m in noted)
