"""``tillerman claude`` without a CLI: the command it runs, the transcript readback on
transcripts the real CLI 2.1.332 wrote, and who carries out a wrapped session's intents."""

from __future__ import annotations

import time

import pytest

from tests.controller.test_claude_relay import INJECT_TURN, INJECTED, LATER, LATER_TURN, RECORDED
from tillerman.controller import intent_requests
from tillerman.controller.claude_wrapper import (
    CLAUDE_BIN_ENV, WrapperError, claude_command, resumed_session, transcript_turns,
)
from tillerman.controller.daemon import Daemon, DaemonOptions
from tillerman.controller.delivery import Tick
from tillerman.ledger import events as ev
from tillerman.ledger import projections
from tillerman.ledger.events import Envelope
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.codex_wire import IN_PROGRESS
from tillerman.rules.ruleset import Grant, build_ruleset


def test_the_stream_json_flags_are_added_only_when_the_harness_did_not_give_them(monkeypatch):
    monkeypatch.setenv(CLAUDE_BIN_ENV, "/opt/claude")
    assert claude_command(["--resume", "s1"]) == ["/opt/claude", "--input-format", "stream-json", "--output-format",
                                                  "stream-json", "--verbose", "--resume", "s1"]
    given = ["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
    assert claude_command(given) == ["/opt/claude", *given]
    assert resumed_session(["--verbose", "--resume", "s1"]) == "s1" == resumed_session(["--resume=s1"])
    assert resumed_session(["-p"]) is None


def test_without_a_cli_the_error_says_what_to_do(monkeypatch):
    monkeypatch.delenv(CLAUDE_BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(WrapperError, match="claude is not on PATH; install Claude Code or set TILLERMAN_CLAUDE_BIN"):
        claude_command([])


def test_the_transcript_shows_a_folded_steer_in_its_turn_and_a_queued_message_as_its_own_turn():
    folded = transcript_turns(RECORDED / "inject" / "transcript.jsonl", INJECTED, "tillerman-in-1")
    assert [(t.id, t.status, [i.client_id for i in t.items]) for t in folded.turns] == [
        (INJECT_TURN, "completed", ["tillerman-in-1"])]
    later = transcript_turns(RECORDED / "later" / "transcript.jsonl", LATER, "tillerman-in-2")
    assert [(t.id, bool(t.items)) for t in later.turns] == [(LATER, True), (LATER_TURN, False)]  # newest first
    absent = transcript_turns(RECORDED / "inject" / "transcript.jsonl", LATER, "tillerman-in-3")
    assert not [t for t in absent.turns if t.items] and IN_PROGRESS not in {t.status for t in absent.turns}


def driven(daemon: Daemon, intent_id: str) -> list[tuple]:
    """The delivery tasks the daemon starts for one fact of this intent."""
    started: list[tuple] = []

    class Group:
        def start_soon(self, *args):
            started.append(args)

    daemon._drive(Group(), intent_id, Tick(time.time()))
    return started


def test_the_daemon_leaves_a_wrapped_session_s_intents_to_the_wrapper(tmp_path):
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        recorder.append([Envelope(event_id="w1", event=ev.TurnStarted(thread_id="S", turn_id="T"),
                                  source="claude-wrapper:run1", at=time.time())])
        intent = intent_requests.propose(recorder, thread_id="S", mode="steer", text="x", expected_turn="T",
                                         owner="ann")
        projection = projections.load(recorder)
        assert projection.snapshot("S").steerable and projection.threads["S"].wrapped
        daemon = Daemon(recorder, build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"steer"})),)),
                        DaemonOptions(watch=(str(tmp_path),)))
        daemon.projection = projection
        assert driven(daemon, intent.id) == []


def test_an_app_server_thread_is_still_driven_by_the_daemon(tmp_path):
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        recorder.append([Envelope(event_id="a1", event=ev.TurnStarted(thread_id="S", turn_id="T"),
                                  source="appserver:x", at=time.time())])
        intent = intent_requests.propose(recorder, thread_id="S", mode="steer", text="x", expected_turn="T",
                                         owner="ann")
        daemon = Daemon(recorder, build_ruleset((), ()), DaemonOptions(watch=(str(tmp_path),)))
        daemon.projection = projections.load(recorder)
        assert not daemon.projection.threads["S"].wrapped
        assert len(driven(daemon, intent.id)) == 1
