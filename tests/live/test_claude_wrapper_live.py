"""``tillerman claude`` between a harness and the real Claude Code CLI 2.1.332, beside a
running daemon (files only, no app-server): the daemon decides, the wrapper carries out.

The harness is `fixtures.claude_cli.ClaudeSession`, spawning the wrapper in place of the
CLI; the wrapper runs the real CLI (``$TILLERMAN_CLAUDE_BIN``) against the scripted model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.anthropic_model import AnthropicModel
from fixtures.claude_cli import ClaudeSession, is_result, is_tool_use
from tests.live.daemon_support import OWNER, OWNER_GRANT
from tillerman.controller.claude_relay import message_uuid
from tillerman.controller.intent_requests import propose
from tillerman.ledger import projections
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import IntentView
from tillerman.ledger.sqlite import SQLiteRecorder

pytestmark = pytest.mark.live

TILLERMAN = [sys.executable, "-m", "tillerman"]


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def daemon(tmp_path: Path, ledger: Path) -> Iterator[subprocess.Popen]:
    """``tillerman run`` on the ledger, following no app-server: it only decides."""
    config, watched = tmp_path / "config.toml", tmp_path / "watched"
    config.write_text(OWNER_GRANT)
    watched.mkdir()
    process = subprocess.Popen([*TILLERMAN, "run", "--no-codex", "--watch", str(watched), "--ledger", str(ledger),
                                "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield process
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)


def wrapped(tmp_path: Path, ledger: Path, claude_cli: Path) -> tuple[Path, dict[str, str]]:
    """A stand-in for the CLI that runs it under ``tillerman claude``, and its environment."""
    script = tmp_path / "claude-under-tillerman"
    script.write_text(f'#!/bin/sh\nexec {" ".join(TILLERMAN)} claude --ledger {ledger} -- "$@" 2>>{tmp_path / "wrapper.log"}\n')
    script.chmod(0o755)
    return script, {"TILLERMAN_CLAUDE_BIN": str(claude_cli), "PYTHONPATH": os.pathsep.join(sys.path)}


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def view(ledger: Path, intent_id: str) -> IntentView:
    with SQLiteRecorder(ledger) as recorder:
        return projections.load(recorder).intents[intent_id]


def steerable_turn(ledger: Path, thread_id: str, turn_id: str) -> bool:
    with SQLiteRecorder(ledger) as recorder:
        snapshot = projections.load(recorder).snapshot(thread_id)
    return snapshot.steerable and snapshot.active_turn_id == turn_id


def propose_intent(ledger: Path, **request: Any) -> str:
    with SQLiteRecorder(ledger) as recorder:
        return propose(recorder, owner=OWNER, **request).id


def settled(ledger: Path, intent_id: str) -> IntentView | None:
    found = view(ledger, intent_id)
    return found if found.state not in (State.PROPOSED, State.DISPATCH_UNKNOWN, State.QUEUED) else None


def moves(found: IntentView) -> list[tuple[str, str, str]]:
    return [(item.kind, str(item.state), item.reason) for item in found.history if item.kind != "decision"]


def test_a_steer_is_folded_into_its_turn_and_acknowledged_on_the_cli_s_evidence(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon) -> None:
    script, env = wrapped(tmp_path, ledger, claude_cli)
    with ClaudeSession(script, tmp_path, anthropic_model.base_url, env=env) as harness:
        turn = harness.user("RUN: sleep 3")
        harness.wait_for(is_tool_use)
        session = harness.session_id
        wait_until(lambda: steerable_turn(ledger, session, turn), "the wrapper's record of the running turn")
        intent_id = propose_intent(ledger, thread_id=session, mode="steer", text="STEER: mention bananas",
                                   expected_turn=turn, now=time.time())
        result = harness.wait_for(is_result, timeout=20)
        done = wait_until(lambda: settled(ledger, intent_id), "the steer to settle")
        assert harness.close() == 0
    assert "STEER: mention bananas" in result["result"]  # folded into this turn, at its tool round
    assert result["user_message_uuids"] == [turn, message_uuid(f"tillerman-{intent_id}")]
    assert len(harness.results()) == 1  # one turn: not a turn of its own
    assert done.state == State.ACKNOWLEDGED
    assert moves(done)[-3:] == [("transition", "dispatch_unknown", "dispatching"),
                                ("transition", "queued", "accepted"), ("transition", "acknowledged", "echo")]
    assert done.history[-1].evidence["turn_id"] == turn
    # The harness saw none of the lifecycle of tillerman's message.
    ours = message_uuid(f"tillerman-{intent_id}")
    assert not [line for line in harness.lines if line.get("command_uuid") == ours]
    decided = next(item.at for item in done.history if item.kind == "decision")
    claimed = next(item.at for item in done.history if item.state == "dispatch_unknown")
    print(f"pickup: {1000 * (claimed - decided):.0f} ms from the daemon's decision to the wrapper's claim")
    assert json.dumps(result)  # the result line reached the harness whole
