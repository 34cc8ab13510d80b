"""Notifications and metrics beside the REAL app-server: a sink that hangs or fails never
delays a dispatch, and ``/metrics`` moves while the daemon supervises a live turn."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer
from fixtures.rule_texts import ANN_STEERS_ANYWHERE
from tests.live.daemon_support import SETTLED, ruleset_from, session, wait_until
from tillerman.controller.core import intent_requests
from tillerman.controller.daemon.metrics import Metrics
from tillerman.ledger.events import NotificationFailed, NotificationSent
from tillerman.rules.notify import NotifySink

pytestmark = [pytest.mark.live, pytest.mark.anyio]

DELIVERED = frozenset({"acknowledged", "action_started", "effect_verified", "effect_failed"})


async def test_a_hanging_or_failing_sink_never_delays_a_dispatch(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    holding = tmp_path / "hanging-sink.got"
    sinks = (NotifySink(name="hangs", command=("sh", "-c", f"cat > {holding}; sleep 120"), group_window=0.0,
                        timeout=300.0, kinds=("escalation",)),
             NotifySink(name="fails", command=("sh", "-c", "cat >/dev/null; exit 1"), group_window=0.0,
                        kinds=("escalation",)))
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, "", ANN_STEERS_ANYWHERE), sinks=sinks)
        thread, turn = await s.start_command(workspace, "RUN: sleep 4")
        # nobody may steer: escalated to a person, which both sinks are told
        refused = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer",
                                          owner="nobody", text="not allowed zq7")
        await wait_until(lambda: holding.exists() and holding.read_text().endswith("}"), "the hanging sink to hold")
        failed = await wait_until(lambda: [e for e in s.events(NotificationFailed) if e.sink == "fails"],
                                  "the failing sink's first failure")
        assert failed[0].retry_in == 2.0 and "exited 1" in failed[0].error and refused.id in failed[0].keys[0]

        steer = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer",
                                        owner="ann", text="carry on zq8")
        delivered = await s.wait_state(steer.id, DELIVERED | SETTLED)
        assert delivered.state in DELIVERED and any(m["params"]["expectedTurnId"] == turn for m in s.sent("turn/steer"))
        # the hanging sink still holds its notices: the dispatch never waited for it
        assert [e for e in s.events(NotificationSent) + s.events(NotificationFailed) if e.sink == "hangs"] == []
        assert await s.turn_completed(thread, turn) == "completed"


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {name: float(value) for name, _, value in
            (line.rpartition(" ") for line in text.splitlines() if line and not line.startswith("#"))}


async def test_metrics_move_during_a_live_run(app_server: AppServer, workspace: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics = Metrics()
    metrics.serve(("127.0.0.1", port))
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, "", ANN_STEERS_ANYWHERE), metrics=metrics)
        before = await anyio.to_thread.run_sync(_scrape, port)
        thread, turn = await s.start_command(workspace, "RUN: sleep 2")
        steer = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer",
                                        owner="ann", text="metrics zq9")
        await s.wait_state(steer.id, DELIVERED | SETTLED)
        assert await s.turn_completed(thread, turn) == "completed"
        after = await wait_until(lambda: (m := _scrape(port)).get('tillerman_intents{state="proposed"}') == 0 and m,
                                 "the steer to leave proposed in the metrics")
    ingested = 'tillerman_events_ingested_total{source="appserver"}'
    assert after[ingested] > before.get(ingested, 0)
    assert after['tillerman_decisions_total{action="steer"}'] >= 1
    assert sum(v for k, v in after.items() if k.startswith("tillerman_intents{")) == 1
    assert after["tillerman_ledger_append_seconds_count"] > before["tillerman_ledger_append_seconds_count"]
    assert after["tillerman_overdue_intents"] == 0
