"""One Claude Code session seen through its hooks and ``tillerman claude`` at once, with
the real CLI 2.1.332: tillerman's hooks installed in the scratch HOME, the session run
through the wrapper, and ``tillerman run`` following the hook spool only (not
``~/.claude/projects``). Stream-json names a turn by its first message's uuid, the hooks
by ``prompt_id``, and stdout carries no ``prompt_id``: the wrapper ties the two itself,
from the transcript's prompt line (``TurnAlias``). The scripted model's request log is
the ground truth for what reached the model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.anthropic_model import AnthropicModel
from fixtures.claude_cli import ClaudeSession
from tests.live.daemon_support import OWNER_GRANT
from tests.live.test_claude_wrapper_live import (
    TILLERMAN,
    held,
    moves,
    release,
    propose_intent,
    running_tool,
    steered,
    thread,
    view,
    wait_until,
    wrapped,
)
from tillerman.controller.claude.hook_outbox import outbox_path
from tillerman.controller.claude.relay import message_uuid
from tillerman.controller.cli.main import main
from tillerman.controller.report.fold import Facts
from tillerman.ledger import events as ev
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import CLAUDE_WRAPPER_SOURCE
from tillerman.ledger.sqlite import SQLiteRecorder

pytestmark = pytest.mark.live


@pytest.fixture
def spool_daemon(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Hooks installed in the HOME ``ClaudeSession`` gives the CLI, and the daemon
    following their spool alone: (spool, ledger)."""
    home, spool, ledger, config = tmp_path / "home", tmp_path / "spool", tmp_path / "ledger.db", tmp_path / "c.toml"
    installed = CliRunner(env={"HOME": str(home)}).invoke(
        main, ["hooks", "install", "--claude", "--user", "--spool", str(spool)])
    assert installed.exit_code == 0, installed.output
    config.write_text(OWNER_GRANT)
    SQLiteRecorder(ledger).close()
    process = subprocess.Popen([*TILLERMAN, "run", "--no-codex", "--watch", str(spool), "--ledger", str(ledger),
                                "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    yield spool, ledger
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)


def ledger_events(ledger: Path, session: str) -> list[tuple[int, ev.Envelope]]:
    with SQLiteRecorder(ledger) as recorder:
        return [(e.seq, e.envelope) for e in recorder.read() if e.envelope.event.thread_id == session]


def hook_stops_read(ledger: Path, session: str, spool: Path) -> int:
    """How many turn ends the daemon has read from the hook spool so far."""
    return sum(1 for _, e in ledger_events(ledger, session)
               if e.source.endswith(str(spool / f"{session}.jsonl")) and isinstance(e.event, ev.TurnCompleted))


def how_each_turn_began(ledger: Path, session: str) -> list[str]:
    """Per turn, the order in which the ledger got the hooks' start, the wrapper's start
    and the wrapper's alias (with the alias's lag after the wrapper's start)."""
    entries = ledger_events(ledger, session)
    lines = []
    for seq, envelope in entries:
        event = envelope.event
        if not (isinstance(event, ev.TurnStarted) and envelope.source.startswith(CLAUDE_WRAPPER_SOURCE)):
            continue
        alias_seq, alias = next((s, e) for s, e in entries
                                if isinstance(e.event, ev.TurnAlias) and e.event.turn_id == event.turn_id)
        hook = next(s for s, e in entries
                    if isinstance(e.event, ev.TurnStarted) and e.event.turn_id == alias.event.alias)
        order = sorted([(hook, "hooks' start"), (seq, "wrapper's start"), (alias_seq, "alias")])
        lag = 1000 * ((alias.at or 0) - (envelope.observed_at or envelope.at or 0))
        lines.append(" < ".join(name for _, name in order) + f" (alias {lag:.0f} ms after the wrapper's start)")
    return lines


def test_hooks_and_the_wrapper_on_one_session_are_one_set_of_turns_and_deliver_once(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, spool_daemon) -> None:
    """A steer (``--expected-turn active``, while the turn's tool runs) and a queued
    message, each delivered once and acknowledged; each turn one turn in the ledger.

    Both are delivered by the wrapper, not by the hooks: the wrapper's records make the
    session steerable, and the daemon writes a hook outbox only for a session it can
    reach through its hooks alone (``hook_delivery.is_hook_thread``), so the hooks find
    nothing to claim. Were the two to race for one intent anyway, the ledger takes the
    one durable ``dispatch_unknown`` record once (tests/controller/test_claude_wrapper.py).

    The timings: the CLI runs the UserPromptSubmit hook before it prints the turn's
    ``system/init``, and writes the transcript's prompt line after it, so the wrapper's
    alias reaches the ledger after both starts (printed below; the fold's side of that
    window: tests/monitor/test_claude_sources_together.py, late links)."""
    spool, ledger = spool_daemon
    script, env = wrapped(tmp_path, ledger, claude_cli)
    with ClaudeSession(script, tmp_path, anthropic_model.base_url, env=env) as harness:
        gate = tmp_path / "ws" / "gate"
        session, turn = running_tool(harness, ledger, held(gate))
        steer = propose_intent(ledger, thread_id=session, mode="steer", text="STEER: mention bananas",
                               expected_turn="active", now=time.time())
        queued = propose_intent(ledger, thread_id=session, mode="queue", text="LATER: say plums",
                                now=time.time())
        wait_until(lambda: view(ledger, steer).state == State.QUEUED and view(ledger, queued).state == State.QUEUED,
                   "the CLI to accept the steer and queue the message")
        release(gate)
        wait_until(lambda: len(harness.results()) == 2, "the turn and the queued message's turn", timeout=30)
        steered_view = wait_until(lambda: view(ledger, steer).state == State.ACKNOWLEDGED and view(ledger, steer),
                                  "the steer to be acknowledged")
        queued_view = wait_until(lambda: view(ledger, queued).state == State.ACKNOWLEDGED and view(ledger, queued),
                                 "the queued message to be acknowledged")
        assert harness.close() == 0
    wait_until(lambda: hook_stops_read(ledger, session, spool) == 2, "the daemon to read both Stop hooks")
    first, second = harness.results()
    assert first["user_message_uuids"] == [turn, message_uuid(f"tillerman-{steer}")]  # folded into the turn
    assert second["user_message_uuids"] == [message_uuid(f"tillerman-{queued}")]  # its own turn
    assert steered(anthropic_model, "STEER: mention bananas") == 1
    assert steered(anthropic_model, "LATER: say plums") == 1
    assert [m[2] for m in moves(steered_view) if m[0] == "transition"][-3:] == ["dispatching", "accepted", "echo"]
    assert [m[2] for m in moves(queued_view) if m[0] == "transition"][-3:] == [
        "dispatching", "accepted", "queue_turn_started"]
    # The wrapper delivered both; the hooks were offered nothing and answered nothing.
    assert not outbox_path(spool, session).exists()
    assert not [line for line in (spool / f"{session}.jsonl").read_text().splitlines()
                if "tillerman" in json.loads(line)]
    # Two turns, each once, under every id; one alias each.
    session_thread = thread(ledger, session)
    assert list(session_thread.turn_states.values()) == ["completed", "completed"], session_thread.turn_states
    aliases = [e.event for _, e in ledger_events(ledger, session) if isinstance(e.event, ev.TurnAlias)]
    assert sorted(a.turn_id for a in aliases) == sorted([turn, message_uuid(f"tillerman-{queued}")])
    assert all(session_thread.canonical_turn(a.alias) == session_thread.canonical_turn(a.turn_id) for a in aliases)
    for line in how_each_turn_began(ledger, session):
        print(line)
    with SQLiteRecorder(ledger) as recorder:
        facts = Facts().fold(recorder.read())
    assert [t.status for t in facts.turns.values() if t.thread_id == session] == ["completed", "completed"]
