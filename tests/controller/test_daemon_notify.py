"""The daemon's notifications end to end (no app-server: the notifier needs none): an
overdue intent is handed to the sinks once, and its settling once more, even when the
daemon was restarted in between; ``--metrics`` counts what the brain folds."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from tillerman.controller.core import intent_requests
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.controller.daemon.metrics import Metrics
from tillerman.ledger.events import Envelope, NotificationSent, ThreadStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.notify import NotifySink
from tillerman.rules.ruleset import Grant, build_ruleset

ANN_MAY_QUEUE = build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"queue"})),))


def _notices(path: Path) -> list[dict]:
    """The notice groups the sink wrote completely (each ends with the newline it adds)."""
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def _sent(recorder) -> list[tuple[str, ...]]:
    return [e.envelope.event.keys for e in recorder.read() if isinstance(e.envelope.event, NotificationSent)]


def _run_until(recorder, options: DaemonOptions, done) -> Daemon:
    daemon = Daemon(recorder, ANN_MAY_QUEUE, options)

    async def run():
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                while not done():
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()

    anyio.run(run)
    return daemon


@pytest.mark.parametrize("sink", ["notify", "on-overdue"])
def test_every_overdue_intent_gets_exactly_one_resolved_notice_across_a_restart(tmp_path, sink):
    out = tmp_path / "notices.jsonl"
    url = f"unix://{tmp_path}/nobody-listens.sock"
    if sink == "notify":  # a [[notify]] sink: groups of notices
        options = DaemonOptions(url=url, sinks=(NotifySink(
            name="file", command=("sh", "-c", f"cat >> {out}; echo >> {out}"), group_window=0.2),))
    else:  # --on-overdue: each notice alone, the same restart guarantees
        options = DaemonOptions(url=url, on_overdue=f"cat >> {out}; echo >> {out}")
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as recorder:
        late = intent_requests.propose(recorder, now=time.time() - 10, thread_id="T1", mode="queue", text="later",
                                       owner="ann", ack_deadline=1.0)
        _run_until(recorder, options, lambda: len(_sent(recorder)) == 1)
        intent_requests.transition(recorder, late.id, State.EXPIRED, "cancelled")  # settles while stopped
    with SQLiteRecorder(path) as recorder:  # restarted: the resolution only
        # stopped once it is recorded: a hand-over cut short before its record is sent again
        _run_until(recorder, options, lambda: len(_sent(recorder)) == 2)
    with SQLiteRecorder(path) as recorder:  # restarted again: nothing, for several rounds and windows
        stop = time.monotonic() + 1.5
        _run_until(recorder, options, lambda: time.monotonic() > stop)
    first, resolved = [n for group in _notices(out) for n in group.get("notices", [group])]
    assert (first["intent"], first["deadline"], first["resolved"]) == (late.id, "ack", False)
    assert (resolved["intent"], resolved["deadline"], resolved["resolved"], resolved["state"]) == (
        late.id, "ack", True, "expired")
    with SQLiteRecorder(path) as recorder:
        assert _sent(recorder) == [(f"overdue:{late.id}@ack",), (f"overdue:{late.id}@resolved",)]


def test_metrics_count_what_the_daemon_folds(tmp_path):
    metrics = Metrics()
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        recorder.append([Envelope(event_id="t1", event=ThreadStarted(thread_id="T1"), source="appserver:x",
                                  at=time.time() - 20)])  # a thread seen live, so the policy judges grants
        intent_requests.propose(recorder, now=time.time() - 10, thread_id="T1", mode="queue", text="later",
                                owner="ann", ack_deadline=1.0)
        intent_requests.propose(recorder, thread_id="T1", mode="queue", text="later", owner="bob")  # no grant
        options = DaemonOptions(url=f"unix://{tmp_path}/nobody-listens.sock", metrics=metrics)
        _run_until(recorder, options, lambda: metrics.registry.get_sample_value(
            "tillerman_intents", {"state": "rejected"}) == 1 and metrics.registry.get_sample_value(
            "tillerman_overdue_intents") == 1)
    value = metrics.registry.get_sample_value
    assert value("tillerman_decisions_total", {"action": "escalate"}) == 1
    assert value("tillerman_intents", {"state": "proposed"}) == 1
    assert value("tillerman_events_ingested_total", {"source": "tillerman"}) >= 3
    assert value("tillerman_events_ingested_total", {"source": "appserver"}) is None  # folded before the start
    assert value("tillerman_ledger_append_seconds_count") >= 1
