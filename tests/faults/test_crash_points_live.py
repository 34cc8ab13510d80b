"""Crash at every step of the dispatch protocol: for each named checkpoint
(``tillerman.controller.dispatch.driver.CHECKPOINTS``) and each mode (steer, queue, interrupt), the daemon
— a real ``python -m tillerman.controller run`` process — SIGKILLs itself there
(``TILLERMAN_KILL_AT``), is restarted, and must settle the intent without resending it.

Checked after each crash, against the REAL app-server and the scripted model:

* the intent ends in a definite state (the one the crash point implies);
* the daemon's trace shows the dispatch request sent at most once over both lives, and
  never again after the restart (a record without a send is settled by readback);
* our clientId's userMessage appears at most once in the thread, read back from the
  server (``thread/turns/list``, ``itemsView: "full"``) AND from the rollout file, and a
  steer's copy is in its expected turn;
* ``ledger verify`` and ``PRAGMA integrity_check`` pass.

A stop (``--mode stop``) on a goal thread is killed at each point as well: after the
restart it ends ``effect_verified``, the goal paused and no turn running, with the goal
paused once and no turn interrupted twice over both lives (every step reads before it
writes: the restarted daemon never resends a write blindly).

The full matrix is ``slow`` (``make torture``); one point per mode runs in ``make test``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer, HarnessClient, watched_connection
from tests.faults.torture import QUEUE_ACK_DEADLINE, DaemonProcess, Harness, ledger_health, thread_turns
from tillerman.controller.dispatch.driver import CHECKPOINTS

pytestmark = [pytest.mark.live, pytest.mark.anyio]

#: Where the dispatch request stands when the daemon dies at each point.
NOT_SENT = {"dispatch_recording", "dispatch_recorded", "dispatch_sending"}
#: One point per mode for ``make test``: the most telling for that mode.
FAST = {("steer", "dispatch_answered"), ("queue", "dispatch_sending"), ("interrupt", "answer_recorded")}


def expected_end(mode: str, point: str) -> set[tuple[str, str]]:
    """The definite states each crash point may end in (never a resend, whatever it is)."""
    if point == "dispatch_recording":  # no record, nothing sent: dispatched afresh after the restart
        return {"steer": {("acknowledged", "echo")},
                "queue": {("acknowledged", "echo"), ("acknowledged", "queue_turn_started")},
                "interrupt": {("acknowledged", "turn_interrupted")}}[mode]
    if point in NOT_SENT:  # recorded, never sent: the readback after the turn finds nothing
        return {("expired", "not_delivered")}
    return {"steer": {("acknowledged", "echo"), ("acknowledged", "readback_found")},
            "queue": {("acknowledged", "echo"), ("acknowledged", "queue_turn_started"),
                      ("acknowledged", "readback_found")},
            "interrupt": {("acknowledged", "turn_interrupted")}}[mode]


def cases():
    for mode in ("steer", "queue", "interrupt"):
        for point in CHECKPOINTS:
            marks = () if (mode, point) in FAST else (pytest.mark.slow,)
            yield pytest.param(mode, point, marks=marks, id=f"{mode}-{point}")


@pytest.mark.parametrize(("mode", "point"), list(cases()))
async def test_killed_at_a_checkpoint_then_restarted_settles_without_resending(
    mode: str, point: str, app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    daemon = DaemonProcess(app_server.url, tmp_path)
    async with watched_connection(app_server.url, client_name="harness",
                                  client_class=HarnessClient) as (client, log):
        h = Harness(app_server, client, log, daemon)
        daemon.start(kill_at=point)
        try:
            thread = await h.start_thread(workspace)
            # Killed before the dispatch was recorded, the restarted daemon dispatches: its
            # turn outlasts a restart on a loaded machine (3 s once did not).
            turn = await h.start_turn(thread, f"RUN: sleep {10 if point == 'dispatch_recording' else 3}")
            await h.command_started(thread, turn)
            text = f"CRASHTEST {mode} at {point}: note this and carry on."
            if mode == "queue":
                intent_id = h.propose(thread_id=thread, mode=mode, text=text, ack_deadline=QUEUE_ACK_DEADLINE)
            else:
                intent_id = h.propose(thread_id=thread, mode=mode, text=text, expected_turn=turn)

            await _killed_at_its_point(daemon)  # the daemon picks the intent up and dies there
            client_id = _client_id(daemon.ledger, intent_id)
            sent_before = h.trace.count(mode, client_id, turn)
            assert sent_before == (0 if point in NOT_SENT else 1)

            daemon.process = None
            daemon.start()  # no kill point: the restart reads back, never resends
            await h.idle(thread, keep_alive=False)
            await h.settle([intent_id], timeout=25, keep_alive=False)
            await h.idle(thread, keep_alive=False)
            (outcome,) = await h.outcomes(thread, [intent_id], label=f"{mode}@{point}")
        finally:
            assert daemon.stop() == 0, daemon.stderr_tail()

    assert (outcome.state, outcome.reason) in expected_end(mode, point), outcome.describe()
    assert not outcome.problems, outcome.describe()
    # never resent: a dispatch recorded before the crash is not sent by the restarted daemon
    assert outcome.sends == (1 if point == "dispatch_recording" else sent_before), outcome.describe()
    if mode != "interrupt":
        delivered = outcome.state == "acknowledged"
        assert len(outcome.on_server) == len(outcome.in_rollout) == int(delivered), outcome.describe()
    if mode == "steer" and outcome.on_server:
        assert outcome.on_server == [turn]
    ok, problems = ledger_health(daemon.ledger)
    assert ok, problems


def stop_cases():
    for point in CHECKPOINTS:
        marks = () if point == "dispatch_answered" else (pytest.mark.slow,)
        yield pytest.param(point, marks=marks, id=f"stop-{point}")


@pytest.mark.parametrize("point", list(stop_cases()))
async def test_a_stop_killed_at_a_checkpoint_then_restarted_stops_the_thread_once(
    point: str, app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    daemon = DaemonProcess(app_server.url, tmp_path)
    async with watched_connection(app_server.url, client_name="harness",
                                  client_class=HarnessClient) as (client, log):
        h = Harness(app_server, client, log, daemon)
        daemon.start(kill_at=point)
        try:
            thread = await h.start_thread(workspace)
            turn = await h.start_turn(thread, "RUN: sleep 10")
            await h.command_started(thread, turn)
            # Its goal would go on after this turn, turn after turn.
            await client.request("thread/goal/set", {"threadId": thread, "objective": "keep going",
                                                     "status": "active", "origin": "user"})
            intent_id = h.propose(thread_id=thread, mode="stop", text=f"CRASHTEST stop at {point}")

            await _killed_at_its_point(daemon)  # the daemon picks the stop up and dies there
            # dispatch_sending is passed before the first write: the goal's pause
            assert h.trace.stop_writes(thread, "thread/goal/set") == (0 if point in NOT_SENT else 1)

            daemon.process = None
            daemon.start()  # no kill point: the restart reads back before it writes
            with anyio.fail_after(40):  # acknowledged is not the end of a stop: its readback is
                while _end(daemon.ledger, intent_id)[0] not in ("effect_verified", "effect_failed", "expired"):
                    await anyio.sleep(0.1)
            goal = (await client.request("thread/goal/get", {"threadId": thread}))["goal"]
            turns = await thread_turns(client, thread)
            state, reason = _end(daemon.ledger, intent_id)
        finally:
            assert daemon.stop() == 0, daemon.stderr_tail()

    assert (state, reason) == ("effect_verified", "stop_verified"), daemon.stderr_tail()
    assert goal["status"] == "paused"
    assert not [t["id"] for t in turns if t["status"] == "inProgress"]
    assert h.trace.stop_writes(thread, "thread/goal/set") == 1  # paused once over both lives
    interrupted = [t["id"] for t in turns if h.trace.count("interrupt", "", t["id"])]
    assert all(h.trace.count("interrupt", "", turn_id) == 1 for turn_id in interrupted)
    ok, problems = ledger_health(daemon.ledger)
    assert ok, problems


async def _killed_at_its_point(daemon: DaemonProcess) -> None:
    """Wait (20 s at most) for the daemon to kill itself at its kill point."""
    with anyio.fail_after(20):
        while daemon.process.poll() is None:
            await anyio.sleep(0.02)
    assert daemon.process.returncode == -signal.SIGKILL, daemon.stderr_tail()


def _end(ledger: Path, intent_id: str) -> tuple[str, str | None]:
    from tillerman.controller.core.intent_requests import intent_view
    from tillerman.ledger.sqlite import SQLiteRecorder

    with SQLiteRecorder(ledger) as rec:
        view = intent_view(rec, intent_id)
    last = next((h for h in reversed(view.history) if h.kind == "transition"), None)
    return view.state, last.reason if last else None


def _client_id(ledger: Path, intent_id: str) -> str:
    from tillerman.controller.core.intent_requests import intent_view
    from tillerman.ledger.sqlite import SQLiteRecorder

    with SQLiteRecorder(ledger) as rec:
        return intent_view(rec, intent_id).intent.client_user_message_id
