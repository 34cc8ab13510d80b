"""Stream-json stdout the real Claude Code CLI wrote for other projects
(``fixtures/sessions/public/claude-stream-json``, sources in ``SOURCES.md``: 2.1.7,
2.1.29 and 2.1.286), replayed with ``--format auto`` and counted again here straight
from the raw JSON: a turn per ``result`` line, interrupted when its ``terminal_reason``
says ``aborted_*`` or, from CLIs that wrote no ``terminal_reason``, when the turn holds
the CLI's interrupt marker; a tool call per ``tool_use`` block."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.monitor.support import SESSIONS, jsonl, parse
from tillerman.controller.cli.main import main
from tillerman.ledger.events import ItemCompleted, ItemStarted, TurnCompleted
from tillerman.monitor.claude_transcript import INTERRUPT_MARKER

PUBLIC = SESSIONS / "public" / "claude-stream-json"
RECORDINGS = sorted(p.relative_to(PUBLIC).as_posix() for p in PUBLIC.rglob("*.jsonl"))


def raw_counts(path: Path) -> dict[str, int]:
    turns = interrupted = tools = 0
    marked = False
    for line in path.read_text().splitlines():
        record = json.loads(line)
        content = (record.get("message") or {}).get("content")
        blocks = content if isinstance(content, list) else []
        if record["type"] == "user":
            marked |= any(b.get("type") == "text" and b["text"].startswith(INTERRUPT_MARKER) for b in blocks)
        elif record["type"] == "assistant":
            tools += sum(1 for b in blocks if b.get("type") == "tool_use")
        elif record["type"] == "result":
            reason = record.get("terminal_reason")
            turns += 1
            interrupted += reason.startswith("aborted") if reason else marked
            marked = False
    return {"turns": turns, "interrupted_turns": interrupted, "tools": tools}


@pytest.fixture(scope="module")
def replayed() -> dict[str, dict]:
    result = CliRunner().invoke(main, ["replay", "--json", "--format", "auto", str(PUBLIC)])
    assert result.exit_code == 0, result.output
    return {Path(f["path"]).relative_to(PUBLIC).as_posix(): f for f in json.loads(result.output)["files"]}


def test_there_are_public_recordings_of_several_cli_versions():
    versions = {json.loads(line).get("claude_code_version") for name in RECORDINGS
                for line in (PUBLIC / name).read_text().splitlines()} - {None}
    assert versions == {"2.1.7", "2.1.29", "2.1.286"}
    assert len(RECORDINGS) == 6


@pytest.mark.parametrize("name", RECORDINGS)
def test_replay_reads_each_as_stream_json_with_the_raw_counts(name, replayed):
    path = PUBLIC / name
    row = replayed[name]
    assert row["format"] == "claude-stream-json"
    assert (row["quarantined"], row["unknown_types"], row["unclosed_turns"]) == (0, {}, 0)
    assert row["records"] == len(path.read_text().splitlines())
    parsed, _ = parse("claude-stream-json", path.read_bytes(), source=name)
    events = [p.event for p in parsed]
    started = [e.item_id for e in events if isinstance(e, ItemStarted)]
    assert [e.item_id for e in events if isinstance(e, ItemCompleted)] == started  # every call ends
    assert {"turns": row["turns"], "interrupted_turns": row["interrupted_turns"], "tools": len(started)} == \
        raw_counts(path)


def test_an_interrupt_from_a_cli_without_terminal_reason_is_an_interrupted_turn():
    # 2.1.29: the marker line, then a result that is neither aborted nor is_error.
    events = [p.event for p in parse("claude-stream-json", (PUBLIC / "open-claude-agent-sdk/interrupt.jsonl")
                                     .read_bytes())[0]]
    assert [e.status for e in events if isinstance(e, TurnCompleted)] == ["interrupted"]


def test_terminal_reason_outranks_the_marker_and_the_marker_ends_with_its_turn():
    marker = '{"type":"user","session_id":"s","message":{"role":"user","content":[{"type":"text",' \
             f'"text":"{INTERRUPT_MARKER}]"}}]}}}}'
    data = jsonl('{"type":"system","subtype":"init","session_id":"s","uuid":"t1"}', marker,
                 '{"type":"result","subtype":"success","session_id":"s","terminal_reason":"completed"}',
                 '{"type":"system","subtype":"init","session_id":"s","uuid":"t2"}',
                 '{"type":"result","subtype":"success","session_id":"s"}')
    events = [p.event for p in parse("claude-stream-json", data)[0]]
    assert [e.status for e in events if isinstance(e, TurnCompleted)] == ["completed", "completed"]
