"""Server faults against the REAL app-server: the server killed mid-turn, its socket gone
for a while, then a new server on the same CODEX_HOME and socket; and a server too slow
to answer (the reply outlives the adapter's timeout). Intents go to ``dispatch_unknown``
or stay queued / proposed, are reconciled after reconnection, and nothing is resent
blindly (the daemon's trace counts every steer, queue add and interrupt it sent)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer, HarnessClient, make_codex_home, watched_connection
from fixtures.scripted_model import ScriptedModel
from tests.faults.torture import (
    QUEUE_ACK_DEADLINE,
    DaemonProcess,
    Harness,
    TraceReader,
    judge,
    ledger_health,
    rollout_copies,
    thread_turns,
)
from tillerman.controller.core.intent_requests import intent_view, propose
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.ruleset import Grant, build_ruleset

pytestmark = [pytest.mark.live, pytest.mark.anyio]


@pytest.fixture
def own_server(scripted_model: ScriptedModel) -> Iterator[AppServer]:
    """A server of this test's own, since the test kills it."""
    home = make_codex_home(scripted_model.base_url)
    server = AppServer(home).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


async def test_server_killed_mid_turn_then_restarted_settles_without_resending(
    own_server: AppServer, tmp_path: Path
) -> None:
    workspace = own_server.codex_home / "ws"
    workspace.mkdir()
    daemon = DaemonProcess(own_server.url, tmp_path)
    daemon.start()
    try:
        async with watched_connection(own_server.url, client_name="harness",
                                      client_class=HarnessClient) as (client, log):
            h = Harness(own_server, client, log, daemon)
            thread = await h.start_thread(workspace)
            turn = await h.start_turn(thread, "RUN: sleep 4")
            await h.command_started(thread, turn)
            steer = h.propose(thread_id=thread, mode="steer", expected_turn=turn, text="SRVKILL steer: note this.")
            # accepted by the server (its reply recorded); its echo waits for the next model call. Killed
            # before the reply is recorded, the steer is not_delivered instead, rightly: not this test's case.
            with anyio.fail_after(15):
                while (state := intent_view(SQLiteRecorder(daemon.ledger), steer).state) in (
                        "proposed", "dispatch_unknown"):
                    await anyio.sleep(0.05)
            assert state == "queued"
        own_server.kill()  # mid-turn: the accepted steer dies with the server
        own_server.socket_path.unlink(missing_ok=True)  # and its socket is gone
        queue = h.propose(thread_id=thread, mode="queue", text="SRVKILL queue: then this.",
                          ack_deadline=QUEUE_ACK_DEADLINE)
        await anyio.sleep(2.0)  # the daemon cannot reach anything: nothing may be sent, nothing decided blindly
        assert intent_view(SQLiteRecorder(daemon.ledger), queue).state in ("proposed", "dispatch_unknown")
        own_server.start()  # a new server on the same CODEX_HOME and socket

        async with watched_connection(own_server.url, client_name="harness",
                                      client_class=HarnessClient) as (client, log):
            h = Harness(own_server, client, log, daemon)
            await client.request("thread/resume", {"threadId": thread})  # the harness picks its thread up again
            await h.settle([steer, queue], timeout=30, keep_alive=False)
            await h.idle(thread, keep_alive=False)
            outcomes = await h.outcomes(thread, [steer, queue], label="server killed")
    finally:
        assert daemon.stop() == 0, daemon.stderr_tail()
    by_id = {o.intent_id: o for o in outcomes}
    assert not [o.describe() for o in outcomes if o.problems]
    s = by_id[steer]
    # accepted, then lost with the server: reported, never resent
    assert (s.state, s.reason) == ("expired", "lost_after_accept") and s.reported and s.sends == 1, s.describe()
    q = by_id[queue]
    assert q.sends <= 1 and q.copies == int(q.state == "acknowledged"), q.describe()
    assert q.state in ("acknowledged", "expired"), q.describe()
    ok, problems = ledger_health(daemon.ledger)
    assert ok, problems


class SlowReplies:
    """The server answers the dispatch requests, but later than the adapter waits: the
    request reaches the server, the caller sees a timeout."""

    def __init__(self, client, methods: set[str]):
        self.client = client
        self.methods = methods

    async def request(self, method: str, params: dict | None = None, timeout: float = 10.0):
        result = await self.client.request(method, params, timeout)
        if method in self.methods:
            await anyio.sleep(timeout)
            raise TimeoutError
        return result


@pytest.mark.parametrize("mode", ["steer", "queue", "interrupt"])
async def test_a_reply_slower_than_the_timeout_leaves_dispatch_unknown_then_reconciles_without_resend(
    mode: str, app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    grants = build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"steer", "queue", "interrupt"})),))
    trace = tmp_path / "trace.jsonl"
    recorder = SQLiteRecorder(tmp_path / "ledger.sqlite3")
    daemon = Daemon(recorder, grants, DaemonOptions(url=app_server.url, request_timeout=1.0, trace=str(trace)))
    async with watched_connection(app_server.url, client_name="harness",
                                  client_class=HarnessClient) as (client, log), anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        await daemon.connected.wait()
        daemon.adapter.client = SlowReplies(daemon.adapter.client,
                                            {"turn/steer", "thread/queue/add", "turn/interrupt"})
        h = Harness(app_server, client, log, DaemonProcess(app_server.url, tmp_path / "unused"))
        thread = await h.start_thread(workspace)
        turn = await h.start_turn(thread, "RUN: sleep 2")
        await h.command_started(thread, turn)
        request = {"expected_turn": turn} if mode != "queue" else {"ack_deadline": QUEUE_ACK_DEADLINE}
        # Through the daemon's gate: this process shares the daemon's connection, whose
        # round may be committing on its own thread (a write then would land inside it).
        gated = daemon.recorder
        intent = propose(gated, thread_id=thread, mode=mode, owner="ann", text=f"SLOW {mode}: note this.",
                         **request).id
        with anyio.fail_after(30):
            while intent_view(gated, intent).state not in ("acknowledged", "expired", "rejected"):
                await anyio.sleep(0.05)
        history = intent_view(gated, intent).history
        with anyio.fail_after(30):  # let the thread go idle (a queued message runs its own turn)
            while (await client.request("thread/queue/list", {"threadId": thread})).get("data") or \
                    any(t.get("status") == "inProgress" for t in await thread_turns(client, thread)):
                await anyio.sleep(0.1)
        turns = await thread_turns(client, thread)
        tg.cancel_scope.cancel()
    (outcome,) = judge(Path(recorder.path), [intent], turns, rollout_copies(app_server, thread), TraceReader(trace))
    recorder.close()
    assert any(h.kind == "evidence" and h.reason == "timeout" for h in history), history
    assert outcome.state == "acknowledged", outcome.describe()  # reconciled: the request did land
    assert outcome.sends == 1 and not outcome.problems, outcome.describe()
    ok, problems = ledger_health(Path(recorder.path))
    assert ok, problems
