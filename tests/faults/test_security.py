"""Files tillerman creates are its owner's alone, and it keeps digests, not text,
unless payload retention is turned on (ledger and --trace alike)."""

import json
import os
import stat
from pathlib import Path

from click.testing import CliRunner

from controller.cli import main
from ledger.lock import LedgerLock
from ledger.sqlite import SQLiteRecorder
from monitor.appserver_client import JsonlTrace
from monitor.redact import redact_message

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
    assert {p.name for p in files} >= {"ledger.sqlite3", "ledger.sqlite3.head", "ledger.sqlite3.lock"}
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
