"""Reviews in the whole daemon, beside a harness on the REAL Codex app-server (0.171.0 by default).

A stall rule with ``review = "script"`` fires on a quiet command; the scripted reviewer (a
small Python script) sends its steer on to the gate, and when the turn that took it ends,
returns it to the executor with a correction. The correction becomes a queue intent of
``reviewer:script``: with that reviewer's grant it reaches the model through the normal
delivery; the same recommendation without the grant is refused at the adapter.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fixtures.codex_server import AppServer, held_command, watched_connection
from fixtures.rule_texts import grant, reviewer, rule
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import SETTLED, reached_model, session, wait_until
from tillerman.controller.core import intent_requests
from tillerman.controller.core.boundary import Unauthorized
from tillerman.controller.core.commands import QueueAdd
from tillerman.controller.dispatch.adapter import GuardedAdapter
from tillerman.ledger.events import ReviewCommitted
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.config import load_effective

pytestmark = [pytest.mark.live, pytest.mark.anyio]

REVIEWED_STALL = rule("stall", owner="tests", review_by="2027-06-01", condition={"kind": "turn_quiet", "for": "1s"},
                      action="steer", text="zq-steer-41: turn {turn_id} was quiet", review="script")
CORRECTION = "zq-correction-41: run the test suite before you finish"


def _reviewer_script(tmp_path: Path) -> Path:
    """Gate answers ``ready``; the first review of an ended turn returns it with one
    correction, a later one says it took effect; a rescue (the rule firing again on a
    loaded machine) goes to the owner."""
    reviews = tmp_path / "reviews-asked"
    path = tmp_path / "reviewer.py"
    path.write_text(f"""import json, sys
packet = json.load(sys.stdin)
kind = packet["checkpoint"]
ready = {{"disposition": "ready_for_existing_gate", "reason": "the quiet command supports it", "confidence": 0.7}}
if kind == "review":
    with open({str(reviews)!r}, "a") as seen:
        seen.write("x")
    first = open({str(reviews)!r}).read() == "x"
    answer = {{"disposition": "return_to_executor", "reason": "no test run is on record", "confidence": 0.8,
              "required_corrections": [{{"correction": {CORRECTION!r}, "proof": "pytest exits 0"}}]}} if first else ready
elif kind == "before_dispatch":
    answer = ready
else:
    answer = {{"disposition": "escalate_to_human", "reason": "it stalled again", "confidence": 0.5}}
print(json.dumps(answer))
""")
    return path


def _effective(tmp_path: Path, *, reviewer_grant: bool):
    script = _reviewer_script(tmp_path)
    config = reviewer("script", [sys.executable, str(script)]) + grant("rule:stall", ["steer"], threads="*")
    if reviewer_grant:
        config += grant("reviewer:script", ["queue"], threads="*")
    (tmp_path / "rules.toml").write_text(REVIEWED_STALL)
    (tmp_path / "config.toml").write_text(config)
    return load_effective(tmp_path / "rules.toml", tmp_path / "config.toml")


async def steer_taken(s, turn: str, gate: Path):
    """The stall rule's steer on ``turn`` once the server took it; then the held command
    (``held_command(gate)``) is let go, so that the turn ends with the steer in it, however
    long the rule's quiet window, the review and the dispatch took on a loaded machine."""
    def stall_intent():
        return next((v for v in s.projection().intents.values()
                     if v.intent.producer == "rule:stall" and v.intent.expected_turn_id == turn), None)

    steer = await wait_until(stall_intent, "the stall rule to propose its steer")
    await s.wait_state(steer.intent.id, {"queued", "action_started"} | SETTLED, timeout=60.0)
    gate.touch()
    return steer


async def test_a_reviewers_correction_is_carried_out_through_the_normal_guards_and_refused_without_a_grant(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    effective = _effective(tmp_path, reviewer_grant=True)
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(effective.ruleset, reviewers=effective.reviewers)
        gate = workspace / "release"
        thread, turn = await s.start_command(workspace, held_command(gate))
        steer = await steer_taken(s, turn, gate)
        await s.wait_state(steer.intent.id, SETTLED | {"action_started"})
        assert await s.turn_completed(thread, turn) == "completed"

        def recommended():
            return next((v for v in s.projection().intents.values() if v.intent.producer == "reviewer:script"), None)

        correction = await wait_until(recommended, "the review to return the turn with a correction", timeout=90.0)
        assert correction.intent.mode == "queue" and CORRECTION in correction.intent.text
        done = await s.wait_state(correction.intent.id, SETTLED, timeout=30.0)
        assert done.state == State.ACKNOWLEDGED  # queued, and its turn started
        await wait_until(lambda: reached_model(scripted_model, "zq-correction-41"), "the correction to reach the model")

        said = {(c.checkpoint, c.disposition) for c in s.events(ReviewCommitted)}
        assert {("before_dispatch", "ready_for_existing_gate"), ("review", "return_to_executor")} <= said
        assert s.sent("thread/queue/add")  # through the normal delivery
        assert reached_model(scripted_model, "zq-steer-41") >= 1  # the rule's own steer, after its review

        # The same recommendation from a reviewer without a grant: refused at the adapter.
        (tmp_path / "ungranted").mkdir()
        ungranted = _effective(tmp_path / "ungranted", reviewer_grant=False)
        ledger = SQLiteRecorder(tmp_path / "adapter.sqlite3")
        async with watched_connection(app_server.url, client_name="adapter") as (client, _):
            again = intent_requests.propose(ledger, thread_id=thread, mode="queue", text=correction.intent.text,
                                            producer="reviewer:script", owner=correction.intent.owner)
            intent_requests.transition(ledger, again.id, State.DISPATCH_UNKNOWN, "dispatching",
                                       {"attempt": "attempt-1", "mode": "queue"}, durable=True)
            add = QueueAdd(intent_id=again.id, thread_id=thread, client_user_message_id=again.client_user_message_id,
                           text=again.delivered_text, attempt="attempt-1")
            with pytest.raises(Unauthorized):
                await GuardedAdapter(client, ledger, ungranted.ruleset, timeout=5.0).execute(add)
            GuardedAdapter(client, ledger, effective.ruleset, timeout=5.0).check(add)  # control: the grant passes
        ledger.close()
        assert len(s.sent("thread/queue/add")) == 1  # the adapter's refusal sent nothing


async def test_a_reviewers_correction_without_its_grant_is_never_sent(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    effective = _effective(tmp_path, reviewer_grant=False)
    before = reached_model(scripted_model, "zq-correction-41")  # one model serves the module's tests
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(effective.ruleset, reviewers=effective.reviewers)
        gate = workspace / "release"
        thread, turn = await s.start_command(workspace, held_command(gate))
        await steer_taken(s, turn, gate)
        assert await s.turn_completed(thread, turn) == "completed"

        def recommended():
            return next((v for v in s.projection().intents.values() if v.intent.producer == "reviewer:script"), None)

        correction = await wait_until(recommended, "the review to return the turn with a correction", timeout=90.0)
        done = await s.wait_state(correction.intent.id, SETTLED)
        assert (done.state, done.last_decision) == (State.REJECTED, ("escalate", "no_grant"))
        assert s.sent("thread/queue/add") == []
    assert reached_model(scripted_model, "zq-correction-41") == before
