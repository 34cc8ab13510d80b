"""Reviews wired into the daemon: an intent of a rule with ``review = "NAME"`` waits for its
review, a failure of any kind holds it and ends it ``rejected: review_failed``, caps and
repeated checkpoints spend nothing more, probes grade the reviewer, and a reviewer's
recommendation becomes an intent of its own. The reviewer is a small Python script; the
daemon runs without an app-server, so a dispatch is seen as the ``Dispatch`` fact it hands
to the intent's delivery task."""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import anyio
import msgspec
import pytest

from tests.controller.test_reviewer import GOOD, answering, script
from tillerman.controller.core import intent_requests
from tillerman.controller.core.facts import Dispatch
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.controller.review.checkpoints import is_reviewer_thread
from tillerman.ledger.events import Envelope, ReviewCommitted, ReviewPending, ThreadStarted, TurnCompleted, TurnStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.decision import Action
from tillerman.rules.review import Reviewer, checkpoint_id
from tillerman.rules.ruleset import Grant, Rule, TurnQuiet, build_ruleset

QUEUE_RULE = Rule(id="nudge", version=1, status="active", condition=TurnQuiet(for_seconds=3600.0),
                  action=Action.QUEUE, owner="ann", review_by=datetime.date(2099, 1, 1), text="go on",
                  review="script")


def ruleset(*grants: Grant):
    return build_ruleset((QUEUE_RULE,), (Grant(subject="rule:nudge", actions=frozenset({"queue"})), *grants))


def _ledger(path: Path, *, turn_ends: bool = False) -> str:
    """A thread with a running turn and one queue intent the rule ``nudge`` proposed."""
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=ThreadStarted(thread_id="T1", cwd="/work"), source="appserver:x",
                             at=1.0),
                    Envelope(event_id="u", event=TurnStarted(thread_id="T1", turn_id="u1"), source="appserver:x",
                             at=time.time())])  # the rule's hour of quiet is far off
        intent = intent_requests.propose(rec, thread_id="T1", mode="queue", text="go on", owner="ann",
                                         producer="rule:nudge", rule_id="nudge", rule_version=1)
        return intent.id


class Run:
    """A daemon on the ledger until ``until`` holds; the dispatches it handed over."""

    def __init__(self, path: Path, rules, reviewers: tuple[Reviewer, ...], *, clock=time.time) -> None:
        self.path, self.dispatched = path, []  # each round hands it again: no adapter takes it
        self.recorder = SQLiteRecorder(path)
        self.daemon = Daemon(self.recorder, rules, DaemonOptions(reviewers=reviewers), clock=clock)
        drive = self.daemon._drive

        def recording(tg, intent_id, fact):
            if isinstance(fact, Dispatch):
                self.dispatched.append(intent_id)
            drive(tg, intent_id, fact)

        self.daemon._drive = recording

    def until(self, done, timeout: float = 20.0, settle: float = 0.3) -> None:
        async def run():
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tg:
                    await tg.start(self.daemon.run)
                    while not done():
                        await anyio.sleep(0.05)
                    await anyio.sleep(settle)  # a round more: nothing else may follow
                    tg.cancel_scope.cancel()

        try:
            anyio.run(run)
        finally:
            self.recorder.close()

    def state(self, intent_id: str) -> State:
        return self.daemon.projection.intents[intent_id].state

    def events(self, kind):
        with SQLiteRecorder(self.path, readonly=True) as reader:
            return [e.envelope.event for e in reader.read() if isinstance(e.envelope.event, kind)]


def committed(run: Run) -> list[ReviewCommitted]:
    return run.events(ReviewCommitted)


def test_a_ready_answer_hands_the_intent_to_the_gate_and_it_is_dispatched(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    run = Run(path, ruleset(), (answering(tmp_path, GOOD),))
    run.until(lambda: run.dispatched)
    assert set(run.dispatched) == {intent_id}
    [done] = committed(run)
    assert done.checkpoint == "before_dispatch" and done.disposition == "ready_for_existing_gate"
    assert len(run.events(ReviewPending)) == 1


def test_the_intent_is_not_dispatched_while_its_review_runs_and_other_intents_go_on(tmp_path):
    """The review runs off the decision path: while it runs, the reviewed intent waits and
    a person's intent on another thread is decided and dispatched."""
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t2", event=ThreadStarted(thread_id="T2"), source="appserver:x", at=1.0)])
        other = intent_requests.propose(rec, thread_id="T2", mode="queue", text="and then", owner="ann")
    marker = tmp_path / "asked"
    slow = script(tmp_path, f"""
        open({str(marker)!r}, 'w').write('asked'); sys.stdin.read(); time.sleep(2)
        print(json.dumps({GOOD!r}))
    """)
    run = Run(path, ruleset(Grant(subject="owner:ann", actions=frozenset({"queue"}))), (slow,))
    seen_while_asking = []

    def done():
        if marker.exists() and not committed_in(run):
            seen_while_asking.append(set(run.dispatched))
        return intent_id in run.dispatched

    run.until(done)
    assert seen_while_asking and all(intent_id not in seen for seen in seen_while_asking)
    assert other.id in seen_while_asking[-1]  # decided and handed on while the review ran
    assert set(run.dispatched) == {intent_id, other.id}


def test_a_review_is_necessary_never_sufficient_without_the_rules_grant(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    no_grant = build_ruleset((QUEUE_RULE,), ())
    run = Run(path, no_grant, (answering(tmp_path, GOOD),))
    run.until(lambda: intent_id in run.daemon.projection.intents and run.state(intent_id) != State.PROPOSED)
    assert run.dispatched == [] and run.state(intent_id) == State.REJECTED


FAILURES = {
    "timeout": ("sys.stdin.read(); time.sleep(30)", {"timeout": 0.5}),
    "crash": ("sys.stdin.read(); os.kill(os.getpid(), 9)", {}),
    "nonzero_exit": ("sys.stdin.read(); sys.exit(3)", {}),
    "malformed_json": ("sys.stdin.read(); print('{\"disposition\": ')", {}),
    "illegal_disposition": ("sys.stdin.read(); print(json.dumps({'disposition': 'continue_with_directive',"
                            " 'reason': 'r', 'confidence': 1, 'recommended_action': 'queue', 'text': 't'}))", {}),
    "authority_language": ("sys.stdin.read(); print(json.dumps({'disposition': 'ready_for_existing_gate',"
                           " 'reason': 'approved, cleared to merge', 'confidence': 1}))", {}),
}


@pytest.mark.parametrize("why", sorted(FAILURES))
def test_each_failure_holds_the_intent_and_rejects_it(tmp_path, why, caplog):
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    body, keys = FAILURES[why]
    run = Run(path, ruleset(), (script(tmp_path, body, **keys),))
    run.until(lambda: intent_id in run.daemon.projection.intents and run.state(intent_id) == State.REJECTED)
    assert run.dispatched == []
    view = run.daemon.projection.intents[intent_id]
    assert [h.reason for h in view.history if h.kind == "transition"][-1] == "review_failed"
    held = [h for h in view.history if h.kind == "evidence" and h.reason == "review_held"]
    assert held and held[0].evidence["outcome"] == f"review_failed:{why}"
    assert intent_id in caplog.text and "failed closed" in caplog.text  # reported for its owner


def test_an_oversize_packet_holds_the_intent_without_a_call(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=ThreadStarted(thread_id="T1"), source="appserver:x", at=1.0)])
        intent_id = intent_requests.propose(rec, thread_id="T1", mode="queue", text="x " * 7000, owner="ann",
                                            producer="rule:nudge", rule_id="nudge", rule_version=1).id
    marker = tmp_path / "called"
    run = Run(path, ruleset(), (script(tmp_path, f"open({str(marker)!r}, 'w').write('yes')\n"),))
    run.until(lambda: intent_id in run.daemon.projection.intents and run.state(intent_id) == State.REJECTED)
    assert not marker.exists() and run.dispatched == []
    [done] = committed(run)
    assert done.outcome == "review_failed:packet_refused"


def test_a_hold_answer_keeps_the_intent_proposed_and_undispatched(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    hold = {"disposition": "hold", "reason": "the tests are still running", "confidence": 0.6}
    run = Run(path, ruleset(), (answering(tmp_path, hold),))
    run.until(lambda: committed_in(run) and any(h.reason == "review_held" for h in history(run, intent_id)))
    assert run.dispatched == [] and run.state(intent_id) == State.PROPOSED
    assert "says hold" in caplog.text


def committed_in(run: Run) -> bool:
    return any(c.committed for c in run.daemon.checkpoints.reviews.checkpoints.values())


def history(run: Run, intent_id: str):
    view = run.daemon.projection.intents.get(intent_id)
    return view.history if view else []


def test_an_interrupted_call_is_not_asked_again_and_the_intent_is_rejected(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    with SQLiteRecorder(path) as rec:  # a daemon died between pending and committed
        turn = intent_requests.intent_view(rec, intent_id).intent.expected_turn_id
        rec.append([Envelope(event_id="p", source="tillerman:reviewer", at=3.0, event=ReviewPending(
            thread_id="T1", checkpoint_id=checkpoint_id("before_dispatch", intent_id, turn), checkpoint="before_dispatch",
            reviewer="script", intent_id=intent_id))])
    counter = tmp_path / "calls"
    run = Run(path, ruleset(), (script(tmp_path, f"open({str(counter)!r}, 'a').write('call')\n"),))
    run.until(lambda: intent_id in run.daemon.projection.intents and run.state(intent_id) == State.REJECTED)
    assert not counter.exists() and run.dispatched == []
    assert [c.outcome for c in committed(run)] == ["review_interrupted"]


def test_a_spent_cap_escalates_without_a_call(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    counter = tmp_path / "calls"
    capped = script(tmp_path, f"open({str(counter)!r}, 'a').write('call')\n", max_per_thread_per_hour=0)
    run = Run(path, ruleset(), (capped,))
    run.until(lambda: intent_id in run.daemon.projection.intents and run.state(intent_id) == State.REJECTED)
    assert not counter.exists()
    assert [c.outcome for c in committed(run)] == ["review_capped"]
    assert run.events(ReviewPending) == []  # nothing spent
    assert "escalated to its owner" in caplog.text


def test_a_spent_daily_budget_holds_the_next_review_without_a_call_after_a_restart(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite3"
    first_intent = _ledger(path)
    counter = tmp_path / "calls"
    dear = script(tmp_path, f"""
        open({str(counter)!r}, 'a').write('call'); sys.stdin.read(); print(json.dumps({GOOD!r} | {{'cost_usd': 2.5}}))
    """, budget_usd_per_day=2.0)
    first = Run(path, ruleset(), (dear,))
    first.until(lambda: first.dispatched)
    with SQLiteRecorder(path) as rec:  # the same rule fires on another thread
        rec.append([Envelope(event_id="t2", event=ThreadStarted(thread_id="T2", cwd="/work"), source="appserver:x",
                             at=time.time()),
                    Envelope(event_id="u2", event=TurnStarted(thread_id="T2", turn_id="u2"), source="appserver:x",
                             at=time.time())])
        second_intent = intent_requests.propose(rec, thread_id="T2", mode="queue", text="go on", owner="ann",
                                                producer="rule:nudge", rule_id="nudge", rule_version=1).id
    second = Run(path, ruleset(), (dear,))  # a restart: the day's spend is read back from the ledger
    second.until(lambda: second_intent in second.daemon.projection.intents
                 and second.state(second_intent) == State.REJECTED)
    assert counter.read_text() == "call"  # the reviewer was asked once, for the first intent only
    assert second_intent not in second.dispatched
    assert [(c.intent_id, c.outcome, c.cost_usd) for c in committed(second)] == [
        (first_intent, "accepted", 2.5), (second_intent, "review_failed:budget", None)]
    assert "spent 2.5000 USD today (UTC), budget_usd_per_day 2" in caplog.text


def test_a_recorded_checkpoint_is_answered_from_the_ledger_after_a_restart(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    counter = tmp_path / "calls"
    counting = script(tmp_path, f"""
        open({str(counter)!r}, 'a').write('call'); sys.stdin.read(); print(json.dumps({GOOD!r}))
    """)
    first = Run(path, ruleset(), (counting,))
    first.until(lambda: first.dispatched)
    second = Run(path, ruleset(), (counting,))  # no adapter took it: still proposed, decided again
    second.until(lambda: second.dispatched, settle=1.0)
    assert set(second.dispatched) == {intent_id}  # on the recorded answer
    assert counter.read_text() == "call"  # one call, however often the daemon starts
    assert len(second.events(ReviewPending)) == 1


def test_a_known_bad_probe_follows_a_streak_and_a_reviewer_that_passes_it_is_flagged(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=ThreadStarted(thread_id="T1"), source="appserver:x", at=1.0)])
        for n in range(2):  # two gate answers in a row already on record
            rec.append([Envelope(event_id=f"c{n}", source="tillerman:reviewer", at=2.0 + n, event=ReviewCommitted(
                thread_id="T1", checkpoint_id=f"before_dispatch:old{n}@-", checkpoint="before_dispatch",
                reviewer="script", outcome="accepted", disposition="ready_for_existing_gate"))])
    intent_id = _ledger(path)
    always_ready = answering(tmp_path, GOOD, probe_every=2)
    run = Run(path, ruleset(), (always_ready,))
    run.until(lambda: run.dispatched and run.daemon.checkpoints.reviews.probes_let_through("script"))
    assert set(run.dispatched) == {intent_id}  # the probe itself is never dispatched
    probes = [p for p in run.events(ReviewPending) if p.probe]
    assert len(probes) == 1 and probes[0].intent_id is None
    assert "known-bad calibration probe" in caplog.text
    from click.testing import CliRunner

    from tillerman.controller.cli.main import main
    shown = CliRunner().invoke(main, ["status", "--ledger", str(path), "--json"])
    assert list(json.loads(shown.output)["flagged_reviewers"]) == ["script"]
    shown = CliRunner().invoke(main, ["status", "--ledger", str(path)])
    assert "reviewer script FLAGGED" in shown.output


def test_a_threads_started_in_a_reviewers_home_is_never_supervised(tmp_path):
    reviewer = Reviewer(name="r", command=("true",), home=str(tmp_path / "home"))
    assert is_reviewer_thread(str(tmp_path / "home" / "work"), [reviewer])
    assert is_reviewer_thread("/tmp/tillerman-reviewer-abc123", [])
    assert not is_reviewer_thread(str(tmp_path / "homework"), [reviewer])
    assert not is_reviewer_thread(None, [reviewer])


def test_a_reviewers_own_thread_is_skipped_by_the_daemon(tmp_path):
    """A quiet turn on the reviewer's own thread would fire the rule; it is never judged."""
    path = tmp_path / "ledger.sqlite3"
    home = tmp_path / "reviewer-home"
    quiet = msgspec.structs.replace(QUEUE_RULE, condition=TurnQuiet(for_seconds=1.0))
    rules = build_ruleset((quiet,), ())
    with SQLiteRecorder(path) as rec:
        for thread, cwd in (("OWN", str(home)), ("USER", "/work")):
            rec.append([Envelope(event_id=f"t{thread}", event=ThreadStarted(thread_id=thread, cwd=cwd),
                                 source="appserver:x", at=1.0),
                        Envelope(event_id=f"u{thread}", event=TurnStarted(thread_id=thread, turn_id="u1"),
                                 source="appserver:x", at=2.0)])
    run = Run(path, rules, (Reviewer(name="script", command=("true",), home=str(home)),))
    run.until(lambda: run.daemon.projection.intents)
    threads = {v.intent.thread_id for v in run.daemon.projection.intents.values()}
    assert threads == {"USER"}


@pytest.mark.parametrize("granted", [True, False])
def test_a_turn_that_ended_is_reviewed_and_a_correction_becomes_the_reviewers_intent(tmp_path, granted):
    """``review``: the intent was taken and its turn ended; ``return_to_executor`` queues the
    corrections as an intent of ``reviewer:script``: its own grant lets it through, and
    without one it is refused like anyone's (the rule's grant is not lent to it)."""
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    answers = tmp_path / "answers"
    answers.write_text(json.dumps({"before_dispatch": GOOD, "review": {
        "disposition": "return_to_executor", "reason": "the tests were not run", "confidence": 0.8,
        "required_corrections": [{"correction": "run the tests", "proof": "pytest exits 0"}]}}))
    reviewer = script(tmp_path, f"""
        packet = json.load(sys.stdin)
        print(json.dumps(json.load(open({str(answers)!r}))[packet['checkpoint']]))
    """)
    rules = ruleset(*[Grant(subject="reviewer:script", actions=frozenset({"queue"}))] * granted)
    run = Run(path, rules, (reviewer,))
    run.until(lambda: run.dispatched)
    with SQLiteRecorder(path) as rec:  # the server took it, and the turn that took it ended
        intent = run.daemon.projection.intents[intent_id].intent
        rec.append([intent_requests.transition_envelope(intent, State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching"),
                    intent_requests.transition_envelope(intent, State.DISPATCH_UNKNOWN, State.ACKNOWLEDGED, "echo"),
                    Envelope(event_id="end", event=TurnCompleted(thread_id="T1", turn_id="u1"),
                             source="appserver:x", at=time.time())])
    run = Run(path, rules, (reviewer,))

    def recommended():
        return [v for v in run.daemon.projection.intents.values() if v.intent.producer == "reviewer:script"]

    run.until(lambda: run.dispatched if granted else any(v.state != State.PROPOSED for v in recommended()))
    [recommended] = recommended()
    if granted:
        assert set(run.dispatched) == {recommended.intent.id}
    else:
        assert run.dispatched == [] and recommended.state == State.REJECTED
        assert recommended.last_decision == ("escalate", "no_grant")
    assert recommended.intent.mode == "queue" and "run the tests (proof: pytest exits 0)" in recommended.intent.text
    assert [c.checkpoint for c in committed(run)] == ["before_dispatch", "review"]


def test_a_turn_whose_end_was_folded_before_the_acknowledgment_is_still_reviewed(tmp_path):
    """The delivery machine records the echo once its round committed, so the turn's end
    may be folded first, while the intent is still ``queued``: that end offered nothing to
    review, and the acknowledgment naming the ended turn must bring the review (before, it
    never came: seen live under load)."""
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    reviewer = by_checkpoint(tmp_path, {"before_dispatch": GOOD, "review": {
        "disposition": "return_to_executor", "reason": "the tests were not run", "confidence": 0.8,
        "required_corrections": [{"correction": "run the tests", "proof": "pytest exits 0"}]}})
    rules = ruleset(Grant(subject="reviewer:script", actions=frozenset({"queue"})))
    run = Run(path, rules, (reviewer,))
    run.until(lambda: run.dispatched)
    intent = run.daemon.projection.intents[intent_id].intent
    with SQLiteRecorder(path) as rec:  # accepted; then the turn ends before the echo is on record
        rec.append([intent_requests.transition_envelope(intent, State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching"),
                    intent_requests.transition_envelope(intent, State.DISPATCH_UNKNOWN, State.QUEUED, "accepted"),
                    Envelope(event_id="end", event=TurnCompleted(thread_id="T1", turn_id="u1"),
                             source="appserver:x", at=time.time())])
    run = Run(path, rules, (reviewer,))
    acknowledged = []

    def reviewed() -> bool:
        checkpoints = run.daemon.checkpoints  # its round took the turn's end, with nothing to review yet
        if not acknowledged and run.daemon.projection.snapshot("T1").turn_state("u1") == "completed" \
                and not checkpoints.ended_turns and intent_id in checkpoints.by_thread.get("T1", ()):
            with SQLiteRecorder(path) as rec:
                rec.append([intent_requests.transition_envelope(intent, State.QUEUED, State.ACKNOWLEDGED, "echo",
                                                                {"turn_id": "u1", "item_id": "i9"})])
            acknowledged.append(True)
        return any(v.intent.producer == "reviewer:script" for v in run.daemon.projection.intents.values())

    run.until(reviewed)
    assert [c.checkpoint for c in committed(run)] == ["before_dispatch", "review"]


def by_checkpoint(tmp_path: Path, answers: dict, **keys) -> Reviewer:
    """A reviewer answering each checkpoint its own way."""
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(answers))
    return script(tmp_path, f"""
        packet = json.load(sys.stdin)
        print(json.dumps(json.load(open({str(path)!r}))[packet['checkpoint']]))
    """, **keys)


DIRECTIVE = {"disposition": "continue_with_directive", "recommended_action": "queue", "confidence": 0.7,
             "text": "Read the failing test before changing the code again.", "reason": "two failures in this turn"}
REVIEWER_MAY_QUEUE = Grant(subject="reviewer:script", actions=frozenset({"queue"}))


def test_a_rule_firing_twice_on_a_turn_is_a_rescue_whose_directive_replaces_its_second_intent(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    _ledger(path)
    with SQLiteRecorder(path) as rec:  # the rule fired again on the same turn
        again = intent_requests.propose(rec, thread_id="T1", mode="queue", text="go on", owner="ann",
                                        producer="rule:nudge", rule_id="nudge", rule_version=1,
                                        intent_id="in-000000000000000000aa")
    run = Run(path, ruleset(REVIEWER_MAY_QUEUE), (by_checkpoint(tmp_path, {"before_dispatch": GOOD,
                                                                             "rescue": DIRECTIVE}),))

    def recommended():
        return [v for v in run.daemon.projection.intents.values() if v.intent.producer == "reviewer:script"]

    run.until(lambda: any(i in run.dispatched for i in (v.intent.id for v in recommended())))
    [rescue] = [c for c in committed(run) if c.checkpoint == "rescue"]
    assert rescue.intent_id == again.id and rescue.disposition == "continue_with_directive"
    assert again.id not in run.dispatched and run.state(again.id) == State.EXPIRED  # superseded, never sent
    [directive] = recommended()
    assert directive.intent.text == DIRECTIVE["text"] and directive.intent.supersedes == again.id


def test_an_intent_overdue_for_the_second_time_is_reviewed(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=ThreadStarted(thread_id="T1"), source="appserver:x", at=1.0)])
        late = intent_requests.propose(rec, now=time.time() - 10, thread_id="T1", mode="queue", text="go on",
                                       owner="ann", producer="rule:nudge", rule_id="nudge", rule_version=1,
                                       ack_deadline=2.0)  # due 8 s ago, and again 6 s ago
    hold = {"disposition": "hold", "reason": "wait for the build", "confidence": 0.5}
    run = Run(path, ruleset(REVIEWER_MAY_QUEUE), (by_checkpoint(tmp_path, {"before_dispatch": hold,
                                                                             "overdue": DIRECTIVE}),))
    run.until(lambda: any(c.committed and c.checkpoint == "overdue"
                          for c in run.daemon.checkpoints.reviews.checkpoints.values())
              and run.state(late.id) != State.PROPOSED)
    assert late.id not in run.dispatched  # held at before_dispatch, then superseded
    [directive] = [v for v in run.daemon.projection.intents.values() if v.intent.producer == "reviewer:script"]
    assert directive.intent.supersedes == late.id
    assert sorted(c.checkpoint for c in committed(run)) == ["before_dispatch", "overdue"]


# -- replay ------------------------------------------------------------------------------------------

STALL_ROLLOUT = (Path(__file__).resolve().parents[2] / "fixtures" / "sessions" / "replay"
                 / "rollout-2026-10-19T22-00-00-0199b000-0000-7000-8000-00000000bb01.jsonl")


def _replay_files(tmp_path: Path, reviewer_body: str) -> tuple[Path, Path]:
    """The built-in rules with ``review = "script"`` on the repeated-failure rule (the
    rollout makes it fire once), and a config with that reviewer and the rule's grant."""
    from fixtures.rule_texts import grant, reviewer
    defaults = (Path(__file__).resolve().parents[2] / "rules" / "defaults.toml").read_text()
    rules = tmp_path / "rules.toml"
    rules.write_text(defaults.replace('id = "repeated-failure"\n', 'id = "repeated-failure"\nreview = "script"\n'))
    body = tmp_path / "reviewer.py"
    body.write_text("import json, sys\n" + reviewer_body)
    config = tmp_path / "config.toml"
    config.write_text(reviewer("script", [sys.executable, str(body)])
                      + grant("rule:repeated-failure", ["steer"], threads="*"))
    return rules, config


def replay_json(*args) -> dict:
    from click.testing import CliRunner

    from tillerman.controller.cli.main import main
    result = CliRunner().invoke(main, ["replay", "--json", "--jobs", "1", *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_replay_holds_a_new_checkpoint_without_a_call_and_asks_it_with_review(tmp_path):
    calls = tmp_path / "calls"
    escalate = {"disposition": "escalate_to_human", "reason": "still failing", "confidence": 0.5}
    rules, config = _replay_files(tmp_path, f"open({str(calls)!r}, 'a').write('call')\n"
                                            f"answers = {{'before_dispatch': {GOOD!r}, 'overdue': {escalate!r}}}\n"
                                            "print(json.dumps(answers[json.load(sys.stdin)['checkpoint']]))\n")
    held = replay_json("--rules", rules, "--config", config, STALL_ROLLOUT)
    # the replayed steer is never sent, so it also comes to be overdue for the second time
    assert held["reviews"] == {"before_dispatch": {"held": 1}, "overdue": {"held": 1}} and not calls.exists()
    ledger = tmp_path / "asked.sqlite3"
    asked = replay_json("--rules", rules, "--config", config, "--review", "--ledger", ledger, STALL_ROLLOUT)
    answered = {"before_dispatch": {"ready_for_existing_gate": 1}, "overdue": {"escalate_to_human": 1}}
    assert asked["reviews"] == answered and calls.read_text() == "callcall"
    assert asked["decisions_digest"] == held["decisions_digest"]  # replay dispatches nothing either way
    again = replay_json("--rules", rules, "--config", config, "--review", ledger)  # the answers on record are used
    assert again["reviews"] == answered and calls.read_text() == "callcall"


def test_replay_without_reviewers_shows_no_reviews():
    assert "reviews" not in replay_json(STALL_ROLLOUT)


def _taken(path: Path, intent, turn: str) -> None:
    """The server took the intent and the turn that took it ended."""
    with SQLiteRecorder(path) as rec:
        rec.append([intent_requests.transition_envelope(intent, State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching"),
                    intent_requests.transition_envelope(intent, State.DISPATCH_UNKNOWN, State.ACKNOWLEDGED, "echo"),
                    Envelope(event_id=f"start-{turn}", event=TurnStarted(thread_id="T1", turn_id=turn),
                             source="appserver:x", at=time.time()),
                    Envelope(event_id=f"end-{turn}", event=TurnCompleted(thread_id="T1", turn_id=turn),
                             source="appserver:x", at=time.time())])


def test_a_second_unresolved_return_to_executor_escalates_instead_of_asking_again(tmp_path, caplog):
    path = tmp_path / "ledger.sqlite3"
    intent_id = _ledger(path)
    returned = {"disposition": "return_to_executor", "reason": "the tests were not run", "confidence": 0.8,
                "required_corrections": [{"correction": "run the tests", "proof": "pytest exits 0"}]}
    # three calls on the intent: its gate and two reviews (the default cap of 2 would escalate the second)
    reviewer = by_checkpoint(tmp_path, {"before_dispatch": GOOD, "review": returned}, max_per_intent=3)
    rules = ruleset(REVIEWER_MAY_QUEUE)
    run = Run(path, rules, (reviewer,))
    run.until(lambda: run.dispatched)
    _taken(path, run.daemon.projection.intents[intent_id].intent, "u1")

    def recommended(run):
        return [v for v in run.daemon.projection.intents.values() if v.intent.producer == "reviewer:script"]

    run = Run(path, rules, (reviewer,))
    run.until(lambda: recommended(run))
    [correction] = recommended(run)
    _taken(path, correction.intent, "u2")  # the correction's turn ended: not resolved either

    run = Run(path, rules, (reviewer,))
    run.until(lambda: any(h.evidence.get("escalated") for h in history(run, intent_id)))
    assert [c.disposition for c in committed(run) if c.checkpoint == "review"] == ["return_to_executor"] * 2
    assert len(recommended(run)) == 1  # asked the owner, not the executor again
    assert "second unresolved return_to_executor" in caplog.text
