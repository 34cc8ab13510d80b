"""The daemon's redacted ``--trace`` against the REAL Codex app-server (0.171.0 by default): every
message type a short session produces (thread start, turns, commands, agent messages
and their deltas, a steer, its echo, a failed turn, the daemon's own reads and resumes)
keeps only its structure. Every string left in clear sits under an allow-listed key;
the rest is a digest and a size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.codex_server import AppServer
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import OWNER, OWNER_GRANT, ruleset_from, session, wait_until
from tillerman.controller.core import intent_requests
from tillerman.monitor.redact import is_redacted, kept

pytestmark = [pytest.mark.live, pytest.mark.anyio]

SECRET = "hunter2-passphrase"  # in a command, its output, a prompt and a steer


def clear_strings(node: Any, key: str = "") -> list[tuple[str, str]]:
    """Every (key, string) in a message that is not a redaction stand-in."""
    if isinstance(node, dict):
        return [pair for k, v in node.items() for pair in clear_strings(v, k)]
    if isinstance(node, list):
        return [pair for v in node for pair in clear_strings(v, key)]
    return [(key, node)] if isinstance(node, str) and not is_redacted(node) else []


async def test_the_redacted_trace_keeps_structure_and_no_text(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, "", OWNER_GRANT))
        thread, turn = await s.start_command(workspace, f"RUN: echo {SECRET} && sleep 1")
        intent = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer", owner=OWNER,
                                 text=f"Also note {SECRET}. CREATE: marker.txt {SECRET}")
        await s.wait_state(intent.id, {"acknowledged", "effect_verified", "effect_failed", "expired", "rejected"})
        assert await s.turn_completed(thread, turn) == "completed"
        failed = await s.start_turn(thread, "FAIL")
        await s.turn_completed(thread, failed)
        await wait_until(lambda: any(r["msg"].get("method") == "turn/completed"
                                     and r["msg"]["params"]["turn"]["id"] == failed
                                     for r in _records(s.trace_path) if "msg" in r), "the failed turn in the trace")

    records = _records(s.trace_path)
    seen = {(r["dir"], r["msg"].get("method", "response")) for r in records if isinstance(r.get("msg"), dict)}
    # the message types of a session, so the check below covers them
    assert {("in", m) for m in ("thread/started", "turn/started", "item/started", "item/completed",
                                "turn/completed", "thread/status/changed", "item/agentMessage/delta",
                                "error", "response")} <= seen, sorted(seen)
    assert {("out", m) for m in ("initialize", "turn/steer")} <= seen, sorted(seen)
    for record in records:
        message = record.get("msg", record.get("raw"))
        assert [(k, v) for k, v in clear_strings(message) if not kept(k)] == [], record
    written = s.trace_path.read_text()
    for secret in (SECRET, str(workspace)):
        assert secret not in written
    # ids stay: they are the evidence the trace is kept for
    assert [m["params"]["expectedTurnId"] for m in s.sent("turn/steer")] == [turn]
    assert [m["params"]["clientUserMessageId"] for m in s.sent("turn/steer")] == [intent.client_user_message_id]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
