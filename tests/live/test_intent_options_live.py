"""Where ``verify`` runs, ``--resume-queue`` and ``--ack-token``: the whole daemon on the REAL
Codex app-server (0.171.0 by default), the intents proposed through ``tillerman intent propose`` on
the daemon's ledger, as a person would from another terminal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.codex_server import AppServer, is_item, text_input
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import (
    OWNER,
    OWNER_GRANT,
    SETTLED,
    Session,
    ruleset_from,
    session,
    wait_until,
)
from tillerman.controller.cli.main import main
from tillerman.ledger.events import Report
from tillerman.ledger.projections import IntentView
from tillerman.monitor.digest import digest

pytestmark = [pytest.mark.live, pytest.mark.anyio]



def propose(s: Session, *args: str) -> str:
    """``tillerman intent propose`` against the running daemon's ledger; the new intent's id."""
    result = CliRunner().invoke(main, ["intent", "propose", "--ledger", str(s.recorder.path), "--owner", OWNER,
                                       "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["id"]


def settled_by(view: IntentView):
    """The transition that put the intent in its current state."""
    return next(h for h in reversed(view.history) if h.kind == "transition" and h.state == view.state)


async def steer_into_a_running_turn(s: Session, workspace: Path, *args: str, retain: bool = False) -> IntentView:
    await s.start_daemon(ruleset_from(s.tmp_path, "", OWNER_GRANT), retain_payloads=retain)
    thread, turn = await s.start_command(workspace, "RUN: sleep 1")
    intent_id = propose(s, "--thread", thread, "--expected-turn", turn, "--mode", "steer", *args)
    view = await s.wait_state(intent_id, SETTLED)
    return view if view.intent.verify is None else await s.wait_state(intent_id, SETTLED - {"acknowledged"})


# -- verify runs in the thread's working directory --------------------------------------


@pytest.mark.parametrize(("created", "retain"), [(True, True), (False, False)])
async def test_verify_runs_in_the_threads_directory_not_the_daemons(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, created: bool, retain: bool,
) -> None:
    # The daemon's own directory holds the opposite answer: a readback run there is wrong.
    daemon_dir = tmp_path / "daemon-cwd"
    (daemon_dir / "build").mkdir(parents=True)
    if not created:
        (daemon_dir / "build" / "ok").write_text("decoy")
    monkeypatch.chdir(daemon_dir)
    (workspace / "build").mkdir()
    text = "Mark the build. CREATE: build/ok yes" if created else "Leave the build alone."
    async with session(app_server, tmp_path) as s:
        done = await steer_into_a_running_turn(s, workspace, "--text", text, "--verify", "test -f build/ok",
                                               retain=retain)
    move = settled_by(done)
    where = {"cwd_digest": digest(str(workspace))} | ({"cwd": str(workspace)} if retain else {})
    if created:
        assert (move.state, move.reason, move.evidence) == ("effect_verified", "verify_passed", {"exit_code": 0, **where})
        assert (workspace / "build" / "ok").read_text() == "yes"
        assert not (daemon_dir / "build" / "ok").exists()
    else:
        assert (move.state, move.reason, move.evidence) == ("effect_failed", "verify_failed", {"exit_code": 1, **where})
        assert not (workspace / "build" / "ok").exists()


# -- --resume-queue ------------------------------------------------------------------------


async def test_interrupt_with_resume_queue_restarts_the_queue_it_paused(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, "", OWNER_GRANT))
        thread, turn = await s.start_command(workspace, "RUN: sleep 5")
        await s.harness.request("thread/queue/add", {"threadId": thread, "clientUserMessageId": "harness-q-1",
                                                     "input": text_input("after the interrupt zq7")})
        intent_id = propose(s, "--thread", thread, "--expected-turn", turn, "--mode", "interrupt",
                            "--text", "stop: wrong approach", "--resume-queue")
        assert await s.turn_completed(thread, turn) == "interrupted"
        # The interrupt paused the server's queue; the intent asked to resume it, so the
        # harness's entry starts its own turn.
        resumed = await s.log.wait_for(is_item("item/completed", "userMessage", clientId="harness-q-1"), timeout=20)
        assert resumed.params["turnId"] != turn
        view = await wait_until(lambda: (v := s.intent(intent_id)) and any(
            h.reason == "queue_resumed" for h in v.history) and v, "the resume on record")
        assert (view.state, settled_by(view).reason) == ("acknowledged", "turn_interrupted")
        paused = next(h for h in view.history if h.reason == "queue_paused")
        assert paused.evidence == {"entries": 1, "resume": True}
        queue_resumed = next(h for h in view.history if h.reason == "queue_resumed")
        assert queue_resumed.evidence["turn_id"] == resumed.params["turnId"]
        assert [m["params"] for m in s.sent("thread/queue/start")] == [{"threadId": thread}]


# -- --ack-token -------------------------------------------------------------------------


@pytest.mark.parametrize(("token", "state", "reason"), [
    ("DONE-zq9", "expired", "ack_token_missing"),  # the agent never says it
    ("ack in-", "acknowledged", "ack_token"),  # the scripted agent answers "ack in-…: …"
])
async def test_an_ack_token_steer_settles_when_its_turn_ends(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path,
    token: str, state: str, reason: str,
) -> None:
    async with session(app_server, tmp_path) as s:
        done = await steer_into_a_running_turn(s, workspace, "--text", "Say the token when you are done.",
                                               "--ack-token", token)
        reports = [e for e in s.events(Report) if e.detail.get("intent_id") == done.intent.id]
    assert (done.state, settled_by(done).reason) == (state, reason)
    assert [h.reason for h in done.history if h.kind == "evidence"][:1] == ["delivered"]  # the echo came first
    assert [r.finding for r in reports] == (["ack_token_missing"] if state == "expired" else [])
