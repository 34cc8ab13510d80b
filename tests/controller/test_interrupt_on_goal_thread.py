"""A plain interrupt on a thread whose Codex goal is active keeps its meaning (one turn),
and its record says the work goes on: the machine is told the thread's goal with every
observation (``Observed.goal_active``, from the projection) and after a restart
(``Reconcile.goal_active``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.controller.test_delivery import NOW, THREAD, TURN, Run, make_intent
from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests as lib
from tillerman.controller.core.commands import Interrupt, QueueList, ResumeQueue
from tillerman.controller.core.facts import Observed, Reconcile, Replied
from tillerman.ledger.events import Envelope, TurnCompleted, TurnStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.codex_wire import InterruptAccepted, QueueEntry, QueuePage


def _interrupted(goal_active: bool) -> Observed:
    return Observed(TurnCompleted(thread_id=THREAD, turn_id=TURN, status="interrupted"), NOW + 5,
                    goal_active=goal_active)


def _accepted(run: Run) -> None:
    [interrupt] = run.dispatch().commands
    assert isinstance(interrupt, Interrupt)
    run.feed(Replied(interrupt, InterruptAccepted(), NOW + 1))


@pytest.mark.parametrize(("goal_active", "evidence"), [
    (True, {"turn_id": TURN, "turn_status": "interrupted", "goal_active": True}),
    (False, {"turn_id": TURN, "turn_status": "interrupted"}),  # as it always was
])
def test_the_acknowledgement_says_whether_the_goal_goes_on(goal_active: bool, evidence: dict) -> None:
    run = Run(make_intent("interrupt"))
    _accepted(run)
    run.feed(_interrupted(goal_active))
    acknowledged = run.history("transition")[-1]
    assert (acknowledged.state, acknowledged.reason, acknowledged.evidence) == (
        State.ACKNOWLEDGED, "turn_interrupted", evidence)


def test_a_restart_that_finds_the_turn_interrupted_says_it_too() -> None:
    run = Run(make_intent("interrupt"))
    _accepted(run)
    run.machine = run.rebuilt()
    run.feed(Reconcile(NOW + 6, expected_turn_state="interrupted", goal_active=True))
    assert run.history("transition")[-1].evidence["goal_active"] is True


@pytest.mark.parametrize("goal_active", [True, False])
def test_resuming_the_paused_queue_of_a_goal_thread_says_it_resumes_the_goal(goal_active: bool) -> None:
    run = Run(make_intent("interrupt", resume_queue=True))
    _accepted(run)
    output = run.feed(_interrupted(goal_active))
    [queue_list] = [c for c in output.commands if isinstance(c, QueueList)]
    resumed = run.feed(Replied(queue_list, QueuePage((QueueEntry("q1", "tui-1"),)), NOW + 6))
    assert [type(c) for c in resumed.commands] == [ResumeQueue]
    [paused] = [h.evidence for h in run.history("evidence") if h.reason == "queue_paused"]
    assert paused.get("resumes_goal") is (True if goal_active else None)


def _ledger_with_interrupt(path, goal_active: bool) -> None:
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=TurnStarted(thread_id="T1", turn_id="U1"), source="appserver:x",
                             at=1.0)])
        intent = lib.propose(rec, thread_id="T1", mode="interrupt", text="not this turn", expected_turn="U1",
                             owner="ann", now=2.0)
        lib.transition(rec, intent.id, State.DISPATCH_UNKNOWN, "dispatching", {"attempt": "a1"}, at=3.0)
        lib.transition(rec, intent.id, State.ACKNOWLEDGED, "turn_interrupted",
                       {"turn_id": "U1", "turn_status": "interrupted"} | ({"goal_active": True} if goal_active else {}),
                       at=4.0)


@pytest.mark.parametrize("goal_active", [True, False])
def test_the_report_counts_interrupts_whose_goal_went_on_and_warns(tmp_path, goal_active: bool) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    _ledger_with_interrupt(ledger, goal_active)
    report = CliRunner().invoke(main, ["report", "--json", "--ledger", str(ledger)])
    figure = json.loads(report.output)["goals"]["interrupts_goal_went_on"]
    assert (figure["value"], figure["events"]) == (int(goal_active), 1)
    text = CliRunner().invoke(main, ["report", "--ledger", str(ledger)]).output
    assert ("warning: the agent worked on after these interrupts" in text) is goal_active
