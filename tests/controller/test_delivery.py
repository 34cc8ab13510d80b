"""The delivery machine driven with values alone: facts in, envelopes and commands out.

No recorder and no SQLite: replies are the typed values ``tillerman.monitor.codex_wire``
reads, and every output goes into a fold of the machine's own record, which checks
what a ledger checks before it stores a move (it starts where the record stands; the
machine itself refuses a move outside the table).
"""

from __future__ import annotations

import subprocess
import sys
from itertools import count
from pathlib import Path

import pytest

from tillerman.controller.core.commands import (
    Interrupt,
    ListTerminals,
    Output,
    QueueAdd,
    QueueList,
    ReadBack,
    ResumeQueue,
    RunVerify,
    Steer,
    Terminate,
)
from tillerman.controller.core.delivery import Delivery, expect_matches
from tillerman.controller.core.facts import (
    Dispatch,
    NoAnswer,
    Observed,
    Reconcile,
    Refused,
    Replied,
    Tick,
    Verified,
    VerifyDue,
)
from tillerman.controller.core.intent_requests import proposal_envelopes
from tillerman.controller.core.rpc_errors import Refusal
from tillerman.ledger.events import (
    AgentMessage,
    Entry,
    Envelope,
    IntentEvidence,
    IntentTransition,
    ItemCompleted,
    ItemStarted,
    Report,
    TurnCompleted,
    UserMessage,
)
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent, intent_id_from, text_digest
from tillerman.ledger.projections import IntentView, Projection
from tillerman.monitor.codex_wire import (
    InterruptAccepted,
    QueuedSubmission,
    QueueEntry,
    QueuePage,
    SteerAccepted,
    Terminal,
    TerminalList,
    Terminated,
    Turn,
    TurnItem,
    TurnPage,
)

THREAD, TURN, NEXT_TURN = "thread-1", "turn-1", "turn-2"
NOW = 1_000.0
_ids = count()


def make_intent(mode: str = "steer", **fields) -> Intent:
    text = fields.pop("text", "run the linter first")
    return Intent(
        id=intent_id_from("test", mode, next(_ids)), thread_id=THREAD, mode=mode, text=text,
        text_digest=text_digest(text), created_at=NOW, ack_deadline=NOW + 120, expires_at=NOW + 1800,
        expected_turn_id=None if mode == "queue" else TURN, **fields,
    )


class Record:
    """The intent's record as the ledger folds it, kept in memory: an identical envelope
    offered twice is stored once (a changed one fails the test), and a transition must
    start from the state the record shows (another writer did not move it first)."""

    def __init__(self, envelopes: list[Envelope]):
        self.projection = Projection()
        self.stored: dict[str, Envelope] = {}
        self.append(envelopes)

    def append(self, envelopes) -> None:
        for envelope in envelopes:
            if envelope.event_id in self.stored:
                assert self.stored[envelope.event_id] == envelope, f"{envelope.event_id} recorded twice, changed"
                continue
            event = envelope.event
            if isinstance(event, IntentTransition):
                assert event.from_state == self.projection.intents[event.intent_id].state, event
            self.stored[envelope.event_id] = envelope
            self.projection.apply(Entry(seq=len(self.stored), envelope=envelope, prev_hash="", hash=""))

    def view(self, intent_id: str) -> IntentView:
        return self.projection.intents[intent_id]


class Run:
    """One machine and the record its outputs go into."""

    def __init__(self, intent: Intent):
        self.record = Record(proposal_envelopes(intent, Projection()))
        self.machine = Delivery(intent)
        self.outputs: list[Output] = []

    @property
    def intent(self) -> Intent:
        return self.machine.intent

    def feed(self, fact) -> Output:
        output = self.machine.handle(fact)
        self.record.append(output.envelopes)
        self.outputs.append(output)
        return output

    def dispatch(self, attempt: str = "a1") -> Output:
        return self.feed(Dispatch(NOW, attempt))

    def view(self) -> IntentView:
        return self.record.view(self.intent.id)

    def rebuilt(self) -> Delivery:
        """A machine rebuilt from the record, as after a restart."""
        return Delivery.from_view(self.view())

    def ledger_state(self) -> str:
        return self.view().state

    def history(self, kind: str | None = None):
        return [h for h in self.view().history if kind in (None, h.kind)]

    def sent(self, kind: type) -> list:
        return [c for o in self.outputs for c in o.commands if isinstance(c, kind)]


def echo(intent: Intent, turn_id: str = TURN, item_id: str = "item-echo") -> Observed:
    return Observed(UserMessage(thread_id=THREAD, turn_id=turn_id, digest="d", size=1,
                                client_id=intent.client_user_message_id, item_id=item_id), NOW + 2)


def turn_completed(status: str = "completed", turn_id: str = TURN) -> Observed:
    return Observed(TurnCompleted(thread_id=THREAD, turn_id=turn_id, status=status), NOW + 5)


def turns_page(*turns: Turn, next_cursor: str | None = None) -> TurnPage:
    return TurnPage(turns, next_cursor)


def turn(turn_id: str = TURN, status: str = "completed", *items: TurnItem) -> Turn:
    return Turn(turn_id, status, items)


def user_item(client_id: str | None, item_id: str = "item-echo") -> TurnItem:
    return TurnItem("userMessage", item_id, client_id)


def agent_item(text: str, item_id: str = "item-reply") -> TurnItem:
    return TurnItem("agentMessage", item_id, text=text)


def queue_page(*entries: tuple[str, str]) -> QueuePage:
    """Entries as (submission id, client id)."""
    return QueuePage(tuple(QueueEntry(entry_id, client_id) for entry_id, client_id in entries))


ACCEPTED = SteerAccepted(TURN)


def transition(output: Output) -> IntentTransition:
    [envelope] = [e for e in output.envelopes if isinstance(e.event, IntentTransition)]
    return envelope.event


# -- steer ----------------------------------------------------------------------------


def test_dispatch_is_a_durable_record_first_then_one_steer():
    run = Run(make_intent())
    out = run.dispatch("attempt-7")
    assert out.durable
    move = transition(out)
    assert (move.from_state, move.to_state, move.reason) == ("proposed", "dispatch_unknown", "dispatching")
    assert move.evidence["attempt"] == "attempt-7"
    assert out.commands == (Steer(intent_id=run.intent.id, thread_id=THREAD, expected_turn_id=TURN,
                                  client_user_message_id=run.intent.client_user_message_id,
                                  text=run.intent.delivered_text, attempt="attempt-7"),)
    assert run.intent.client_user_message_id == f"tillerman-{run.intent.id}"


def test_accepted_is_queued_and_only_the_echo_in_the_expected_turn_acknowledges():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    assert transition(run.feed(Replied(steer, ACCEPTED, NOW + 1))).to_state == "queued"
    run.feed(Tick(NOW + 10))  # time alone never moves an accepted steer
    assert run.ledger_state() == "queued"
    out = run.feed(echo(run.intent))
    move = transition(out)
    assert (move.from_state, move.to_state, move.reason) == ("queued", "acknowledged", "echo")
    assert move.evidence == {"turn_id": TURN, "item_id": "item-echo"}
    assert run.ledger_state() == "acknowledged"


def test_echo_before_reply_acknowledges_and_the_late_reply_is_evidence_not_a_refusal():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    assert transition(run.feed(echo(run.intent))).from_state == "dispatch_unknown"
    late = run.feed(Replied(steer, ACCEPTED, NOW + 3))
    [envelope] = late.envelopes
    assert isinstance(envelope.event, IntentEvidence)
    assert (envelope.event.state, envelope.event.reason) == ("acknowledged", "late_reply")
    second = run.feed(echo(run.intent, item_id="item-echo-2"))  # a second echo: evidence too
    assert [e.event.reason for e in second.envelopes] == ["echo"]
    assert run.ledger_state() == "acknowledged"


@pytest.mark.parametrize("cause", ["timeout", "disconnected", "unrecognized_error"])
def test_an_unknown_outcome_is_never_resent(cause):
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    out = run.feed(NoAnswer(steer, cause, NOW + 10))
    assert out.commands == () and [e.event.reason for e in out.envelopes] == [cause]
    assert run.ledger_state() == "dispatch_unknown"
    # Whatever comes next while the turn is active, nothing is sent again.
    for fact in (Dispatch(NOW + 11, "a2"), Tick(NOW + 5000), Reconcile(NOW + 12, expected_turn_state="active"),
                 VerifyDue(NOW + 13), NoAnswer(steer, cause, NOW + 14)):
        run.feed(fact)
    assert run.sent(Steer) == [steer]
    assert run.sent(ReadBack) == []
    assert run.ledger_state() == "dispatch_unknown"


def test_turn_end_while_dispatch_unknown_is_settled_by_readback_found():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    run.feed(NoAnswer(steer, "timeout", NOW + 10))
    [readback] = run.feed(turn_completed()).commands
    assert readback == ReadBack(intent_id=run.intent.id, thread_id=THREAD,
                                client_id=run.intent.client_user_message_id, turn_id=TURN)
    page = turns_page(turn(TURN, "completed", user_item(None, "u0"), user_item(run.intent.client_user_message_id)))
    move = transition(run.feed(Replied(readback, page, NOW + 11)))
    assert (move.to_state, move.reason, move.evidence["item_id"]) == ("acknowledged", "readback_found", "item-echo")


def test_turn_end_while_dispatch_unknown_with_our_id_absent_expires_not_delivered():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    run.feed(NoAnswer(steer, "disconnected", NOW + 10))
    [readback] = run.feed(turn_completed()).commands
    page = turns_page(turn(NEXT_TURN, "inProgress"), turn(TURN, "completed", user_item("someone-else")))
    move = transition(run.feed(Replied(readback, page, NOW + 11)))
    assert (move.to_state, move.reason, move.evidence["turn_status"]) == ("expired", "not_delivered", "completed")
    assert run.sent(Steer) == [steer]


def test_readback_pages_on_until_it_finds_the_turn():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    [readback] = run.feed(turn_completed()).commands
    [next_page] = run.feed(Replied(readback, turns_page(turn(NEXT_TURN), next_cursor="c2"), NOW + 6)).commands
    assert next_page.cursor == "c2" and next_page.turn_id == TURN
    page = turns_page(turn(TURN, "interrupted"))
    assert transition(run.feed(Replied(next_page, page, NOW + 7))).reason == "not_delivered"


def test_readback_of_a_turn_still_in_progress_settles_nothing():
    run = Run(make_intent())
    run.dispatch()
    readback = ReadBack(intent_id=run.intent.id, thread_id=THREAD, client_id=run.intent.client_user_message_id,
                        turn_id=TURN)
    assert run.feed(Replied(readback, turns_page(turn(TURN, "inProgress")), NOW + 6)) == Output()
    assert run.ledger_state() == "dispatch_unknown"


def test_accepted_steer_lost_when_its_turn_ends_expires_lost_after_accept_and_is_reported():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    run.feed(Replied(steer, ACCEPTED, NOW + 1))
    [readback] = run.feed(turn_completed("interrupted")).commands
    out = run.feed(Replied(readback, turns_page(turn(TURN, "interrupted", user_item(None))), NOW + 6))
    move = transition(out)
    assert (move.from_state, move.to_state, move.reason) == ("queued", "expired", "lost_after_accept")
    [report] = [e.event for e in out.envelopes if isinstance(e.event, Report)]
    assert report.finding == "lost_after_accept" and report.detail["intent_id"] == run.intent.id
    assert run.sent(Steer) == [steer]


def test_stale_turn_is_rejected_and_never_retried_against_the_newest_turn():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    refusal = Refused(steer, Refusal.STALE_TURN, {"expected_turn_id": TURN, "found_turn_id": NEXT_TURN}, NOW + 1)
    move = transition(run.feed(refusal))
    assert (move.to_state, move.reason, move.evidence["found_turn_id"]) == ("rejected", "stale_turn", NEXT_TURN)
    for fact in (Dispatch(NOW + 2, "a2"), Observed(TurnCompleted(thread_id=THREAD, turn_id=NEXT_TURN), NOW + 3),
                 Reconcile(NOW + 4, expected_turn_state="completed"), turn_completed()):
        run.feed(fact)
    assert run.sent(Steer) == [steer] and run.sent(ReadBack) == []
    assert run.ledger_state() == "rejected"


def test_echo_in_another_turn_does_not_acknowledge_a_steer():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    run.feed(Replied(steer, ACCEPTED, NOW + 1))
    out = run.feed(echo(run.intent, turn_id=NEXT_TURN))
    assert [e.event.reason for e in out.envelopes] == ["echo_in_other_turn"]
    assert run.ledger_state() == "queued"


def test_with_an_ack_token_the_echo_is_delivered_evidence_and_the_token_acknowledges():
    intent = make_intent()
    run = Run(Intent(**{**{f: getattr(intent, f) for f in intent.__struct_fields__}, "ack_token": intent.id}))
    [steer] = run.dispatch().commands
    run.feed(Replied(steer, ACCEPTED, NOW + 1))
    assert [e.event.reason for e in run.feed(echo(run.intent)).envelopes] == ["delivered"]
    assert run.ledger_state() == "queued"
    other = Observed(AgentMessage(thread_id=THREAD, turn_id=TURN, digest="d", size=1, ack_tokens=("in-x",)), NOW + 3)
    assert run.feed(other) == Output()
    token = Observed(AgentMessage(thread_id=THREAD, turn_id=TURN, digest="d", size=1, item_id="m1",
                                  ack_tokens=(run.intent.id,)), NOW + 4)
    assert transition(run.feed(token)).reason == "ack_token"


def _token_delivered(mode: str = "steer", token: str = "ACK-42") -> tuple[Run, str]:
    """An intent with an ack token whose echo arrived; returns the run and the echo's turn."""
    run = Run(make_intent(mode, ack_token=token))
    [first] = run.dispatch().commands
    if mode == "queue":
        [add] = run.feed(Replied(first, QueuePage(), NOW + 1)).commands
        run.feed(Replied(add, QueuedSubmission("q1"), NOW + 1))
    else:
        run.feed(Replied(first, ACCEPTED, NOW + 1))
    echo_turn = NEXT_TURN if mode == "queue" else TURN
    assert [e.event.reason for e in run.feed(echo(run.intent, turn_id=echo_turn)).envelopes] == ["delivered"]
    return run, echo_turn


@pytest.mark.parametrize("mode", ["steer", "queue"])
@pytest.mark.parametrize(("items", "state", "reason"), [
    ([agent_item("done, ACK-42")], "acknowledged", "ack_token"),
    ([agent_item("ok: will do")], "expired", "ack_token_missing"),
    ([], "expired", "ack_token_missing"),
])
def test_an_ack_token_intent_settles_when_the_turn_that_took_it_ends(mode, items, state, reason):
    run, echo_turn = _token_delivered(mode)
    [readback] = run.feed(turn_completed(turn_id=echo_turn)).commands
    assert readback == ReadBack(intent_id=run.intent.id, thread_id=THREAD, client_id=run.intent.client_user_message_id,
                                turn_id=echo_turn)
    history = turn(echo_turn, "completed", user_item(run.intent.client_user_message_id), *items)
    out = run.feed(Replied(readback, turns_page(history), NOW + 6))
    assert (transition(out).to_state, transition(out).reason) == (state, reason)
    assert run.ledger_state() == state
    reports = [e.event.finding for e in out.envelopes if isinstance(e.event, Report)]
    assert reports == (["ack_token_missing"] if reason == "ack_token_missing" else [])


def test_an_ack_token_said_before_our_message_or_while_the_turn_runs_settles_nothing():
    run, _ = _token_delivered()
    [readback] = run.feed(turn_completed()).commands
    early = turn(TURN, "inProgress", agent_item("ACK-42", "m0"), user_item(run.intent.client_user_message_id))
    assert run.feed(Replied(readback, turns_page(early), NOW + 6)).envelopes == ()
    assert run.ledger_state() == "queued"
    ended = turn(TURN, "interrupted", agent_item("ACK-42", "m0"), user_item(run.intent.client_user_message_id))
    assert transition(run.feed(Replied(readback, turns_page(ended), NOW + 7))).reason == "ack_token_missing"


def test_an_ack_token_in_a_retained_agent_message_acknowledges_at_once():
    run, _ = _token_delivered()
    said = Observed(AgentMessage(thread_id=THREAD, turn_id=TURN, digest="d", size=1, text="ACK-42 done"), NOW + 3)
    assert transition(run.feed(said)).reason == "ack_token"


def test_a_restart_after_the_token_turn_ended_reads_it_back():
    run, _ = _token_delivered()
    machine = run.rebuilt()
    out = machine.handle(Reconcile(NOW + 9, expected_turn_state="completed", echo_turn_id=TURN,
                                   echo_turn_state="completed"))
    assert [type(c) for c in out.commands] == [ReadBack] and out.envelopes == ()
    still_running = machine.handle(Reconcile(NOW + 9, "active", TURN, echo_turn_state="active"))
    assert still_running == Output()


def test_replayed_intent_is_rejected_without_any_command():
    run = Run(make_intent(replayed=True))
    out = run.dispatch()
    assert out.commands == () and transition(out).reason == "not_dispatchable"


# -- restart -------------------------------------------------------------------------------


def test_a_machine_rebuilt_from_the_ledger_reconciles_without_resending():
    run = Run(make_intent())
    run.dispatch()  # then the daemon dies before the transport answered
    rebuilt = run.rebuilt()
    assert rebuilt.state is State.DISPATCH_UNKNOWN
    assert rebuilt.handle(Dispatch(NOW + 1, "a2")) == Output()
    assert rebuilt.handle(Reconcile(NOW + 1, expected_turn_state="active")) == Output()
    [readback] = rebuilt.handle(Reconcile(NOW + 2, expected_turn_state="completed")).commands
    assert isinstance(readback, ReadBack) and readback.turn_id == TURN
    out = rebuilt.handle(Reconcile(NOW + 3, expected_turn_state="completed", echo_turn_id=TURN))
    assert transition(out).reason == "echo"


# -- queue -----------------------------------------------------------------------------------


def test_queue_lists_before_adding_and_is_acknowledged_when_its_turn_starts():
    run = Run(make_intent("queue"))
    out = run.dispatch()
    assert out.durable and out.commands == (QueueList(intent_id=run.intent.id, thread_id=THREAD),)
    [add] = run.feed(Replied(out.commands[0], queue_page(("q0", "other")), NOW + 1)).commands
    assert add == QueueAdd(intent_id=run.intent.id, thread_id=THREAD, text=run.intent.delivered_text, attempt="a1",
                           client_user_message_id=run.intent.client_user_message_id)
    accepted = run.feed(Replied(add, QueuedSubmission("q1"), NOW + 2))
    assert transition(accepted).evidence == {"queued_submission_id": "q1"}
    move = transition(run.feed(echo(run.intent, turn_id=NEXT_TURN)))
    assert (move.from_state, move.to_state, move.reason) == ("queued", "acknowledged", "queue_turn_started")


def test_queue_entry_already_there_is_not_added_again():
    run = Run(make_intent("queue"))
    [listing] = run.dispatch().commands
    entries = queue_page(("q7", run.intent.client_user_message_id))
    out = run.feed(Replied(listing, entries, NOW + 1))
    assert out.commands == ()
    assert transition(out).evidence == {"queued_submission_id": "q7", "found_in_queue": True, "copies": 1}
    assert run.sent(QueueAdd) == []
    # the delivery step runs again, and from a machine rebuilt from the ledger: still no add
    run.dispatch("a2")
    rebuilt = run.rebuilt()
    assert rebuilt.handle(Dispatch(NOW + 2, "a3")) == Output()
    assert rebuilt.handle(Replied(listing, QueuePage(), NOW + 3)) == Output()


def _queue_accepted(behind: str | None) -> Run:
    """A queue add dispatched while ``behind`` runs (None: an idle thread), accepted."""
    run = Run(make_intent("queue"))
    [listing] = run.feed(Dispatch(NOW, "a1", behind)).commands
    [add] = run.feed(Replied(listing, QueuePage(), NOW + 1)).commands
    run.feed(Replied(add, QueuedSubmission("q1"), NOW + 2))
    return run


@pytest.mark.parametrize(("behind", "ended", "reads_back"), [
    (None, NEXT_TURN, True),  # added to an idle thread: the turn it started ended, echo unseen
    (TURN, NEXT_TURN, True),  # the turn after the one it waited behind ended, echo unseen
    (TURN, TURN, False),  # the turn it waits behind ended: the server only now starts ours
])
def test_a_queued_message_whose_echo_went_by_unseen_is_read_back_when_a_turn_ends(behind, ended, reads_back):
    """After a reconnect the daemon subscribes to a thread at its `active` status, and the
    first items of the turn our accepted message started can go by before that resume:
    the turn's end is still seen, and it reads the turns back for our message."""
    run = _queue_accepted(behind)
    out = run.feed(turn_completed(turn_id=ended))
    if not reads_back:
        assert out == Output() and run.ledger_state() == "queued"
        return
    assert out.commands == (ReadBack(intent_id=run.intent.id, thread_id=THREAD,
                                     client_id=run.intent.client_user_message_id, turn_id=None),)
    found = run.feed(Replied(out.commands[0], turns_page(turn(NEXT_TURN, "completed", user_item(
        run.intent.client_user_message_id, "m"))), NOW + 6))
    move = transition(found)
    assert (move.from_state, move.to_state, move.reason) == ("queued", "acknowledged", "queue_turn_started")
    assert move.evidence == {"turn_id": NEXT_TURN, "item_id": "m", "via": "readback"}


def test_a_queued_message_seen_echoed_reads_nothing_back_at_its_turns_end():
    run = _queue_accepted(None)
    run.feed(echo(run.intent, turn_id=NEXT_TURN))
    assert run.feed(turn_completed(turn_id=NEXT_TURN)).commands == ()
    assert run.sent(ReadBack) == []


def _queue_add_lost(active_turn: str | None) -> tuple[Run, QueueAdd, Delivery]:
    """A queue add sent while ``active_turn`` runs, its reply lost; then a restart."""
    run = Run(make_intent("queue"))
    [listing] = run.feed(Dispatch(NOW, "a1", active_turn)).commands
    [add] = run.feed(Replied(listing, QueuePage(), NOW + 1)).commands
    run.feed(NoAnswer(add, "timeout", NOW + 11))
    return run, add, run.rebuilt()


def _read_back_queue(machine: Delivery, reconcile: Reconcile, entries: list, turns: TurnPage) -> Output:
    """Reconcile: the queue list first, then (our entry absent) the thread's turns."""
    [relist] = machine.handle(reconcile).commands
    listed = machine.handle(Replied(relist, QueuePage(tuple(entries)), reconcile.now))
    if not listed.commands:
        return listed
    [readback] = listed.commands
    assert isinstance(readback, ReadBack) and readback.turn_id is None
    return machine.handle(Replied(readback, turns, reconcile.now))


@pytest.mark.parametrize("active_turn", [TURN, None])
def test_queue_add_of_unknown_outcome_is_never_expired_by_its_ack_deadline(active_turn):
    """Past the ack deadline, absent from the queue and from every turn: still unknown (an
    add in flight may land; the overdue report says so). Then it lands, and is found."""
    run, add, rebuilt = _queue_add_lost(active_turn)
    past_deadline = NOW + 200
    absent = _read_back_queue(rebuilt, Reconcile(past_deadline), [], turns_page(turn(NEXT_TURN)))
    assert absent == Output() and rebuilt.state is State.DISPATCH_UNKNOWN
    assert transition(Output(run.outputs[0].envelopes)).evidence["behind_turn"] == active_turn
    mine = QueueEntry("q1", run.intent.client_user_message_id)
    found = _read_back_queue(rebuilt, Reconcile(past_deadline + 5), [mine], turns_page())
    assert (transition(found).to_state, transition(found).evidence["found_in_queue"]) == ("queued", True)
    assert rebuilt.handle(echo(run.intent, turn_id="turn-3")).envelopes[0].event.reason == "queue_turn_started"
    assert run.sent(QueueAdd) == [add]  # never added again


def test_queue_add_of_unknown_outcome_is_not_delivered_once_the_turn_it_waits_behind_ended():
    """The server drains its queue when the turn the add waits behind ends: from then on,
    absent from the queue and from every turn (none still running) means not delivered."""
    _, _, rebuilt = _queue_add_lost(TURN)
    running = _read_back_queue(rebuilt, Reconcile(NOW + 12, behind_turn_state="inProgress"), [], turns_page())
    assert running == Output()  # the turn it waits behind still runs: the add may be queued behind it
    ended = Reconcile(NOW + 20, behind_turn_state="completed")
    started = _read_back_queue(rebuilt, ended, [], turns_page(turn(NEXT_TURN, "inProgress"), turn(TURN)))
    assert started == Output()  # a turn it may have started is still running
    gone = _read_back_queue(rebuilt, ended, [], turns_page(turn(NEXT_TURN), turn(TURN)))
    move = transition(gone)
    assert (move.to_state, move.reason, move.evidence["behind_turn"]) == ("expired", "not_delivered", TURN)
    # the live machine learns that turn's end from the notification
    _, _, live = _queue_add_lost(TURN)
    assert _read_back_queue(live, Reconcile(NOW + 12), [], turns_page(turn(TURN))) == Output()
    live.handle(turn_completed(turn_id=TURN))
    assert transition(_read_back_queue(live, Reconcile(NOW + 13), [], turns_page(turn(TURN)))).reason \
        == "not_delivered"


def test_a_refused_list_before_the_add_rejects_the_intent():
    run = Run(make_intent("queue"))
    [listing] = run.dispatch().commands
    move = transition(run.feed(Refused(listing, Refusal.THREAD_NOT_FOUND, {}, NOW + 1)))
    assert (move.to_state, move.reason) == ("rejected", "thread_not_found")


# -- interrupt -------------------------------------------------------------------------------


def _started(item_id: str, turn_id: str) -> Observed:
    return Observed(ItemStarted(thread_id=THREAD, turn_id=turn_id, item_id=item_id,
                                item_type="commandExecution"), NOW)


def test_interrupt_terminates_only_the_interrupted_turns_processes():
    run = Run(make_intent("interrupt"))
    run.feed(_started("call-old", "turn-0"))
    run.feed(_started("call-ours", TURN))
    [interrupt] = run.dispatch().commands
    assert interrupt == Interrupt(intent_id=run.intent.id, thread_id=THREAD, turn_id=TURN, attempt="a1")
    assert transition(run.feed(Replied(interrupt, InterruptAccepted(), NOW + 1))).to_state == "queued"
    ended = run.feed(turn_completed("interrupted"))
    assert (transition(ended).to_state, transition(ended).reason) == ("acknowledged", "turn_interrupted")
    listing, queue = ended.commands
    assert isinstance(listing, ListTerminals) and isinstance(queue, QueueList)
    terminals = TerminalList((Terminal("call-old", "11"), Terminal("call-ours", "22")))
    out = run.feed(Replied(listing, terminals, NOW + 6))
    assert out.commands == (Terminate(intent_id=run.intent.id, thread_id=THREAD, process_id="22",
                                      item_id="call-ours", turn_id=TURN),)
    run.feed(Replied(out.commands[0], Terminated(True), NOW + 7))
    assert not run.machine.finished  # the process has not reported its exit yet
    run.feed(Observed(ItemCompleted(thread_id=THREAD, turn_id=TURN, item_id="call-ours",
                                    item_type="commandExecution", status="failed", exit_code=-1), NOW + 8))
    assert run.machine.finished
    evidence = [(h.reason, h.evidence) for h in run.history("evidence")]
    assert ("terminals_listed", {"listed": 2, "of_interrupted_turn": 1}) in evidence
    assert ("terminate_requested", {"process_id": "22", "item_id": "call-ours"}) in evidence
    assert ("terminated", {"process_id": "22", "item_id": "call-ours", "terminated": True}) in evidence
    assert ("late_item_completed", {"item_id": "call-ours", "status": "failed", "exit_code": -1}) in evidence
    assert run.feed(Replied(listing, terminals, NOW + 9)).commands == ()  # listed again: no second terminate


def test_a_listed_terminal_without_a_process_id_is_counted_and_never_terminated():
    """The wire reads a missing or garbled processId as absent: there is nothing to name."""
    run = Run(make_intent("interrupt"))
    run.feed(_started("call-ours", TURN))
    [interrupt] = run.dispatch().commands
    run.feed(Replied(interrupt, InterruptAccepted(), NOW + 1))
    listing, _ = run.feed(turn_completed("interrupted")).commands
    out = run.feed(Replied(listing, TerminalList((Terminal("call-ours"),)), NOW + 6))
    assert out.commands == ()
    assert [(e.event.reason, e.event.evidence) for e in out.envelopes] == [
        ("terminals_listed", {"listed": 1, "of_interrupted_turn": 0})]
    assert run.machine.finished


def test_interrupt_whose_turn_completed_on_its_own_is_lost_after_accept():
    run = Run(make_intent("interrupt"))
    [interrupt] = run.dispatch().commands
    run.feed(Replied(interrupt, InterruptAccepted(), NOW + 1))
    out = run.feed(turn_completed("completed"))
    assert transition(out).reason == "lost_after_accept" and out.commands == ()


def test_interrupt_acknowledged_by_the_turn_end_before_the_reply():
    run = Run(make_intent("interrupt"))
    [interrupt] = run.dispatch().commands
    assert transition(run.feed(turn_completed("interrupted"))).from_state == "dispatch_unknown"
    assert [e.event.reason for e in run.feed(Replied(interrupt, InterruptAccepted(), NOW + 6)).envelopes] == ["late_reply"]


@pytest.mark.parametrize("resume", [False, True])
def test_paused_queue_is_reported_and_resumed_only_when_asked(resume):
    run = Run(make_intent("interrupt", resume_queue=resume))
    [interrupt] = run.dispatch().commands
    run.feed(Replied(interrupt, InterruptAccepted(), NOW + 1))
    _, listing = run.feed(turn_completed("interrupted")).commands
    out = run.feed(Replied(listing, queue_page(("q1", "harness-1")), NOW + 6))
    [report] = [e.event for e in out.envelopes if isinstance(e.event, Report)]
    assert report.finding == "queue_paused" and report.detail["entries"] == 1
    assert out.commands == ((ResumeQueue(intent_id=run.intent.id, thread_id=THREAD),) if resume else ())
    assert run.feed(Replied(listing, QueuePage(), NOW + 7)) == Output()  # empty queue: nothing to say


# -- effects ---------------------------------------------------------------------------------


def _acknowledged(**fields) -> Run:
    run = Run(make_intent(effect_deadline=NOW + 600, **fields))
    [steer] = run.dispatch().commands
    run.feed(Replied(steer, ACCEPTED, NOW + 1))
    run.feed(echo(run.intent))
    return run


def test_expect_marks_the_action_started_and_verify_decides():
    run = _acknowledged(expect="item_type=commandExecution args_digest=sha256:abc", verify="test -f done")
    assert run.feed(VerifyDue(NOW + 3)).commands == ()  # not before the action started
    other = ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="i1", item_type="commandExecution",
                        args_digest="sha256:zzz")
    assert run.feed(Observed(other, NOW + 3)) == Output()
    match = ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="i2", item_type="commandExecution",
                        args_digest="sha256:abc")
    assert transition(run.feed(Observed(match, NOW + 4))).to_state == "action_started"
    [verify] = run.feed(turn_completed()).commands
    assert verify == RunVerify(intent_id=run.intent.id, thread_id=THREAD, command="test -f done")
    inconclusive = run.feed(Verified(None, NOW + 6, cwd_digest=WS, error="timeout")).envelopes
    assert [(e.event.reason, e.event.evidence) for e in inconclusive] == [
        ("verify_inconclusive", {"cwd_digest": WS, "error": "timeout"})]
    assert transition(run.feed(Verified(0, NOW + 7, cwd_digest=WS))).to_state == "effect_verified"


WS = "sha256:" + "ab" * 32  # the digest of the thread's working directory


@pytest.mark.parametrize(("verdict", "state", "reason", "evidence"), [
    (Verified(0, NOW + 4, cwd_digest=WS), "effect_verified", "verify_passed", {"exit_code": 0, "cwd_digest": WS}),
    (Verified(1, NOW + 4, cwd_digest=WS), "effect_failed", "verify_failed", {"exit_code": 1, "cwd_digest": WS}),
    # the path itself only when the adapter retains payloads
    (Verified(0, NOW + 4, cwd_digest=WS, cwd="/ws"), "effect_verified", "verify_passed",
     {"exit_code": 0, "cwd_digest": WS, "cwd": "/ws"}),
    # nobody could name the thread's directory: the check fails, nothing was guessed
    (Verified(None, NOW + 4, cwd_digest=None), "effect_failed", "cwd_unknown", {"exit_code": None}),
])
@pytest.mark.parametrize("expect", [None, "item_type=commandExecution"])
def test_the_verify_verdict_and_where_it_ran(verdict, state, reason, evidence, expect):
    run = _acknowledged(verify="test -f build/ok", expect=expect)
    if expect is not None:
        started = ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="i", item_type="commandExecution")
        assert transition(run.feed(Observed(started, NOW + 3))).to_state == "action_started"
    [verify] = run.feed(VerifyDue(NOW + 3)).commands
    move = transition(run.feed(verdict))
    assert (move.to_state, move.reason, move.evidence) == (state, reason, evidence)
    assert run.ledger_state() == state and run.machine.finished


def test_effect_deadline_passed_expires():
    run = _acknowledged(verify="true")
    assert run.feed(Tick(NOW + 599)) == Output()
    assert transition(run.feed(Tick(NOW + 600))).reason == "effect_deadline_passed"


@pytest.mark.parametrize(("expect", "matches"), [
    ("item_type=commandExecution", True),
    ("item_type=commandExecution tool=shell", False),
    ("args_digest=sha256:abc", True),
    ("command=sleep", False),  # unknown field: never matches
    ("commandExecution", False),
    ("", False),
])
def test_expect_predicate(expect, matches):
    event = ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="i", item_type="commandExecution",
                        args_digest="sha256:abc")
    assert expect_matches(expect, event) is matches


def test_a_queued_queue_intent_is_read_back_after_a_restart():
    """The turn our queued message started may have begun while the daemon was down."""
    intent = Intent(id="in-00000000000000000042", thread_id=THREAD, mode="queue", text="later",
                    text_digest="d", created_at=0.0, ack_deadline=10.0, expires_at=100.0)
    machine = Delivery(intent, State.QUEUED)
    out = machine.handle(Reconcile(now=50.0))
    (readback,) = out.commands
    assert isinstance(readback, ReadBack) and readback.turn_id is None
    missing = machine.handle(Replied(readback, TurnPage(), 51.0))
    assert missing == Output() and machine.state is State.QUEUED  # still waiting in the queue
    found = machine.handle(Replied(readback, turns_page(turn("t9", "completed", user_item(
        intent.client_user_message_id, "m"))), 52.0))
    assert machine.state is State.ACKNOWLEDGED
    assert found.envelopes[0].event.reason == "queue_turn_started"


def test_the_machine_refuses_a_move_outside_the_table_itself():
    """No ledger involved: an illegal move is the machine's own error, not the store's."""
    from tillerman.ledger.errors import IllegalTransition

    machine = Delivery(make_intent())
    with pytest.raises(IllegalTransition, match="cannot move from proposed to acknowledged"):
        machine._move(State.ACKNOWLEDGED, "echo", {}, NOW)
    assert machine.state == State.PROPOSED  # nothing moved


def test_a_reply_of_another_command_is_refused_as_the_callers_bug():
    run = Run(make_intent())
    [steer] = run.dispatch().commands
    with pytest.raises(TypeError, match="TurnPage is no reply to Steer"):
        run.machine.handle(Replied(steer, TurnPage(), NOW + 1))
    assert run.machine.state is State.DISPATCH_UNKNOWN


def test_these_tests_need_no_recorder_and_no_sqlite():
    """This file again, in an interpreter where SQLite and both recorder backends cannot
    be imported: the machine and its tests live on values alone."""
    blocked = ("sqlite3", "_sqlite3", "tillerman.ledger.sqlite", "tillerman.ledger.memory")
    here = Path(__file__)
    script = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); import pytest; "
              f"sys.exit(pytest.main(['-q', {str(here)!r}, '-k', 'not need_no_recorder']))")
    done = subprocess.run([sys.executable, "-c", script], cwd=here.parents[2], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
