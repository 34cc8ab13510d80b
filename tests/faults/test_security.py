"""Files tillerman creates are its owner's alone, and it keeps digests, not text,
unless payload retention is turned on (ledger and --trace alike)."""

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.ledger.lock import LedgerLock
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.appserver_client import JsonlTrace, TraceFileError
from tillerman.monitor.jsonrpc import RpcSession
from tillerman.monitor.redact import redact_message

SESSION = Path(__file__).resolve().parents[2] / "fixtures" / "sessions" / "replay"
PROMPT = "Fix the failing API tests."  # the user prompt inside that recording
TOOL_ARGS = "pytest tests/api -x"
TOOL_OUTPUT = "No module named"


def _stored_bytes(ledger: Path) -> bytes:
    return b"".join(p.read_bytes() for p in ledger.parent.glob(ledger.name + "*"))


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_ledger_files_are_owner_only(tmp_path):
    ledger = tmp_path / "state" / "ledger.sqlite3"
    result = CliRunner().invoke(main, ["replay", "--ledger", str(ledger), str(SESSION)])
    assert result.exit_code == 0, result.output
    with LedgerLock(ledger):
        pass
    files = list(ledger.parent.iterdir())
    assert {p.name for p in files} >= {"ledger.sqlite3", "ledger.sqlite3.head", "ledger.sqlite3.head.lock",
                                      "ledger.sqlite3.lock"}
    for path in files:
        assert _mode(path) & 0o077 == 0, (path, oct(_mode(path)))
    assert _mode(ledger.parent) == 0o700


def test_the_ledger_keeps_digests_not_text(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    CliRunner().invoke(main, ["replay", "--ledger", str(ledger), str(SESSION)])
    stored = _stored_bytes(ledger)
    for secret in (PROMPT, TOOL_ARGS, TOOL_OUTPUT):
        assert secret.encode() not in stored, secret
    assert b"sha256:" in stored


def test_retain_payloads_keeps_the_text(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    CliRunner().invoke(main, ["replay", "--retain-payloads", "--ledger", str(ledger), str(SESSION)])
    with SQLiteRecorder(ledger) as rec:
        texts = [getattr(e.envelope.event, "text", None) for e in rec.read()]
    assert PROMPT in texts


def test_traces_are_owner_only_and_redacted(tmp_path):
    path = tmp_path / "trace.jsonl"
    trace = JsonlTrace(path, redact=redact_message)
    trace("in", {"method": "item/completed", "params": {"threadId": "t", "turnId": "u", "item": {
        "type": "userMessage", "id": "i", "clientId": "c", "content": [{"type": "text", "text": PROMPT}]}}})
    trace("out", {"id": "tl-1", "method": "turn/steer", "params": {"threadId": "t", "expectedTurnId": "u",
                                                                  "input": [{"type": "text", "text": PROMPT}]}})
    trace("in", {"method": "item/started", "params": {"item": {"type": "commandExecution", "id": "x",
                                                               "command": TOOL_ARGS}}})
    trace.close()
    assert _mode(path) == 0o600
    written = path.read_text()
    assert PROMPT not in written and TOOL_ARGS not in written
    first = json.loads(written.splitlines()[0])["msg"]["params"]
    assert first["threadId"] == "t" and first["item"]["clientId"] == "c"  # ids stay: they are evidence
    assert first["item"]["content"][0]["text"].startswith("[redacted sha256:")


def test_trace_without_redaction_keeps_text(tmp_path):
    path = tmp_path / "trace.jsonl"
    trace = JsonlTrace(path)
    trace("in", {"method": "x", "params": {"text": PROMPT}})
    trace.close()
    assert PROMPT in path.read_text()


PASSWORD = "s3cret-Passw0rd"
LEAKY = [  # what the app-server says about file changes, tools and searches
    {"method": "thread/started", "params": {"thread": {
        "id": "t", "cwd": "/home/ann/clients/acme", "path": "/home/ann/.codex/sessions/r.jsonl",
        "preview": "fix acme login", "cliVersion": "0.163.0", "status": {"type": "idle", "activeFlags": []}}}},
    {"method": "item/completed", "params": {"threadId": "t", "turnId": "u", "item": {
        "type": "fileChange", "id": "f1", "status": "completed", "changes": [{
            "path": "/home/ann/clients/acme/settings.py", "kind": {"type": "update", "move_path": "/home/ann/x.py"},
            "diff": f"-PASSWORD = ''\n+PASSWORD = '{PASSWORD}'\n"}]}}},
    {"method": "turn/diff/updated", "params": {"threadId": "t", "turnId": "u", "diff": f"+{PASSWORD}"}},
    {"method": "item/fileChange/outputDelta", "params": {"threadId": "t", "itemId": "f1", "delta": PASSWORD}},
    {"method": "item/completed", "params": {"threadId": "t", "turnId": "u", "item": {
        "type": "mcpToolCall", "id": "m1", "server": "crm", "tool": "lookup", "status": "completed",
        "arguments": {"customer": "Jane Roe", "pin": 4321}, "durationMs": 12,
        "result": {"content": [{"type": "text", "text": "Jane Roe, 12 Elm St"}], "structuredContent": {"a": 1}}}}},
    {"method": "item/completed", "params": {"threadId": "t", "turnId": "u", "item": {
        "type": "webSearch", "id": "w1", "query": "jane roe elm st", "action": {"type": "search",
                                                                             "query": "jane roe elm st"}}}},
    {"method": "item/started", "params": {"threadId": "t", "turnId": "u", "item": {
        "type": "commandExecution", "id": "c1", "command": f"login --password {PASSWORD}",
        "cwd": "/home/ann/clients/acme", "commandActions": [{"type": "unknown", "command": "login"}]}}},
]
CLEAR = ["/home/ann", "acme", "Jane Roe", "jane roe", "Elm St", "4321", PASSWORD, "lookup", "crm"]


def test_the_redacted_trace_keeps_no_text_paths_arguments_or_queries(tmp_path):
    path = tmp_path / "trace.jsonl"
    trace = JsonlTrace(path, redact=redact_message)
    session = RpcSession()
    for message in LEAKY:
        trace("in", message)
    trace("in", session.receive(f"not json: --password {PASSWORD}"))  # a frame that did not parse
    trace("in", session.receive(f'["a list", "{PASSWORD}"]'))  # JSON, but not a message
    trace.close()
    written = path.read_text()
    for secret in CLEAR:
        assert secret not in written, secret
    records = [json.loads(line) for line in written.splitlines()]
    assert records[-2]["raw"].startswith("[redacted sha256:")
    assert records[-2]["raw"].endswith(f" {len(f'not json: --password {PASSWORD}')} bytes]")
    change = records[1]["msg"]["params"]["item"]
    assert (change["type"], change["id"], change["status"], change["changes"][0]["kind"]["type"]) == (
        "fileChange", "f1", "completed", "update")  # the structure stays
    assert records[0]["msg"]["params"]["thread"]["cliVersion"] == "0.163.0"
    assert records[4]["msg"]["params"]["item"]["durationMs"] == 12


def test_an_existing_trace_file_is_made_owner_only(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"ts": 1, "dir": "in", "msg": {}}\n')
    path.chmod(0o644)
    JsonlTrace(path, redact=redact_message).close()
    assert _mode(path) == 0o600 and path.read_text().count("\n") == 1  # appended to, never truncated


def test_a_special_trace_path_is_refused_in_one_line_and_a_symlink_to_a_file_written_through(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("")
    link = tmp_path / "trace.jsonl"
    link.symlink_to(target)
    JsonlTrace(link)("in", {"x": 1})  # the link leads to a file that may be written: written there
    assert link.is_symlink() and target.read_text().count("\n") == 1
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(TraceFileError, match="FIFO"):
        JsonlTrace(fifo)  # refused at once: nothing reads it, and opening must not block
    ledger = tmp_path / "l.sqlite3"
    SQLiteRecorder(ledger).close()
    to_ledger = tmp_path / "to-ledger.jsonl"
    to_ledger.symlink_to(ledger)
    for path, words in ((fifo, "FIFO"), (to_ledger, "SQLite database")):
        result = CliRunner().invoke(main, ["run", "--no-codex", "--watch", str(tmp_path), "--ledger",
                                           str(ledger), "--trace", str(path)])
        assert result.exit_code == 2 and words in result.output, result.output
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert target.read_text().count("\n") == 1
