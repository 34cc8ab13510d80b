"""Several ``tillerman run`` daemons on one PostgreSQL ledger and one REAL app-server,
sharing the threads by lease.

Every intent is dispatched by exactly one daemon (each daemon's ``--trace`` shows what
it sent). A daemon stopped (SIGSTOP, ``TILLERMAN_STOP_AT``) at a named checkpoint of the
delivery protocol past its lease loses the thread to another daemon, which reads it back
and reconciles before it dispatches; woken (SIGCONT), the stopped daemon's dispatch is
refused by the fence, and nothing is delivered twice.

``make test`` runs two checkpoints; ``make torture`` runs every checkpoint with two and
three daemons, ``TILLERMAN_LEASE_ROUNDS`` times (20 by default).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures.codex_server import AppServer, is_item, start_thread, start_turn, watched_connection
from fixtures.rule_texts import ANN_STEERS_ANYWHERE
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import SETTLED, wait_until
from tillerman.controller.core.intent_requests import intent_view, propose
from tillerman.controller.dispatch.driver import CHECKPOINTS, KILL_AT_ENV, STOP_AT_ENV
from tillerman.ledger.postgres import PostgresRecorder
from tillerman.monitor.jsonrpc import RpcError

pytestmark = [pytest.mark.live, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
LEASE = 3.0  # seconds: short enough for a test, long enough for a loaded machine to renew in time
ROUNDS = int(os.environ.get("TILLERMAN_LEASE_ROUNDS", "20"))
#: Checkpoints before the send: the woken daemon's dispatch must be refused by the fence.
BEFORE_THE_SEND = ("dispatch_recording", "dispatch_recorded", "dispatch_sending")


@dataclass
class Daemon:
    process: subprocess.Popen
    log: Path
    trace: Path

    @property
    def stopped(self) -> bool:
        """SIGSTOPped: the state letter in /proc/PID/stat is T."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def requests(self) -> list[dict]:
        """Every request this daemon sent, in order (its trace)."""
        if not self.trace.exists():
            return []
        records = (json.loads(line) for line in self.trace.read_text().splitlines() if line.strip())
        return [r["msg"] for r in records if r.get("dir") == "out" and isinstance(r.get("msg"), dict)
                and "method" in r["msg"]]

    def sent(self, client_id: str) -> int:
        """The dispatch requests (turn/steer) this daemon sent for the intent whose message
        has ``client_id`` (the trace redacts the text)."""
        return sum(1 for m in self.requests() if m["method"] == "turn/steer"
                   and m.get("params", {}).get("clientUserMessageId") == client_id)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_daemon(server: AppServer, dsn: str, config: Path, name: str, stop_at: str | None = None,
                 kill_at: str | None = None) -> Daemon:
    folder = config.parent
    log, trace = folder / f"{name}.log", folder / f"{name}-trace.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(STOP_AT_ENV, None)
    env.pop(KILL_AT_ENV, None)
    if stop_at:
        env[STOP_AT_ENV] = stop_at
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    with log.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "tillerman", "run", "--codex", server.url, "--ledger", dsn, "--config", str(config),
             "--lease", f"{LEASE:g}s", "--trace", str(trace), "-v"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    return Daemon(process, log, trace)


def owner_pid(ledger: PostgresRecorder, thread: str) -> int | None:
    """The pid of the daemon holding the thread's lease now (daemon ids are host:pid:random)."""
    held = [row for row in ledger.leases().all() if row["thread"] == thread and row["held"]]
    return int(held[0]["owner"].split(":")[-2]) if held else None


async def command_turn(harness, log, workspace: Path, seconds: int, *, runs: str = "RUN") -> tuple[str, str]:
    """A thread whose turn runs ``sleep`` (a steer lands at its tool boundary), once
    running. ``runs="RETRY"``: the agent runs it again each time it ends, six times, so
    the turn outlasts its command with a tool boundary after each run."""
    thread = await start_thread(harness, workspace)
    turn = await start_turn(harness, thread, f"{runs}: sleep {seconds}")
    await log.wait_for(lambda m: is_item("item/started", "commandExecution")(m) and m.params.get("threadId") == thread,
                       timeout=30)
    return thread, turn


async def user_messages(harness, thread: str) -> list[str | None]:
    """The clientId of every user message the server holds in the thread's turns."""
    turns = (await harness.request("thread/turns/list", {"threadId": thread, "limit": 10, "itemsView": "full"}))["data"]
    return [item.get("clientId") for t in turns for item in t.get("items", []) if item.get("type") == "userMessage"]


def delivered(scripted_model: ScriptedModel, text: str) -> int:
    """How many times the model was given ``text`` as a new user message."""
    return sum(1 for r in scripted_model.requests
               if r.last_user_text and text in r.last_user_text and not r.tool_output_call_id)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(ANN_STEERS_ANYWHERE)
    return path


# -- every intent dispatched by exactly one daemon ---------------------------------------------


@pytest.mark.parametrize("daemons", [2, 3])
async def test_every_intent_is_dispatched_by_exactly_one_daemon(
    daemons: int, app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, postgres_dsn: str,
    config: Path,
) -> None:
    PostgresRecorder(postgres_dsn).close()  # the ledger, created once before the daemons race to
    running = [start_daemon(app_server, postgres_dsn, config, f"d{i}") for i in range(daemons)]
    try:
        with PostgresRecorder(postgres_dsn) as ledger:
            await wait_until(lambda: len(ledger.leases().daemons()) == daemons, "every daemon to register", 60)
            async with watched_connection(app_server.url, client_name="harness") as (harness, log):
                turns = [await command_turn(harness, log, workspace, 6) for _ in range(daemons + 1)]
                texts = {thread: f"ONE DAEMON {daemons} {thread}: note this." for thread, _ in turns}
                intents = [propose(ledger, thread_id=thread, expected_turn=turn, mode="steer", owner="ann",
                                   text=texts[thread]) for thread, turn in turns]
                for intent in intents:
                    await wait_until(lambda i=intent: intent_view(ledger, i.id).state in SETTLED,
                                     f"intent {intent.id} to settle", 60)
                # Acknowledged is the server's echo; the model is given the steer at the
                # turn's next request, once its ``sleep`` ends (under load, after the echo).
                for thread, _ in turns:
                    await wait_until(lambda t=thread: delivered(scripted_model, texts[t]) >= 1,
                                     f"the model to be given the steer of {thread}", 60)
            for intent in intents:
                ours = intent.client_user_message_id
                assert intent_view(ledger, intent.id).state == "acknowledged"
                assert [d.sent(ours) for d in running].count(1) == 1 and sum(d.sent(ours) for d in running) == 1
                assert delivered(scripted_model, texts[intent.thread_id]) == 1
                assert owner_pid(ledger, intent.thread_id) in {d.process.pid for d in running}
            assert ledger.verify().ok
    finally:
        for daemon in running:
            daemon.stop()


# -- failover ---------------------------------------------------------------------------------


async def test_a_dead_daemons_thread_is_taken_over_and_read_back_before_anything_is_dispatched(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, postgres_dsn: str, config: Path,
) -> None:
    """The owner dies (SIGKILL) after the server accepted its steer, before recording the
    answer. The other daemon takes the thread once the lease expires, settles the steer
    by readback (never resending it), and only then dispatches the next intent."""
    PostgresRecorder(postgres_dsn).close()
    async with watched_connection(app_server.url, client_name="harness") as (harness, log):
        dead = start_daemon(app_server, postgres_dsn, config, "dead", kill_at="dispatch_answered")
        heir = None
        try:
            with PostgresRecorder(postgres_dsn) as ledger:
                thread, turn = await command_turn(harness, log, workspace, 10)
                await wait_until(lambda: owner_pid(ledger, thread) == dead.process.pid, "the first daemon's lease", 60)
                heir = start_daemon(app_server, postgres_dsn, config, "heir")
                await wait_until(lambda: len(ledger.leases().daemons()) == 2, "the second daemon to register", 60)
                sent = propose(ledger, thread_id=thread, expected_turn=turn, mode="steer", owner="ann",
                               text="FAILOVER FIRST: note this.")
                await wait_until(lambda: dead.process.poll() is not None, "the first daemon to die", 60)
                after = propose(ledger, thread_id=thread, expected_turn=turn, mode="steer", owner="ann",
                                text="FAILOVER SECOND: note this.")
                await wait_until(lambda: owner_pid(ledger, thread) == heir.process.pid, "the takeover", 60)
                for intent in (sent, after):
                    await wait_until(lambda i=intent: intent_view(ledger, i.id).state in SETTLED,
                                     f"intent {intent.id} to settle", 60)
                assert intent_view(ledger, sent.id).state == intent_view(ledger, after.id).state == "acknowledged"
                assert ledger.verify().ok
        finally:
            for daemon in (dead, heir):
                if daemon is not None:
                    daemon.stop()
        landed = await user_messages(harness, thread)
    assert [landed.count(i.client_user_message_id) for i in (sent, after)] == [1, 1]  # each once, in the thread
    # the heir listed the thread's turns (the readback) before it sent anything
    methods = [m["method"] for m in heir.requests() if m.get("params", {}).get("threadId") == thread]
    assert "thread/turns/list" in methods and methods.index("thread/turns/list") < methods.index("turn/steer")
    assert dead.sent(sent.client_user_message_id) == 1 and heir.sent(sent.client_user_message_id) == 0
    assert dead.sent(after.client_user_message_id) == 0 and heir.sent(after.client_user_message_id) == 1


# -- a daemon paused past its lease at each checkpoint --------------------------------------------


async def paused_past_its_lease(checkpoint: str, daemons: int, app_server: AppServer, scripted_model: ScriptedModel,
                                workspace: Path, dsn: str, config: Path) -> None:
    """Daemon 0 holds the thread and stops at ``checkpoint`` while dispatching a steer; the
    others take the thread after the lease expires; daemon 0 is woken. The steer reaches
    the model at most once, and is never sent by the woken daemon after the takeover."""
    PostgresRecorder(dsn).close()
    text = f"PAUSED AT {checkpoint} {os.urandom(4).hex()}: note this."
    async with watched_connection(app_server.url, client_name="harness") as (harness, log):
        first = start_daemon(app_server, dsn, config, "paused", stop_at=checkpoint)
        others: list[Daemon] = []
        try:
            with PostgresRecorder(dsn) as ledger:
                # The turn outlasts a takeover on a loaded machine (three daemons starting,
                # a lease running out, a readback): a steer for an ended turn expires. One
                # long command did not do: Codex hands a command still running after 10 s
                # back to the model, which ended the turn, and once a takeover took longer.
                # Six runs of 3 s: a turn of about 20 s, a boundary for the steer every 3 s.
                thread, turn = await command_turn(harness, log, workspace, 3, runs="RETRY")
                await wait_until(lambda: owner_pid(ledger, thread) == first.process.pid, "the first daemon's lease", 60)
                others = [start_daemon(app_server, dsn, config, f"other{i}") for i in range(daemons - 1)]
                await wait_until(lambda: len(ledger.leases().daemons()) == daemons, "every daemon to register", 60)
                intent = propose(ledger, thread_id=thread, expected_turn=turn, mode="steer", owner="ann", text=text)
                await wait_until(lambda: first.stopped, f"the first daemon to stop at {checkpoint}", 60)
                pids = {d.process.pid for d in others}
                await wait_until(lambda: owner_pid(ledger, thread) in pids, "another daemon to take the thread", 60)
                token = next(r["token"] for r in ledger.leases().all() if r["thread"] == thread)
                assert token >= 2  # a new token: the first daemon's fence is refused from now on
                first.process.send_signal(signal.SIGCONT)
                await wait_until(lambda: intent_view(ledger, intent.id).state in SETTLED, "the steer to settle", 60)
                await wait_until(lambda: "fenced:" in first.log.read_text() or checkpoint not in BEFORE_THE_SEND,
                                 "the woken daemon to be fenced", 30)
                final = intent_view(ledger, intent.id)
                assert ledger.verify().ok
        finally:
            for daemon in (first, *others):
                daemon.stop()
        ours = [c for c in await user_messages(harness, thread) if c == intent.client_user_message_id]
        # The long turn is ended here: left running, every later test's daemons would
        # lease it and read it back at their start.
        with contextlib.suppress(RpcError):  # it may have ended already
            await harness.request("turn/interrupt", {"threadId": thread, "turnId": turn})
    client_id = intent.client_user_message_id
    assert len(ours) <= 1 and delivered(scripted_model, text) <= 1  # never twice
    assert sum(d.sent(client_id) for d in (first, *others)) <= 1
    if checkpoint in BEFORE_THE_SEND:
        assert "fenced:" in first.log.read_text()
        assert first.sent(client_id) == 0  # woken after the takeover: refused before the socket
    else:  # it had sent before it stopped: the new owner found the steer by readback or echo
        assert first.sent(client_id) == 1 and final.state == "acknowledged" and len(ours) == 1
    if checkpoint == "dispatch_recording":  # no record was made: the new owner dispatched it itself
        assert final.state == "acknowledged" and len(ours) == 1, [(h.state, h.reason) for h in final.history]
        assert sum(d.sent(client_id) for d in others) == 1


@pytest.mark.parametrize(("checkpoint", "daemons"), [("dispatch_recorded", 2), ("dispatch_sending", 3)])
async def test_a_daemon_paused_past_its_lease_is_fenced_and_nothing_is_delivered_twice(
    checkpoint: str, daemons: int, app_server: AppServer, scripted_model: ScriptedModel, workspace: Path,
    postgres_dsn: str, config: Path,
) -> None:
    await paused_past_its_lease(checkpoint, daemons, app_server, scripted_model, workspace, postgres_dsn, config)


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(ROUNDS))
@pytest.mark.parametrize("daemons", [2, 3])
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
async def test_torture_every_checkpoint_paused_past_its_lease(
    checkpoint: str, daemons: int, round_: int, app_server: AppServer, scripted_model: ScriptedModel,
    workspace: Path, postgres_dsn: str, config: Path,
) -> None:
    await paused_past_its_lease(checkpoint, daemons, app_server, scripted_model, workspace, postgres_dsn, config)
