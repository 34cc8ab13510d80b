"""SIGKILL between ``review_pending`` and ``review_committed``: the daemon (``tillerman run``
in its own process) is killed by its reviewer during the call. The restarted daemon finds
the pending record without its commit, fails the checkpoint closed (``review_interrupted``)
and calls nothing a second time; the intent ends ``rejected: review_failed``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fixtures.rule_texts import grant, reviewer, rule
from tillerman.controller.core import intent_requests
from tillerman.ledger.events import Envelope, ReviewCommitted, ReviewPending, ThreadStarted, TurnStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder


def _daemon(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tillerman.controller", "run", "--no-codex", "--watch", str(tmp_path / "sessions"),
         "--ledger", str(tmp_path / "ledger.sqlite3"), "--rules", str(tmp_path / "rules.toml"),
         "--config", str(tmp_path / "config.toml")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "TILLERMAN_KILL_AT"})


def _read(tmp_path: Path) -> tuple[Projection, list]:
    with SQLiteRecorder(tmp_path / "ledger.sqlite3", readonly=True) as reader:
        entries = list(reader.read())
    return Projection().fold(entries), [e.envelope.event for e in entries]


def test_a_daemon_killed_during_a_review_call_does_not_call_again_after_a_restart(tmp_path):
    (tmp_path / "sessions").mkdir()
    calls = tmp_path / "calls"
    script = tmp_path / "reviewer.py"
    # The reviewer kills the daemon that called it (its parent), after the pending record.
    script.write_text(f"import os, signal\nopen({str(calls)!r}, 'a').write('call')\n"
                      "os.kill(os.getppid(), signal.SIGKILL)\n")
    (tmp_path / "rules.toml").write_text(rule("nudge", condition={"kind": "turn_quiet", "for": "1h"},
                                              action="queue", text="go on", review="script"))
    (tmp_path / "config.toml").write_text(reviewer("script", [sys.executable, str(script)])
                                          + grant("rule:nudge", ["queue"], threads="*"))
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as rec:
        rec.append([Envelope(event_id="t", event=ThreadStarted(thread_id="T1"), source="appserver:x", at=1.0),
                    Envelope(event_id="u", event=TurnStarted(thread_id="T1", turn_id="u1"), source="appserver:x",
                             at=time.time())])
        intent = intent_requests.propose(rec, thread_id="T1", mode="queue", text="go on", owner="ann",
                                         producer="rule:nudge", rule_id="nudge", rule_version=1)

    first = _daemon(tmp_path)
    try:
        assert first.wait(timeout=30) == -signal.SIGKILL, first.stderr.read().decode()
    finally:
        first.kill()
    _, events = _read(tmp_path)
    assert [type(e) for e in events if isinstance(e, ReviewPending | ReviewCommitted)] == [ReviewPending]

    second = _daemon(tmp_path)
    try:
        deadline = time.monotonic() + 30
        while _read(tmp_path)[0].intents[intent.id].state != State.REJECTED:
            assert time.monotonic() < deadline and second.poll() is None, "the intent was never settled"
            time.sleep(0.1)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=10)
    projection, events = _read(tmp_path)
    assert calls.read_text() == "call"  # one call, charged once
    assert [e.outcome for e in events if isinstance(e, ReviewCommitted)] == ["review_interrupted"]
    view = projection.intents[intent.id]
    assert [h.reason for h in view.history if h.kind == "transition"][-1] == "review_failed"
