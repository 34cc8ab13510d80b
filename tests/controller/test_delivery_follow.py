"""A steer that follows the active turn (``--expected-turn active``): the retarget rule of
the delivery machine, driven with values alone (docs/goals.md "Steering a moving target").

The rule: a send names the turn running at send time, if the intent may follow to it (the
turn its proposal named, or one that started after the proposal); a ``stale_turn`` /
``no_active_turn`` refusal waits for the next turn instead of rejecting; every new send
has its own durable record; nothing is ever sent to a turn the server refused it for, and
a send of unknown outcome is never followed by another.
"""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.controller.test_delivery import NOW, THREAD, TURN, Run, echo, make_intent, transition, turn, turns_page
from tillerman.controller.core.boundary import judge
from tillerman.controller.core.commands import Output, ReadBack, Steer
from tillerman.controller.core.delivery import dispatch_record, target_turn
from tillerman.controller.core.facts import Dispatch, NoAnswer, Observed, Reconcile, Refused, Replied
from tillerman.controller.core.reconcile import reconcile_fact
from tillerman.controller.core.rpc_errors import Refusal
from tillerman.ledger.events import (
    AgentMessage,
    Entry,
    Envelope,
    IntentEvidence,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)
from tillerman.ledger.intent_states import State
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.monitor.codex_wire import SteerAccepted
from tillerman.rules.ruleset import Grant, RuleSet

OLD, T2, T3 = "turn-0", "turn-2", "turn-3"
AFTER = NOW + 0.5  # a turn that started after the proposal (made at NOW)


def following(expected_turn_id: str | None = TURN, **fields):
    return msgspec.structs.replace(make_intent(follows_active=True, **fields), expected_turn_id=expected_turn_id)


def dispatch(run: Run, active: str | None = TURN, started: float | None = NOW - 1, attempt: str = "a1") -> Output:
    return run.feed(Dispatch(NOW + 0.1, attempt, active, started))


def stale(steer: Steer, at: float = NOW + 0.2, refusal: Refusal = Refusal.STALE_TURN) -> Refused:
    return Refused(steer, refusal, {"expected_turn_id": steer.expected_turn_id}, at)


def turn_now(active: str | None, started: float | None, at: float = NOW + 1, attempt: str | None = "r1",
             held_by: str | None = None) -> Reconcile:
    return Reconcile(at, active_turn=active, active_turn_started_at=started, held_by=held_by, attempt=attempt)


def evidence(output: Output) -> list[str]:
    return [e.event.reason for e in output.envelopes if isinstance(e.event, IntentEvidence)]


def test_the_first_send_names_the_turn_running_at_send_time():
    run = Run(following())
    out = dispatch(run)
    [steer] = out.commands
    assert out.durable and steer.expected_turn_id == TURN
    assert transition(out).evidence["target_turn"] == TURN


def test_between_turns_or_with_only_an_older_turn_running_nothing_is_sent():
    run = Run(following(expected_turn_id=None))
    assert dispatch(run, active=None, started=None) == Output()
    assert dispatch(run, active=OLD, started=NOW - 5) == Output()  # started before the proposal
    assert run.ledger_state() == "proposed"
    [steer] = dispatch(run, active=T2, started=AFTER).commands
    assert steer.expected_turn_id == T2


def test_a_refusal_for_a_turn_that_ended_waits_and_the_next_turn_gets_one_new_send():
    run = Run(following())
    [first] = dispatch(run).commands
    waiting = run.feed(stale(first))
    assert evidence(waiting) == ["retarget_waiting"] and waiting.commands == ()
    assert run.ledger_state() == "dispatch_unknown" and run.machine.expected_turn is None
    out = run.feed(turn_now(T2, AFTER))
    [second] = out.commands
    assert out.durable and second.expected_turn_id == T2 and second.attempt == "r1"
    [record] = [e.event for e in out.envelopes]
    assert (record.reason, record.evidence["from_turn"], record.evidence["to_turn"], record.evidence["why"]) == (
        "retargeted", TURN, T2, "stale_turn")
    assert run.feed(turn_now(T3, AFTER + 1, attempt="r2")) == Output()  # one send outstanding
    run.feed(Replied(second, SteerAccepted(T2), NOW + 2))
    assert transition(run.feed(echo(run.intent, turn_id=T2))).reason == "echo"
    assert run.ledger_state() == "acknowledged"


def test_a_refusal_naming_the_running_turn_sends_there_though_the_fold_lags_behind():
    """A goal thread's turns last tens of milliseconds; a loaded daemon's fold can lag many
    turns behind, and a send to the fold's running turn is refused again and again (300
    times in a minute, seen live). The refusal names the server's running turn: newer than
    the refused one, so the next send names it, rebuilt from the ledger too."""
    run = Run(following())
    [first] = dispatch(run).commands
    run.feed(Refused(first, Refusal.STALE_TURN, {"expected_turn_id": TURN, "found_turn_id": T3}, NOW + 0.2))
    [rebuilt_send] = run.rebuilt().handle(turn_now(T2, AFTER, attempt="r0")).commands
    assert rebuilt_send.expected_turn_id == T3  # what the ledger kept of the refusal
    [second] = run.feed(turn_now(OLD, NOW - 5)).commands  # the fold's turn: older than the proposal
    assert second.expected_turn_id == T3
    # refused for it too, naming no running turn: the fold's running turn, by the rule
    run.feed(Refused(second, Refusal.NO_ACTIVE_TURN, {}, NOW + 2))
    assert run.feed(turn_now(OLD, NOW - 5, attempt="r3")) == Output()
    [third] = run.feed(turn_now(T2, AFTER, attempt="r4")).commands
    assert third.expected_turn_id == T2


def test_the_echo_counts_only_in_the_turn_the_current_send_named():
    run = Run(following())
    [first] = dispatch(run).commands
    run.feed(stale(first))
    assert evidence(run.feed(echo(run.intent, turn_id=TURN))) == ["echo_in_other_turn"]
    run.feed(turn_now(T2, AFTER))
    assert evidence(run.feed(echo(run.intent, turn_id=T3, item_id="other"))) == ["echo_in_other_turn"]
    assert run.ledger_state() == "dispatch_unknown"


def test_no_new_send_to_a_refused_turn_an_older_turn_under_a_hazard_or_without_a_token():
    run = Run(following())
    [first] = dispatch(run, active=TURN, started=NOW - 1).commands
    run.feed(stale(first, refusal=Refusal.NO_ACTIVE_TURN))
    for fact in (turn_now(TURN, NOW - 1),  # the ledger still shows the refused turn running
                 turn_now(OLD, NOW - 9),  # an older turn
                 turn_now(None, None),  # between turns
                 turn_now(T2, AFTER, held_by="approval_pending"),
                 turn_now(T2, AFTER, attempt=None)):  # a fact that may not send (a dry run, a restart's)
        assert run.feed(fact) == Output(), fact
    assert run.sent(Steer) == [first]


def test_past_expires_at_the_waiting_steer_is_rejected_with_the_last_refusal():
    run = Run(following())
    [first] = dispatch(run).commands
    run.feed(stale(first))
    move = transition(run.feed(turn_now(T2, AFTER, at=run.intent.expires_at)))
    assert (move.to_state, move.reason) == ("rejected", "stale_turn")
    run2 = Run(following())
    [first] = dispatch(run2).commands
    assert transition(run2.feed(stale(first, at=run2.intent.expires_at))).reason == "stale_turn"


def test_an_unknown_outcome_is_never_followed_by_another_send():
    run = Run(following())
    [first] = dispatch(run).commands
    run.feed(NoAnswer(first, "timeout", NOW + 1))
    assert run.feed(turn_now(T2, AFTER)) == Output()
    [readback] = run.feed(Observed(TurnCompleted(thread_id=THREAD, turn_id=TURN), NOW + 2)).commands
    assert isinstance(readback, ReadBack) and readback.turn_id == TURN
    assert run.sent(Steer) == [first]


def test_a_refusal_of_an_older_send_is_evidence_only():
    run = Run(following())
    [first] = dispatch(run).commands
    run.feed(stale(first))
    [second] = run.feed(turn_now(T2, AFTER)).commands
    late = run.feed(stale(first, at=NOW + 3))  # the first send's refusal, seen again
    assert evidence(late) == ["Steer_refused"] and run.machine.expected_turn == T2


def test_a_named_turn_keeps_its_strict_meaning():
    run = Run(make_intent())
    [steer] = run.feed(Dispatch(NOW, "a1", T2, AFTER)).commands
    assert steer.expected_turn_id == TURN  # not the running turn
    assert transition(run.feed(stale(steer))).reason == "stale_turn"
    assert run.feed(turn_now(T2, AFTER)) == Output()


def test_a_rebuilt_machine_knows_the_current_send_and_the_refused_turns():
    run = Run(following())
    [first] = dispatch(run).commands
    run.feed(stale(first))
    rebuilt = run.rebuilt()
    assert rebuilt.expected_turn is None and target_turn(run.view()) is None
    assert rebuilt.handle(turn_now(TURN, NOW - 1)) == Output()  # refused once: never again
    run.machine = rebuilt
    [second] = run.feed(turn_now(T2, AFTER)).commands
    again = run.rebuilt()
    assert again.expected_turn == T2 == target_turn(run.view())
    assert dispatch_record(run.view()) == (second.attempt, T2)
    [readback] = again.handle(Reconcile(NOW + 5, expected_turn_state="completed")).commands
    assert readback.turn_id == T2


def test_the_boundary_lets_only_the_latest_record_send():
    run = Run(following(producer="owner:ann"))
    [first] = dispatch(run).commands
    run.feed(stale(first))
    [second] = run.feed(turn_now(T2, AFTER)).commands
    ruleset = RuleSet(rules=(), grants=(Grant(subject="owner:ann", actions=frozenset({"steer"})),), digest="d")
    snapshot = ThreadSnapshot(thread_id=THREAD, steerable=True, active_turn_id=T2)
    assert judge(second, run.view(), snapshot, ruleset, NOW + 2).refusal is None
    assert judge(first, run.view(), snapshot, ruleset, NOW + 2).refusal is not None  # an older record's send


# -- the property: against a server whose turns keep moving --------------------------------


@st.composite
def schedules(draw):
    """Turns that start and end while the steer is under way: each step is the server's
    active turn at the moment a send arrives (None: between turns), and whether the
    machine's fact for that moment may send (a token, no hazard)."""
    return draw(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 6)), st.booleans()), min_size=1,
                         max_size=25))


@given(schedules(), st.integers(0, 6))
@settings(max_examples=300, deadline=None)
def test_against_moving_turns_it_lands_at_most_once_and_never_on_an_older_or_refused_turn(schedule, proposal_turn):
    """Turn n started at NOW + n - 3: turns 0..2 started before the proposal, ``proposal_turn``
    is the one it named. The server accepts a steer only for its active turn."""
    def started(n: int) -> float:
        return NOW + n - 3

    run = Run(following(expected_turn_id=f"t{proposal_turn}"))
    accepted: list[str] = []
    refused: set[str] = set()
    for step, (active_n, may_send) in enumerate(schedule):
        active = None if active_n is None else f"t{active_n}"
        at = started(active_n) if active_n is not None else None
        now = NOW + 10 + step
        if run.ledger_state() == "proposed":
            out = run.feed(Dispatch(now, f"a{step}", active, at))
        elif run.ledger_state() == "dispatch_unknown":
            out = run.feed(Reconcile(now, active_turn=active, active_turn_started_at=at,
                                     attempt=f"a{step}" if may_send else None))
        else:
            break
        for command in out.commands:
            assert isinstance(command, Steer) and out.durable
            assert command.expected_turn_id not in refused, "sent again to a turn it was refused for"
            n = int(command.expected_turn_id[1:])
            assert n == proposal_turn or started(n) >= run.intent.created_at, "sent to an older turn"
            assert dispatch_record(run.view()) == (command.attempt, command.expected_turn_id)
            if command.expected_turn_id == active:  # the server takes it
                accepted.append(command.expected_turn_id)
                run.feed(Replied(command, SteerAccepted(active), now))
                run.feed(echo(run.intent, turn_id=active))
            else:
                refused.add(command.expected_turn_id)
                run.feed(stale(command, at=now, refusal=Refusal.STALE_TURN if active else Refusal.NO_ACTIVE_TURN))
    assert len(accepted) <= 1
    assert (run.ledger_state() == State.ACKNOWLEDGED) == bool(accepted)
    if accepted:
        landed = [h for h in run.history("transition") if h.state == State.ACKNOWLEDGED]
        assert landed[0].evidence["turn_id"] == accepted[0]


def test_the_driver_fact_names_the_running_turn_and_holds_for_another_writers_input():
    run = Run(following())
    [first] = dispatch(run).commands
    run.feed(stale(first))
    projection = run.record.projection
    for seq, event in enumerate((TurnStarted(thread_id=THREAD, turn_id=T2),
                                 UserMessage(thread_id=THREAD, turn_id=T2, digest="d", size=1, item_id="m1"),
                                 AgentMessage(thread_id=THREAD, turn_id=T2, digest="d", size=1, item_id="a1"),
                                 UserMessage(thread_id=THREAD, turn_id=T2, digest="d", size=1, item_id="m2")),
                                start=100):
        projection.apply(Entry(seq=seq, envelope=Envelope(event_id=f"e{seq}", event=event, source="appserver:ws",
                                                          at=AFTER), prev_hash="", hash=""))
    fact = reconcile_fact(projection, run.view(), NOW + 1, "r1")
    assert (fact.active_turn, fact.active_turn_started_at, fact.held_by) == (T2, AFTER, "other_writer_input")
    assert run.feed(fact) == Output()
    assert reconcile_fact(projection, run.view(), NOW + 1).attempt is None  # a restart's reconcile sends nothing


def test_a_crash_between_the_retarget_record_and_its_send_never_sends_twice():
    run = Run(following())
    [first] = dispatch(run).commands
    run.feed(stale(first))
    out = run.feed(turn_now(T2, AFTER))  # the record is durable; the process dies before the send
    assert out.durable and len(out.commands) == 1
    rebuilt = run.rebuilt()
    assert rebuilt.expected_turn == T2
    assert rebuilt.handle(turn_now(T3, AFTER + 1, attempt="r2")) == Output()  # its outcome is unknown: no resend
    [readback] = rebuilt.handle(Reconcile(NOW + 5, expected_turn_state="completed")).commands
    assert isinstance(readback, ReadBack) and readback.turn_id == T2
    run.machine = rebuilt
    move = transition(run.feed(Replied(readback, turns_page(turn(T2)), NOW + 6)))
    assert (move.to_state, move.reason) == ("expired", "not_delivered")
