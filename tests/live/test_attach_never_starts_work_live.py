"""Attaching never starts work: tillerman's start, restart after SIGKILL and reconnect leave
an idle thread idle, whatever its goal (against the real app-server).

On an idle thread with an active goal (its turn interrupted: Codex starts no continuation
by itself) a ``thread/resume`` from any client makes the server start the goal's next turn
~15 ms after the reply, on every supported release. A thread whose goal is paused is the
thread a person (or tillerman's ``stop``) stopped. The harness connection started these
threads, so it is subscribed to them and sees every ``turn/started``; it never resumes
anything. Each test watches both threads for ``QUIET`` seconds after tillerman attached,
then shows that tillerman still records the turns a person starts there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import (
    AppServer,
    EventLog,
    HarnessClient,
    is_notification,
    start_thread,
    start_turn,
    watched_connection,
)
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import OWNER, OWNER_GRANT, SETTLED, Session, ruleset_from, session, wait_until
from tillerman.controller.core import intent_requests
from tillerman.ledger.events import GoalUpdated, TurnCompleted, TurnStarted
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.jsonrpc import RpcError

pytestmark = [pytest.mark.live, pytest.mark.anyio]

QUIET = 4.0  # seconds: a woken goal starts its turn within ~15 ms, and then one after another
OBJECTIVE = "keep the test suite green"


async def held_turn(harness, thread: str, gate: Path) -> str:
    """A turn whose model call waits for ``gate`` (never created): it runs until interrupted."""
    return await start_turn(harness, thread, f"WAIT: {gate}")


async def started(log: EventLog, thread: str, turn: str) -> None:
    await log.wait_for(lambda m: is_notification("turn/started", threadId=thread)(m)
                       and m.params["turn"]["id"] == turn, timeout=20)


async def ended(log: EventLog, thread: str, turn: str) -> str:
    message = await log.wait_for(lambda m: is_notification("turn/completed", threadId=thread)(m)
                                 and m.params["turn"]["id"] == turn, timeout=20)
    return message.params["turn"]["status"]


async def set_goal(harness, thread: str, status: str) -> None:
    try:
        await harness.request("thread/goal/set", {"threadId": thread, "objective": OBJECTIVE, "status": status})
    except RpcError as exc:  # a release or configuration without goals: nothing can wake
        pytest.skip(f"this app-server has no thread goals ({exc})")


async def goal_thread(harness, workspace: Path,
                      recorded: Callable[[type], list] | None = None) -> tuple[str, str]:
    """A thread running a held turn, with an active goal set meanwhile: (thread, turn). With
    ``recorded`` (a running tillerman's ledger), once tillerman records the turn: it is then
    subscribed, and no resume of its is still in flight when the test interrupts the turn
    (an interrupt landing while the server handles a resume leaves the thread idle as the
    resume looks, and the goal goes on)."""
    thread = await start_thread(harness, workspace)
    turn = await held_turn(harness, thread, workspace / "never")
    await set_goal(harness, thread, "active")
    if recorded is not None:
        await wait_until(lambda: turn in {e.turn_id for e in recorded(TurnStarted)}, "tillerman to subscribe")
    return thread, turn


async def idle_goal_threads(harness, log: EventLog, workspace: Path,
                            recorded: Callable[[type], list] | None = None) -> tuple[str, str]:
    """Two idle threads: one whose goal is still active after its turn was interrupted, and
    one whose goal was paused after that (stopped)."""
    threads = []
    for status in ("active", "paused"):
        thread, turn = await goal_thread(harness, workspace, recorded)
        # running at the server before it is interrupted: turn/start answers first, and on a
        # loaded machine an interrupt sent at once found no active turn
        await started(log, thread, turn)
        await harness.request("turn/interrupt", {"threadId": thread, "turnId": turn})
        assert await ended(log, thread, turn) == "interrupted"
        if status == "paused":
            await set_goal(harness, thread, "paused")
        threads.append(thread)
    return threads[0], threads[1]


def turns_started(log: EventLog, threads: tuple[str, ...], since: int) -> list[tuple[str, str]]:
    return [(m.params["threadId"], m.params["turn"]["id"]) for m in log.messages[since:]
            if is_notification("turn/started")(m) and m.params.get("threadId") in threads]


async def no_turn_starts(log: EventLog, threads: tuple[str, ...], since: int) -> None:
    await anyio.sleep(QUIET)
    assert turns_started(log, threads, since) == []


async def a_persons_turn_is_recorded(harness, log: EventLog, workspace: Path, thread: str,
                                     recorded: Callable[[type], list]) -> None:
    """A person starts a turn on the thread: tillerman (``recorded(kind)`` reads its ledger)
    subscribes at its ``active`` status and records the turn and its end. The goal is paused
    first, so that the end starts no continuation."""
    await set_goal(harness, thread, "paused")
    turn = await held_turn(harness, thread, workspace / f"person-{thread}")
    await wait_until(lambda: turn in {e.turn_id for e in recorded(TurnStarted) if e.thread_id == thread},
                     "tillerman to record the person's turn")
    await harness.request("turn/interrupt", {"threadId": thread, "turnId": turn})
    assert await ended(log, thread, turn) == "interrupted"
    await wait_until(lambda: turn in {e.turn_id for e in recorded(TurnCompleted) if e.thread_id == thread},
                     "tillerman to record the end of the person's turn")


def resumed(s: Session, threads: tuple[str, ...]) -> list[str]:
    return [m["params"]["threadId"] for m in s.sent("thread/resume") if m["params"]["threadId"] in threads]


async def test_a_late_start_wakes_no_idle_goal_thread(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        threads = await idle_goal_threads(s.harness, s.log, workspace)
        since = len(s.log.messages)
        await s.start_daemon(ruleset_from(tmp_path, "", OWNER_GRANT))  # attached and read back

        await no_turn_starts(s.log, threads, since)
        assert resumed(s, threads) == []
        goals = {e.thread_id: e.status for e in s.events(GoalUpdated)}  # read, as a resume would have said
        assert [goals.get(thread) for thread in threads] == ["active", "paused"]
        for thread in threads:
            await a_persons_turn_is_recorded(s.harness, s.log, workspace, thread, s.events)
        assert sorted(resumed(s, threads)) == sorted(threads)  # subscribed once each turn ran


async def test_a_reconnect_wakes_neither_an_idle_goal_thread_nor_one_tillerman_stopped(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        daemon = await s.start_daemon(ruleset_from(tmp_path, "", OWNER_GRANT))
        # tillerman follows both from their first turn; it interrupts the first itself.
        stopped, turn = await goal_thread(s.harness, workspace, s.events)
        intent = intent_requests.propose(s.recorder, thread_id=stopped, expected_turn=turn, mode="interrupt",
                                         owner=OWNER, text="stop this turn")
        assert (await s.wait_state(intent.id, SETTLED)).state == "acknowledged"
        assert await ended(s.log, stopped, turn) == "interrupted"
        paused, turn = await goal_thread(s.harness, workspace, s.events)
        await s.harness.request("turn/interrupt", {"threadId": paused, "turnId": turn})
        assert await ended(s.log, paused, turn) == "interrupted"
        await set_goal(s.harness, paused, "paused")
        threads = (stopped, paused)
        await wait_until(lambda: set(threads) <= {e.thread_id for e in s.events(TurnCompleted)},
                         "the daemon to record both ends")

        since, resumes = len(s.log.messages), len(resumed(s, threads))
        dropped = daemon.adapter.client
        await dropped._websocket.close()  # the server drops tillerman's connection
        await wait_until(lambda: daemon.adapter is not None and daemon.adapter.client is not dropped
                         and daemon.connected.is_set(), "the daemon to reconnect")

        await no_turn_starts(s.log, threads, since)
        assert len(resumed(s, threads)) == resumes
        for thread in threads:
            await a_persons_turn_is_recorded(s.harness, s.log, workspace, thread, s.events)


def run_tillerman(server: AppServer, ledger: Path, config: Path, trace: Path) -> subprocess.Popen:
    """``tillerman run`` as a person starts it, beside the harness."""
    return subprocess.Popen(
        [sys.executable, "-m", "tillerman.controller", "run", "--codex", server.url, "--ledger", str(ledger),
         "--config", str(config), "--trace", str(trace)],
        env={k: v for k, v in os.environ.items() if k != "TILLERMAN_KILL_AT"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def attached(trace: Path) -> bool:
    """Whether the process tracing into ``trace`` attached: it listed the loaded threads."""
    return trace.exists() and '"thread/loaded/list"' in trace.read_text()


async def test_a_restart_after_sigkill_wakes_no_idle_goal_thread(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    ledger, config = tmp_path / "ledger.sqlite3", tmp_path / "config.toml"
    config.write_text(OWNER_GRANT)

    def recorded(kind: type) -> list:
        with SQLiteRecorder(ledger) as rec:
            return [e.envelope.event for e in rec.read() if isinstance(e.envelope.event, kind)]

    async with watched_connection(app_server.url, client_name="harness", client_class=HarnessClient) as (harness,
                                                                                                          log):
        first = run_tillerman(app_server, ledger, config, tmp_path / "first.jsonl")
        try:
            await wait_until(lambda: attached(tmp_path / "first.jsonl"), "tillerman to attach")
            threads = await idle_goal_threads(harness, log, workspace, recorded)
            await wait_until(lambda: set(threads) <= {e.thread_id for e in recorded(TurnCompleted)},
                             "tillerman to record both interrupted turns")
        finally:
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL

        since = len(log.messages)
        second = run_tillerman(app_server, ledger, config, tmp_path / "second.jsonl")
        try:
            await wait_until(lambda: attached(tmp_path / "second.jsonl"), "tillerman to attach again")
            await no_turn_starts(log, threads, since)
            for thread in threads:
                await a_persons_turn_is_recorded(harness, log, workspace, thread, recorded)
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(10) == 0, second.stderr.read().decode()[-2000:]
