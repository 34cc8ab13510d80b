"""Delivery through Claude Code's hooks, against the real CLI 2.1.332 run headless in a
scratch HOME with tillerman's hooks installed and ``tillerman run --no-codex --watch
<spool>`` deciding — alone, and with the transcripts as README's command has it
(``--watch ~/.claude/projects --watch <spool>``: one session seen through two sources
that name its turns differently): a queued intent reaches the agent once through the
Stop hook and the agent acts on it; a steer for the next tool denies that tool with its
text; each is recorded acknowledged, never expired. A ledger held by a long write
transaction does not stall the session. The scripted model's request log is the ground
truth for what reached the model."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.anthropic_model import AnthropicModel
from fixtures.claude_cli import ClaudeSession, is_result
from tests.monitor.support import events
from tillerman.controller.claude.hook_outbox import outbox_path, read_outbox
from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests as intents
from tillerman.ledger import projections
from tillerman.ledger.events import UserMessage
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.owner import local_login

pytestmark = pytest.mark.live


#: What the daemon follows: the hook spool alone, or README's command (transcripts and spool).
WATCHED = pytest.mark.parametrize("transcripts", [False, True], ids=["spool", "transcripts+spool"])


@contextmanager
def supervised(tmp_path: Path, *, transcripts: bool = False) -> Iterator[tuple[Path, Path]]:
    """Hooks installed in the scratch HOME, and the daemon following their spool (and, with
    ``transcripts``, the HOME's ``.claude/projects`` first, as README's command): (spool, ledger)."""
    home, spool, ledger = tmp_path / "home", tmp_path / "spool", tmp_path / "ledger.sqlite3"
    projects = home / ".claude" / "projects"
    projects.mkdir(parents=True)
    spool.mkdir()
    watch = [*(["--watch", str(projects)] if transcripts else []), "--watch", str(spool)]
    installed = CliRunner(env={"HOME": str(home)}).invoke(
        main, ["hooks", "install", "--claude", "--user", "--spool", str(spool)])
    assert installed.exit_code == 0, installed.output
    SQLiteRecorder(ledger).close()
    daemon = subprocess.Popen([sys.executable, "-m", "tillerman", "run", "--no-codex", *watch,
                               "--ledger", str(ledger)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    try:
        yield spool, ledger
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)


def propose(ledger: Path, session_id: str, mode: str, text: str, **fields) -> str:
    with SQLiteRecorder(ledger) as recorder:
        return intents.propose(recorder, thread_id=session_id, mode=mode, text=text, owner=local_login(),
                               **fields).id


def active_turn(ledger: Path, session_id: str) -> str | None:
    with SQLiteRecorder(ledger) as recorder:
        return projections.load(recorder).snapshot(session_id).active_turn_id


def view(ledger: Path, intent_id: str):
    with SQLiteRecorder(ledger) as recorder:
        return intents.intent_view(recorder, intent_id)


def until(done, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not (value := done()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def outbox_holds(spool: Path, session_id: str, *intent_ids: str) -> bool:
    outbox = read_outbox(outbox_path(spool, session_id))
    return outbox is not None and {p.intent_id for p in outbox.parcels} == set(intent_ids)


def requests_saying(model: AnthropicModel, text: str, since: int) -> list:
    """The model calls whose newest user message carries ``text`` (history repeats it)."""
    return [r for r in model.requests[since:] if any(text in t for t in r.texts + r.tool_outputs)]



def held_turn(session: ClaudeSession, ledger: Path, release: Path) -> str:
    """Start a turn the scripted model holds until ``release`` exists; once the daemon
    sees it running, the session's id."""
    session.user(f"WAIT: {release}")
    session_id = session.session_id
    until(lambda: active_turn(ledger, session_id), "the daemon to see the turn")
    return session_id

@WATCHED
def test_a_queued_intent_reaches_the_agent_once_at_the_stop_and_the_agent_acts_on_it(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, transcripts: bool) -> None:
    release = tmp_path / "release"
    with supervised(tmp_path, transcripts=transcripts) as (spool, ledger), \
            ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        since = len(anthropic_model.requests)
        session_id = held_turn(session, ledger, release)
        queued = propose(ledger, session_id, "queue", "RUN: echo acted-on-it")
        until(lambda: outbox_holds(spool, session_id, queued), "the daemon to fill the outbox")
        release.touch()
        result = session.wait_for(is_result)
        until(lambda: view(ledger, queued).state is State.ACKNOWLEDGED, "the intent to be acknowledged")
        # the turn's end is read from the Stop hook's line: before the daemon stops (a loaded machine reads it later)
        until(lambda: turns(ledger, session_id) == ["completed"], "the daemon to record the turn's end")
    assert result["subtype"] == "success" and len(session.results()) == 1  # one turn, continued by our block
    # The agent ran the command our text asked for: its output went to the model.
    assert any("acted-on-it" in out for r in anthropic_model.requests[since:] for out in r.tool_outputs)
    assert len(requests_saying(anthropic_model, "RUN: echo acted-on-it", since)) == 1  # once, never again
    assert moves(ledger, queued) == [("dispatch_unknown", "dispatching", "claude-hook"), ("acknowledged", "echo", None)]
    assert answered(spool, session_id) == [("Stop", queued)]
    assert turns(ledger, session_id) == ["completed"]  # one turn, whichever sources saw it


@WATCHED
def test_a_steer_for_the_next_tool_denies_it_with_the_intents_text(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, transcripts: bool) -> None:
    release, acted = tmp_path / "release", tmp_path / "ws" / "acted.txt"
    with supervised(tmp_path, transcripts=transcripts) as (spool, ledger), \
            ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        since = len(anthropic_model.requests)
        session_id = held_turn(session, ledger, release)
        # The queued message makes the agent call a tool in this turn; the steer meets that call.
        queued = propose(ledger, session_id, "queue", f"RUN: touch {acted}")
        steer = propose(ledger, session_id, "steer", "Do not touch files; say done.", expected_turn="active",
                        deliver_at="pre_tool_use")
        until(lambda: outbox_holds(spool, session_id, queued, steer), "the daemon to fill the outbox")
        release.touch()
        result = session.wait_for(is_result)
        until(lambda: view(ledger, steer).state is State.ACKNOWLEDGED, "the steer to be acknowledged")
        until(lambda: turns(ledger, session_id) == ["completed"], "the daemon to record the turn's end")
    assert result["subtype"] == "success" and len(session.results()) == 1
    denied = requests_saying(anthropic_model, "Do not touch files; say done.", since)
    assert len(denied) == 1 and denied[0].tool_outputs[0].startswith("PreToolUse:Bash hook error:")
    assert not acted.exists()  # denied before it ran
    assert moves(ledger, steer) == [("dispatch_unknown", "dispatching", "claude-hook"), ("acknowledged", "echo", None)]
    assert moves(ledger, queued) == [("dispatch_unknown", "dispatching", "claude-hook"), ("acknowledged", "echo", None)]
    assert answered(spool, session_id) == [("Stop", queued), ("PreToolUse", steer)]
    assert turns(ledger, session_id) == ["completed"]


@WATCHED
def test_a_steer_denying_one_of_parallel_calls_is_acknowledged_at_the_stop_not_by_a_sibling(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, transcripts: bool) -> None:
    """One model message asks for two read-only calls; the steer denies the first in
    line. The other call's hooks come after the deny, before the model has our text: the
    spool's echo of the steer must come from the Stop, after the model got it."""
    release = tmp_path / "release"
    with supervised(tmp_path, transcripts=transcripts) as (spool, ledger), \
            ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        since = len(anthropic_model.requests)
        session_id = held_turn(session, ledger, release)
        queued = propose(ledger, session_id, "queue", "RUN ALL: echo first-call ;; echo second-call")
        steer = propose(ledger, session_id, "steer", "Do not run these; say done.", expected_turn="active",
                        deliver_at="pre_tool_use")
        until(lambda: outbox_holds(spool, session_id, queued, steer), "the daemon to fill the outbox")
        release.touch()
        session.wait_for(is_result)
        until(lambda: view(ledger, steer).state is State.ACKNOWLEDGED, "the steer to be acknowledged")
    assert len(requests_saying(anthropic_model, "Do not run these; say done.", since)) == 1
    assert moves(ledger, steer) == [("dispatch_unknown", "dispatching", "claude-hook"), ("acknowledged", "echo", None)]
    lines = [json.loads(line) for line in (spool / f"{session_id}.jsonl").read_text().splitlines()]
    deny = next(i for i, line in enumerate(lines) if line.get("tillerman", {}).get("delivered") == steer)
    stop = next(i for i, line in enumerate(lines) if i > deny and line["hook_event_name"] == "Stop")
    denied = lines[deny]["tool_use_id"]
    assert [line for line in lines[deny + 1:stop] if line.get("tool_use_id") not in (None, denied)]  # a sibling's
    echoes = [e for e in parse_spool(lines[:stop]) if isinstance(e, UserMessage) and e.client_id == f"tillerman-{steer}"]
    assert not echoes  # nothing before the Stop proves it
    assert [e for e in parse_spool(lines) if isinstance(e, UserMessage) and e.client_id == f"tillerman-{steer}"]


def parse_spool(lines: list[dict]) -> list:
    return events("claude-hooks", b"".join(json.dumps(line).encode() + b"\n" for line in lines))


def moves(ledger: Path, intent_id: str) -> list[tuple]:
    return [(h.state, h.reason, h.evidence.get("via")) for h in view(ledger, intent_id).history
            if h.kind == "transition"]


def turns(ledger: Path, session_id: str) -> list[str]:
    """The session's turns as the ledger's fold has them: how each ended."""
    with SQLiteRecorder(ledger) as recorder:
        return list(projections.load(recorder).threads[session_id].turn_states.values())


def answered(spool: Path, session_id: str) -> list[tuple[str, str]]:
    """What our hooks delivered, in order, from the spool."""
    lines = [json.loads(line) for line in (spool / f"{session_id}.jsonl").read_text().splitlines()]
    return [(line["hook_event_name"], line["tillerman"]["delivered"]) for line in lines if "tillerman" in line]


def test_a_busy_ledger_does_not_stall_the_session(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path) -> None:
    release = tmp_path / "release"
    with supervised(tmp_path) as (spool, ledger), \
            ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        since = len(anthropic_model.requests)
        session_id = held_turn(session, ledger, release)
        queued = propose(ledger, session_id, "queue", "RUN: echo never")
        until(lambda: outbox_holds(spool, session_id, queued), "the daemon to fill the outbox")
        holder = sqlite3.connect(ledger, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # a long write transaction elsewhere
        try:
            release.touch()
            result = session.wait_for(is_result)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert result["subtype"] == "success"
    assert not requests_saying(anthropic_model, "RUN: echo never", since)
    assert view(ledger, queued).state is State.PROPOSED  # not claimed: a later Stop may still deliver it
    lines = [json.loads(line) for line in (spool / f"{session_id}.jsonl").read_text().splitlines()]
    assert [line["tillerman"] for line in lines if "tillerman" in line] == [
        {"fail_open": "ledger_busy", "intent_id": queued}]
