"""The decision round on its own, with no socket, file or clock: observations are fed to
it, and what it hands its port to append and what it queues to carry out are read back.
And the daemon and replay both drive it."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import anyio
import pytest

from tillerman.controller.core import intent_requests
from tillerman.controller.core.facts import Observed
from tillerman.controller.core.round import Round
from tillerman.controller.core.supervisor import Step
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger import events as ev
from tillerman.ledger.events import OBSERVATION_KINDS, Envelope
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.decision import Action
from tillerman.rules.files import default_ruleset
from tillerman.rules.ruleset import ApprovalWaiting, Grant, Rule, TurnLong, TurnQuiet, build_ruleset

T0 = 1_000_000.0
#: A recorded session on which a built-in rule proposes an intent, and the policy decides it.
SESSION = Path(__file__).resolve().parents[2] / "fixtures" / "sessions" / "replay"
NUDGE = Rule(id="nudge", version=1, status="active", condition=TurnQuiet(for_seconds=60.0), action=Action.QUEUE,
             owner="ann", review_by=datetime.date(2099, 1, 1), text="go on")
RULES = build_ruleset((NUDGE,), (Grant(subject="rule:nudge", actions=frozenset({"queue"})),))


class Port:
    """The round's append: a ledger in memory, and each batch the round handed it."""

    def __init__(self) -> None:
        self.recorder = MemoryRecorder()
        self.batches: list[list[type]] = []

    def __call__(self, envelopes: list[Envelope]):
        self.batches.append([type(env.event) for env in envelopes])
        return self.recorder.append(envelopes).entries


def observation(event: ev.Event, at: float) -> Envelope:
    return Envelope(event_id=f"{type(event).__name__}:{event.thread_id}:{at}", event=event, source="appserver:x",
                    at=at)


def running_turn(rnd: Round, thread_id: str) -> None:
    rnd.record([observation(ev.ThreadStarted(thread_id=thread_id, cwd="/work"), T0),
                observation(ev.TurnStarted(thread_id=thread_id, turn_id="u1"), T0)], T0)


def test_a_rule_that_fires_is_appended_through_the_port_and_its_intent_decided_at_once():
    port = Port()
    rnd = Round(Projection(), Step(RULES, replay=False), port)
    running_turn(rnd, "T1")
    port.batches.clear()
    acted = []

    assert rnd.decide(["T1"], T0 + 30, act=acted.append).decisions == []  # quiet for 30 s: nothing fires
    assert port.batches == [] and acted == []

    decided = rnd.decide(["T1"], T0 + 61, act=acted.append)
    assert ev.IntentProposed in port.batches[0]  # the finding's intent, folded before the policy runs
    assert port.batches[1][0] is ev.DecisionRecorded  # then the decision about it, in its own append
    [(view, decision)] = decided.decisions
    assert view.intent.producer == "rule:nudge" and decision.action is Action.QUEUE
    assert acted == [decided.decisions]  # handed over as soon as recorded
    assert rnd.projection.intents[view.intent.id].last_decision == (decision.action, decision.reason)
    assert rnd.projection.seq == port.recorder.max_seq()  # it folded what the port returned
    assert rnd.take() == []  # no delivery waits: nothing to carry out


def test_an_unchanged_decision_is_returned_again_but_not_appended_again():
    port = Port()
    rnd = Round(Projection(), Step(RULES, replay=False), port)
    running_turn(rnd, "T1")
    first = rnd.decide(["T1"], T0 + 61)
    appended = len(port.batches)
    again = rnd.decide(["T1"], T0 + 62)
    assert len(port.batches) == appended
    assert [d for _, d in again.decisions] == [d for _, d in first.decisions]


def test_the_fold_queues_each_observation_for_the_deliveries_waiting_on_its_thread():
    port = Port()
    intent = intent_requests.propose(port.recorder, T0, thread_id="T1", mode="steer", text="hi", owner="ann",
                                     expected_turn="u1")
    waiting = {"T1": [intent]}
    rnd = Round(Projection().fold(port.recorder.read()), Step(RULES, replay=False), port,
                delivering=lambda thread_id: waiting.get(thread_id, []))

    running_turn(rnd, "T1")
    rnd.carry(intent.id, "the driver's own fact")
    rnd.record([observation(ev.TurnStarted(thread_id="T2", turn_id="u9"), T0 + 1)], T0 + 1)  # no delivery there
    rnd.record([observation(ev.TurnCompleted(thread_id="T1", turn_id="u1"), T0 + 2)], T0 + 2)

    taken = rnd.take()
    assert [(i, type(f)) for i, f in taken] == [(intent.id, Observed), (intent.id, str), (intent.id, Observed)]
    assert isinstance(taken[0][1].event, ev.TurnStarted) and taken[0][1].now == T0
    assert isinstance(taken[2][1].event, ev.TurnCompleted) and taken[2][1].now == T0 + 2
    assert rnd.take() == []  # taken once


def test_only_the_threads_judged_and_ready_have_their_intents_decided():
    port = Port()
    for thread_id in ("T1", "T2"):
        intent_requests.propose(port.recorder, T0, thread_id=thread_id, mode="queue", text="later", owner="ann")
    rnd = Round(Projection().fold(port.recorder.read()), Step(RULES, replay=False), port)

    def threads(decided):
        return sorted(view.intent.thread_id for view, _ in decided.decisions)

    assert threads(rnd.decide(["T1"], T0)) == ["T1"]
    assert threads(rnd.decide([], T0, every_intent=True, ready=lambda t: t == "T2")) == ["T2"]
    assert threads(rnd.decide([], T0, every_intent=True)) == ["T1", "T2"]


class Reviews:
    """Checkpoints as the round sees them: two due, what it was asked, in order."""

    reviewers = {"script": object()}

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.noted: list[type] = []

    def note(self, entry) -> None:
        self.noted.append(type(entry.envelope.event))

    def consequences(self, projection, ruleset, now):
        self.asked.append("consequences")
        return []

    def due(self, projection, views, ruleset, now):
        self.asked.append("due")
        return ["answered now", "asked later"]

    def next_due(self, views, ruleset):
        return T0 + 500


def test_checkpoints_answered_at_once_are_recorded_and_acted_on_the_others_returned():
    port = Port()
    reviews = Reviews()
    rnd = Round(Projection(), Step(RULES, replay=False), port, reviews=reviews)
    answer = ev.Report(thread_id="T1", turn_id=None, rule_id="r", rule_version=1, finding="answered",
                       ruleset_digest="d", detail={})

    decided = rnd.decide(["T1"], T0, answer=lambda job: [observation(answer, T0)] if job == "answered now" else None)

    assert decided.jobs == ["asked later"]
    assert reviews.asked == ["consequences", "due", "consequences"]  # what the answer leads to, at once
    assert reviews.noted == [ev.Report]  # the answer folded through the port
    assert rnd.next_due(T0) == T0 + 500  # the second overdue moment is a due


def test_with_no_answer_the_checkpoints_wait_for_the_driver():
    reviews = Reviews()
    rnd = Round(Projection(), Step(RULES, replay=False), Port(), reviews=reviews)
    assert rnd.decide(["T1"], T0).jobs == ["answered now", "asked later"]
    assert reviews.asked == ["consequences", "due"]


def test_the_daemon_and_replay_drive_the_same_round(tmp_path, monkeypatch):
    """Each driver's decisions go through ``Round.decide``: the daemon's round and replay's."""
    drove: list[Round] = []
    decide = Round.decide

    def spied(self, *args, **kwargs):
        drove.append(self)
        return decide(self, *args, **kwargs)

    monkeypatch.setattr(Round, "decide", spied)
    replayer = Replayer(MemoryRecorder(), default_ruleset())
    assert replayer.run([str(SESSION)]).decisions == 1
    assert isinstance(replayer.round, Round) and replayer.round in drove

    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        daemon = Daemon(recorder, RULES, DaemonOptions(), clock=time.time)

        async def one_round() -> None:
            async with anyio.create_task_group() as tg:
                daemon._due = daemon.clock()
                await daemon._think(tg, [observation(ev.ThreadStarted(thread_id="T1"), T0)])

        anyio.run(one_round)
    assert isinstance(daemon.round, Round) and daemon.round in drove


def _report_rule(rule_id: str, condition) -> Rule:
    return Rule(id=rule_id, version=1, status="active", condition=condition, action=Action.REPORT_OVERDUE,
                owner="ann", review_by=datetime.date(2099, 1, 1), text=rule_id)


#: Rules that only report, each firing on the recorded sessions between their events
#: (a timer) as well as at them: what they find does not depend on who carries it out.
REPORTING = build_ruleset((_report_rule("quiet", TurnQuiet(for_seconds=3.0)),
                           _report_rule("long", TurnLong(for_seconds=20.0)),
                           _report_rule("approval", ApprovalWaiting(for_seconds=2.0))), ())


def _reports(rows) -> list[tuple[str, float]]:
    return [(e.envelope.event_id, e.envelope.at) for e in rows if isinstance(e.envelope.event, ev.Report)]


@pytest.mark.parametrize("session", ["appserver-trace/steer-approval-interrupt.jsonl",
                                     "codex-rollout/rollout-2025-09-02T10-00-00-0199a1b2-0000-7000-8000-00000000aa01.jsonl"])
def test_the_same_observations_give_the_same_findings_through_the_daemon_and_replay(tmp_path, session):
    """A recorded session replayed, and its observations handed to a daemon one round per
    event on a clock at the event's time (with a round at every due in between, as the
    daemon's brain sleeps until one): the same reports, at the same moments (each found
    by a timer, between two events)."""
    session = SESSION.parent / session
    replayed = MemoryRecorder()
    Replayer(replayed, REPORTING).run([str(session)])
    observations = [e.envelope for e in replayed.read() if ev.kind_of(e.envelope.event) in OBSERVATION_KINDS]
    assert _reports(replayed.read())  # the rules found something to compare

    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        think_each(recorder, REPORTING, observations)
        assert _reports(recorder.read()) == _reports(replayed.read())


def think_each(recorder, ruleset, rows) -> None:
    """Hand ``rows`` to a daemon one round each, on a clock at each row's time, firing
    the timers that fall due between rows first: the daemon's side of a replay."""
    now = [rows[0].at]
    daemon = Daemon(recorder, ruleset, DaemonOptions(), clock=lambda: now[0])

    async def rounds() -> None:
        async with anyio.create_task_group() as tg:
            for env in rows:
                while daemon._due is not None and daemon._due <= env.at:
                    now[0] = daemon._due
                    await daemon._think(tg, [])
                now[0] = env.at
                await daemon._think(tg, [env])

    anyio.run(rounds)
