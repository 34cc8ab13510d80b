"""The boundary's verdict as a table: values in, a refusal (or what to record) out, no ledger."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from tests.controller.test_adapter import NEXT_TURN, NOW, THREAD, TURN, grants, interrupt_for, make_intent, steer_for
from tillerman.controller.core.boundary import (
    BoundaryRefusal,
    CommandMismatch,
    InterruptHazard,
    NoDispatchRecord,
    ReplayedIntent,
    Unauthorized,
    judge,
)
from tillerman.controller.core.commands import (
    Command,
    ListTerminals,
    QueueAdd,
    QueueList,
    ReadBack,
    ResumeQueue,
    RunVerify,
    Terminate,
)
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import HistoryItem, IntentView
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.rules.decision import Action
from tillerman.rules.policy import decide
from tillerman.rules.ruleset import Grant, build_ruleset

DISPATCHED = HistoryItem(seq=1, at=NOW, kind="transition", state=State.DISPATCH_UNKNOWN, reason="dispatching",
                         evidence={"attempt": "a1"})
INTERRUPTED = HistoryItem(seq=2, at=NOW, kind="transition", state=State.ACKNOWLEDGED, reason="turn_interrupted")
APPROVAL = {"approval_pending": True}
CRITICAL = {"critical_tool": True}


@dataclass
class Row:
    """One command against one ledger record: the refusal expected (None: cleared)."""

    id: str
    mode: str
    command: Callable[[Intent], Command]
    refusal: type[BoundaryRefusal] | None
    detail: str = ""  # a part of the refusal's message
    state: str = State.DISPATCH_UNKNOWN
    history: tuple[HistoryItem, ...] = (DISPATCHED,)
    snapshot: dict = field(default_factory=dict)
    actions: tuple[str, ...] = ("steer", "queue", "interrupt", "interrupt_critical")
    intent: dict = field(default_factory=dict)
    recorded: tuple[str, ...] = ()  # reasons of the evidence to record before the send


def _queue_add(intent: Intent, attempt: str = "a1") -> QueueAdd:
    return QueueAdd(intent_id=intent.id, thread_id=THREAD, client_user_message_id=intent.client_user_message_id,
                    text=intent.delivered_text, attempt=attempt)


def _terminate(turn: str = TURN) -> Callable:
    return lambda i: Terminate(intent_id=i.id, thread_id=THREAD, process_id="22", item_id="call-1", turn_id=turn)


def _ids(intent: Intent) -> dict[str, str]:
    return {"intent_id": intent.id, "thread_id": THREAD}


ROWS = [
    # who may ask for what
    Row("other_thread", "steer", lambda i: replace(steer_for(i), thread_id="t-2"), CommandMismatch, "for thread t-2"),
    Row("replayed", "steer", steer_for, ReplayedIntent, intent={"replayed": True}),
    Row("no_grant", "steer", steer_for, Unauthorized, "no grant lets owner:ann steer", actions=("queue",)),
    Row("other_verify_command", "steer", lambda i: RunVerify(**_ids(i), command="true"), CommandMismatch,
        "another readback command", intent={"verify": "test -f ok"}),
    Row("own_verify_command", "steer", lambda i: RunVerify(**_ids(i), command="test -f ok"), None,
        intent={"verify": "test -f ok"}),
    # a dispatch: the intent's own command, its turn, under the durable record of this attempt
    Row("steer", "steer", steer_for, None),
    Row("interrupt_for_a_steer", "steer", interrupt_for, CommandMismatch, "a Interrupt for a steer intent"),
    Row("steer_to_another_turn", "steer", lambda i: steer_for(i, turn=NEXT_TURN), CommandMismatch,
        f"targets turn {NEXT_TURN}"),
    Row("still_proposed", "steer", steer_for, NoDispatchRecord, "is proposed in the ledger", state=State.PROPOSED,
        history=()),
    Row("another_attempt", "steer", lambda i: steer_for(i, attempt="a2"), NoDispatchRecord, "is not attempt a2"),
    Row("already_accepted", "steer", steer_for, NoDispatchRecord, "is queued in the ledger", state=State.QUEUED),
    Row("queue_add", "queue", _queue_add, None),
    Row("queue_add_another_attempt", "queue", lambda i: _queue_add(i, "a2"), NoDispatchRecord),
    # an interrupt: none of the policy's hazards, a forced one through a critical tool recorded first
    Row("interrupt", "interrupt", interrupt_for, None),
    Row("interrupt_during_approval", "interrupt", interrupt_for, InterruptHazard,
        f"an approval is pending on thread {THREAD}", snapshot=APPROVAL),
    Row("interrupt_unknown_effect", "interrupt", interrupt_for, InterruptHazard,
        f"an external effect on thread {THREAD} is unknown", snapshot={"external_effect_unknown": True}),
    Row("interrupt_critical_tool", "interrupt", interrupt_for, InterruptHazard,
        f"a critical tool runs on thread {THREAD}", snapshot=CRITICAL),
    Row("forced_without_interrupt_critical", "interrupt", interrupt_for, InterruptHazard,
        "and the producer holds no interrupt_critical grant", snapshot=CRITICAL, actions=("interrupt",),
        intent={"force": True}),
    Row("forced_with_interrupt_critical", "interrupt", interrupt_for, None, snapshot=CRITICAL,
        intent={"force": True}, recorded=("forced_during_critical_tool",)),
    Row("forced_during_approval", "interrupt", interrupt_for, InterruptHazard, "approval",
        snapshot=APPROVAL | CRITICAL, intent={"force": True}),
    Row("interrupt_critical_alone", "interrupt", interrupt_for, Unauthorized, snapshot=CRITICAL,
        actions=("interrupt_critical",), intent={"force": True}),
    # the policy holds a steer during an approval; the boundary judges hazards for interrupts
    Row("steer_during_approval", "steer", steer_for, None, snapshot=APPROVAL),
    # after the interrupt: only the interrupted turn's processes, a resume only when asked
    Row("terminate", "interrupt", _terminate(), None, history=(DISPATCHED, INTERRUPTED), state=State.ACKNOWLEDGED),
    Row("terminate_before_interrupted", "interrupt", _terminate(), NoDispatchRecord, f"turn {TURN} interrupted"),
    Row("terminate_another_turn", "interrupt", _terminate("turn-0"), CommandMismatch, "only turn turn-1's are ours",
        history=(DISPATCHED, INTERRUPTED), state=State.ACKNOWLEDGED),
    Row("terminate_for_a_steer", "steer", _terminate(), CommandMismatch, "a Terminate for a steer intent"),
    Row("resume_not_asked", "interrupt", lambda i: ResumeQueue(**_ids(i)), CommandMismatch, "did not ask",
        history=(DISPATCHED, INTERRUPTED), state=State.ACKNOWLEDGED),
    Row("resume_asked", "interrupt", lambda i: ResumeQueue(**_ids(i)), None, history=(DISPATCHED, INTERRUPTED),
        state=State.ACKNOWLEDGED, intent={"resume_queue": True}),
    # reads need only the grant
    Row("queue_list", "queue", lambda i: QueueList(**_ids(i)), None, state=State.PROPOSED, history=()),
    Row("read_back", "steer", lambda i: ReadBack(**_ids(i), client_id="c", turn_id=TURN), None, state=State.QUEUED),
    Row("list_terminals", "interrupt", lambda i: ListTerminals(**_ids(i)), None, state=State.ACKNOWLEDGED),
    Row("read_back_without_grant", "steer", lambda i: ReadBack(**_ids(i), client_id="c", turn_id=TURN), Unauthorized,
        actions=()),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_the_verdict_of_each_row(row: Row) -> None:
    intent = make_intent(row.mode, **row.intent)
    view = IntentView(intent, state=row.state, history=list(row.history))
    snapshot = ThreadSnapshot(thread_id=THREAD, active_turn_id=TURN, turn_states={TURN: "active"}, **row.snapshot)
    verdict = judge(row.command(intent), view, snapshot, grants(*row.actions), NOW)
    if row.refusal is None:
        assert verdict.refusal is None
    else:
        assert type(verdict.refusal) is row.refusal
        assert row.detail in str(verdict.refusal)
    assert tuple(e.event.reason for e in verdict.record) == row.recorded
    assert all(e.at == NOW for e in verdict.record)


def test_a_forced_interrupt_is_recorded_with_its_grant_and_producer() -> None:
    intent = make_intent("interrupt", force=True)
    verdict = judge(interrupt_for(intent), IntentView(intent, state=State.DISPATCH_UNKNOWN, history=[DISPATCHED]),
                    ThreadSnapshot(thread_id=THREAD, critical_tool=True), grants("interrupt", "interrupt_critical"),
                    NOW)
    [record] = verdict.record
    assert (record.event.state, record.event.evidence) == (
        State.DISPATCH_UNKNOWN, {"grant": "interrupt_critical", "producer": intent.producer})


@pytest.mark.parametrize(("approval", "external", "critical", "force", "critical_grant"),
                         list(itertools.product((False, True), repeat=5)))
def test_the_boundary_refuses_an_interrupt_exactly_when_the_policy_holds_it(
        approval, external, critical, force, critical_grant) -> None:
    """One definition of the hazards: what the policy holds before dispatch, the boundary
    refuses at the send, and nothing else."""
    intent = make_intent("interrupt", force=force)
    snapshot = ThreadSnapshot(thread_id=THREAD, steerable=True, active_turn_id=TURN, turn_states={TURN: "active"},
                              approval_pending=approval, external_effect_unknown=external, critical_tool=critical)
    ruleset = build_ruleset((), (Grant(subject=intent.producer, actions=frozenset(
        {"interrupt", "interrupt_critical"} if critical_grant else {"interrupt"})),))
    held = decide(intent, State.PROPOSED, snapshot, NOW, ruleset).action is Action.OBSERVE_CRITICAL
    verdict = judge(interrupt_for(intent), IntentView(intent, state=State.DISPATCH_UNKNOWN, history=[DISPATCHED]),
                    snapshot, ruleset, NOW)
    assert isinstance(verdict.refusal, InterruptHazard) == held
