"""The stop machine driven with values alone, against a thread simulated in memory.

``Thread`` answers each command as the real app-server 0.171.0 does (a pause of a paused
goal changes nothing, a delete of a message gone answers ``deleted: false``, an interrupt
without a running turn is refused ``no_active_turn``) and tells what it did, so a test can
restart the machine after any step and check that nothing is written blindly twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest

from tests.controller.test_delivery import NOW, THREAD, Record, make_intent
from tillerman.controller.core.commands import (
    Command,
    Interrupt,
    ListTerminals,
    PauseGoal,
    QueueDelete,
    QueueList,
    ReadGoal,
    ReadTurns,
    Terminate,
)
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch, NoAnswer, Observed, Reconcile, Refused, Replied
from tillerman.controller.core.intent_requests import proposal_envelopes
from tillerman.controller.core.rpc_errors import Refusal
from tillerman.controller.core.stop import (
    RECHECK_AFTER,
    SETTLE,
    STOP_ROUNDS,
    StopDelivery,
    goal_origin,
    machine_from_view,
)
from tillerman.ledger.events import GoalUpdated, Report, TurnCompleted
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import Projection
from tillerman.monitor.codex_wire import (
    Goal,
    QueueDeleted,
    QueueEntry,
    QueuePage,
    Terminal,
    TerminalList,
    Terminated,
    Turn,
    TurnPage,
)

OURS = "tillerman-in-00000000000000000001"  # another intent's queued message
THEIRS = "tui-message-7"  # a person's


@dataclass
class Thread:
    """What the server holds of one thread, and every write it was sent."""

    goal: str | None = "active"  # None: no goal
    goals_supported: bool = True
    running: str | None = "turn-9"
    queue: list[tuple[str, str]] = field(default_factory=lambda: [("q1", OURS), ("q2", THEIRS)])
    terminals: list[str] = field(default_factory=lambda: ["proc-1"])
    writes: list[Command] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)  # turns an interrupt ended, not yet observed

    def answer(self, command: Command, now: float):
        match command:
            case ReadGoal():
                if not self.goals_supported:
                    return Refused(command, Refusal.REFUSED, {"message": "Invalid request: unknown variant"}, now)
                return Replied(command, Goal(status=self.goal, objective="keep going"), now)
            case PauseGoal():
                self.writes.append(command)
                if self.goal is None:
                    return Refused(command, Refusal.REFUSED, {"message": "no goal exists"}, now)
                self.goal = "paused"
                return Replied(command, Goal(status="paused", objective="keep going", tokens_used=42), now)
            case QueueList():
                return Replied(command, QueuePage(tuple(QueueEntry(i, c) for i, c in self.queue)), now)
            case QueueDelete():
                self.writes.append(command)
                before = len(self.queue)
                self.queue = [(i, c) for i, c in self.queue if i != command.submission_id]
                return Replied(command, QueueDeleted(len(self.queue) < before), now)
            case ReadTurns():
                turns = (Turn(self.running, "inProgress"),) if self.running else ()
                return Replied(command, TurnPage((*turns, Turn("turn-1", "completed"))), now)
            case Interrupt():
                self.writes.append(command)
                if self.running != command.turn_id:
                    return Refused(command, Refusal.NO_ACTIVE_TURN, {}, now)
                self.ended.append(self.running)
                self.running = None
                return Replied(command, None, now)
            case ListTerminals():
                return Replied(command, TerminalList(tuple(Terminal(f"item-{p}", p) for p in self.terminals)), now)
            case Terminate():
                self.writes.append(command)
                gone = command.process_id in self.terminals
                self.terminals = [p for p in self.terminals if p != command.process_id]
                return Replied(command, Terminated(gone), now)
        raise AssertionError(command)


class Stop:
    """One stop intent, its machine, the record its outputs go into, and the thread."""

    def __init__(self, thread: Thread | None = None, **fields):
        self.intent = msgspec.structs.replace(make_intent("stop", **fields), expected_turn_id=None,
                                              effect_deadline=NOW + 600)
        self.record = Record(proposal_envelopes(self.intent, Projection()))
        self.machine = StopDelivery(self.intent)
        self.thread = thread or Thread()
        self.sent: list[Command] = []
        self.now = NOW

    def run(self, fact, *, steps: int | None = None) -> None:
        """Feed a fact and everything it leads to (the driver's loop); the turns an
        interrupt ended are observed after their answers. ``steps``: stop after that many
        commands, as a crash would (what was sent stays sent)."""
        pending = [fact]
        while pending:
            output = self.machine.handle(pending.pop(0))
            self.record.append(output.envelopes)
            for command in output.commands:
                if steps is not None and len(self.sent) >= steps:
                    return
                self.sent.append(command)
                # as the adapter does: a read that names a moment goes out no earlier
                self.now = max(self.now + 0.01, getattr(command, "not_before", 0.0))
                pending.append(self.thread.answer(command, self.now))
            if not pending and self.thread.ended:
                turn = self.thread.ended.pop()
                pending.append(Observed(TurnCompleted(thread_id=THREAD, turn_id=turn, status="interrupted"), self.now))

    def restart(self) -> None:
        self.machine = machine_from_view(self.record.view(self.intent.id))
        self.now += RECHECK_AFTER
        self.run(Reconcile(self.now))

    def moves(self) -> list[tuple[str, str]]:
        return [(h.state, h.reason) for h in self.record.view(self.intent.id).history if h.kind == "transition"]

    def evidence(self, reason: str) -> list[dict]:
        return [h.evidence for h in self.record.view(self.intent.id).history
                if h.kind == "evidence" and h.reason == reason]

    def stored(self, kind: type) -> list:
        return [e.event for e in self.record.stored.values() if isinstance(e.event, kind)]


def test_a_stop_pauses_the_goal_withdraws_ours_interrupts_terminates_and_verifies() -> None:
    stop = Stop()
    stop.run(Dispatch(NOW, "a1", "turn-9"))

    assert stop.moves() == [("dispatch_unknown", "dispatching"), ("acknowledged", "stop_applied"),
                            ("effect_verified", "stop_verified")]
    assert [type(c).__name__ for c in stop.thread.writes] == ["PauseGoal", "QueueDelete", "Interrupt", "Terminate"]
    assert all(c.attempt == "a1" for c in stop.thread.writes if hasattr(c, "attempt"))
    assert stop.thread.queue == [("q2", THEIRS)]  # a person's message stays
    [paused] = stop.stored(GoalUpdated)
    assert (paused.status, paused.by, paused.origin, paused.tokens_used) == ("paused", "tillerman", "user", 42)
    assert stop.evidence("queue_withdrawn") == [{"intent_id": "in-00000000000000000001", "submission_id": "q1",
                                                 "deleted": True}]
    assert stop.record.view(stop.intent.id).history[-1].evidence == {"goal_status": "paused", "running_turn": None}
    assert stop.machine.finished


def test_the_first_write_goes_out_only_after_the_durable_dispatch_record() -> None:
    stop = Stop()
    output = stop.machine.handle(Dispatch(NOW, "a1"))
    assert output.durable and [type(c) for c in output.commands] == [ReadGoal]  # a read, under the record


def test_a_thread_without_a_goal_is_stopped_by_the_interrupt_and_the_withdrawal() -> None:
    stop = Stop(Thread(goal=None))
    stop.run(Dispatch(NOW, "a1"))
    assert stop.moves()[-1] == ("effect_verified", "stop_verified")
    assert not any(isinstance(c, PauseGoal) for c in stop.thread.writes)
    assert stop.evidence("goal_read") == [{"goal_status": None}]


def test_a_release_without_goals_is_stopped_too_and_the_evidence_says_the_goal_was_unreadable() -> None:
    stop = Stop(Thread(goal=None, goals_supported=False))
    stop.run(Dispatch(NOW, "a1"))
    assert stop.moves()[-1] == ("effect_verified", "stop_verified")
    assert [e["refusal"] for e in stop.evidence("ReadGoal_refused")] == ["refused", "refused"]
    assert any(isinstance(c, Interrupt) for c in stop.thread.writes)


def test_an_idle_goal_thread_is_stopped_by_pausing_its_goal_alone() -> None:
    stop = Stop(Thread(running=None, queue=[], terminals=[]))
    stop.run(Dispatch(NOW, "a1"))
    assert [type(c).__name__ for c in stop.thread.writes] == ["PauseGoal"]
    assert stop.moves()[-1] == ("effect_verified", "stop_verified")


def test_the_origin_is_automatic_for_a_rule_and_user_for_a_person() -> None:
    assert (goal_origin("rule:loop-guard"), goal_origin("owner:ann"), goal_origin("reviewer:bo")) == (
        "automatic", "user", "user")


@pytest.mark.parametrize("crash_after", range(0, 12))
def test_a_restart_after_any_command_reads_before_it_writes_and_ends_verified(crash_after: int) -> None:
    stop = Stop()
    stop.run(Dispatch(NOW, "a1", "turn-9"), steps=crash_after)
    sent_before = len(stop.sent)
    stop.restart()

    assert stop.moves()[-1] == ("effect_verified", "stop_verified")
    resumed = stop.sent[sent_before:]
    if resumed:  # a fresh machine starts with a read, never with a write of unknown outcome
        assert isinstance(resumed[0], ReadGoal | ReadTurns)
    # Each write at most once per thing it changes; a repeat only where it is harmless.
    deletes = [c.submission_id for c in stop.thread.writes if isinstance(c, QueueDelete)]
    assert deletes == ["q1"]
    assert stop.thread.queue == [("q2", THEIRS)] and stop.thread.goal == "paused" and stop.thread.running is None


def test_work_found_again_is_stopped_again_then_the_stop_fails_and_is_reported() -> None:
    class Restarting(Thread):
        def answer(self, command, now):
            answered = super().answer(command, now)
            if isinstance(command, ReadTurns) and command.verifying:
                self.running = "turn-again"  # another client starts a turn each time
                return Replied(command, TurnPage((Turn("turn-again", "inProgress"),)), now)
            return answered

    stop = Stop(Restarting())
    stop.run(Dispatch(NOW, "a1"))
    assert [e["round"] for e in stop.evidence("work_found")] == list(range(1, STOP_ROUNDS + 1))
    assert stop.moves()[-1] == ("effect_failed", "still_working")
    assert [r.finding for r in stop.stored(Report)] == ["still_working"]


def test_no_answer_sends_nothing_more_until_a_reconcile_reads_again() -> None:
    stop = Stop()
    stop.machine.handle(Dispatch(NOW, "a1"))
    output = stop.machine.handle(NoAnswer(PauseGoal(intent_id=stop.intent.id, thread_id=THREAD, origin="user",
                                                    attempt="a1"), "timeout", NOW + 1))
    assert output.commands == ()
    again = stop.machine.handle(Reconcile(NOW + 2))
    assert [type(c) for c in again.commands] == [ReadGoal]


def test_a_reconcile_while_a_step_is_under_way_sends_nothing() -> None:
    stop = Stop()
    stop.machine.handle(Dispatch(NOW, "a1"))
    assert stop.machine.handle(Reconcile(NOW + 1)).commands == ()
    assert [type(c) for c in stop.machine.handle(Reconcile(NOW + RECHECK_AFTER)).commands] == [ReadGoal]


def test_an_interrupt_refused_for_no_active_turn_moves_on_to_the_terminals() -> None:
    class EndsFirst(Thread):
        def answer(self, command, now):
            if isinstance(command, Interrupt):
                self.running = None  # the turn ended between the read and the interrupt
            return super().answer(command, now)

    stop = Stop(EndsFirst())
    stop.run(Dispatch(NOW, "a1"))
    assert stop.evidence("Interrupt_refused")[0]["refusal"] == "no_active_turn"
    assert stop.moves()[-1] == ("effect_verified", "stop_verified")


def test_a_hazard_at_the_boundary_holds_the_interrupt_until_a_reconcile() -> None:
    stop = Stop()
    stop.machine.handle(Dispatch(NOW, "a1"))
    interrupt = Interrupt(intent_id=stop.intent.id, thread_id=THREAD, turn_id="turn-9", attempt="a1")
    held = stop.machine.handle(Refused(interrupt, Refusal.REFUSED, {"boundary": "interrupt_hazard"}, NOW + 1))
    assert held.commands == () and stop.machine.state is State.DISPATCH_UNKNOWN
    assert [type(c) for c in stop.machine.handle(Reconcile(NOW + 2)).commands] == [ReadGoal]


def test_a_stop_given_to_the_other_modes_machine_is_rejected_not_half_carried_out() -> None:
    stop = Stop()
    record = Record(proposal_envelopes(stop.intent, Projection()))
    output = Delivery(stop.intent).handle(Dispatch(NOW, "a1"))
    record.append(output.envelopes)
    assert output.commands == ()
    last = record.view(stop.intent.id).history[-1]
    assert (last.state, last.reason, last.evidence) == ("rejected", "not_dispatchable",
                                                        {"mode": "stop", "machine": "delivery"})


def test_a_turn_that_died_with_its_server_is_not_waited_for_and_the_stop_verifies() -> None:
    """A restarted server lists a turn that died with the old one as ``interrupted`` with
    no end time, for good; the adapter reads such a listing again (``turn_listing``), so
    what reaches the machine still listed so has ended: nothing to interrupt, and the
    readback finds no work (it was "maybe running" once, and such a stop never verified)."""
    class DiedWithItsServer(Thread):
        def answer(self, command, now):
            if isinstance(command, ReadTurns):
                return Replied(command, TurnPage((Turn("turn-dead", "interrupted", no_end_time=True),)), now)
            return super().answer(command, now)

    stop = Stop(DiedWithItsServer(running=None))
    stop.run(Dispatch(NOW, "a1"))
    assert not [c for c in stop.thread.writes if isinstance(c, Interrupt)]
    assert stop.moves()[-1] == ("effect_verified", "stop_verified")


def test_a_continuation_decided_before_the_pause_is_found_by_the_settled_readback_and_ended() -> None:
    """Codex starts a goal's next turn 5-10 ms after a turn ends; a pause landing in that gap
    does not undo a start already decided. Here the idle thread's continuation starts half a
    second after the pause (a loaded server), after every step's read: the readback,
    ``SETTLE`` seconds after the steps, finds it running, and the steps end it."""
    class DecidedBeforeThePause(Thread):
        starts_at: float | None = None

        def answer(self, command, now):
            if isinstance(command, PauseGoal):
                self.starts_at = now + 0.5
            if self.starts_at is not None and now >= self.starts_at:
                self.running, self.starts_at = "turn-continued", None
            return super().answer(command, now)

    stop = Stop(DecidedBeforeThePause(running=None))
    stop.run(Dispatch(NOW, "a1"))
    verifying = [c for c in stop.sent if isinstance(c, ReadTurns | ReadGoal) and c.verifying]
    applied_at = next(h.at for h in stop.record.view(stop.intent.id).history if h.reason == "stop_applied")
    assert all(c.not_before == applied_at + SETTLE for c in verifying[:2])
    assert [e["running_turn"] for e in stop.evidence("work_found")] == ["turn-continued"]
    assert [c.turn_id for c in stop.thread.writes if isinstance(c, Interrupt)] == ["turn-continued"]
    assert stop.moves()[-1] == ("effect_verified", "stop_verified")
