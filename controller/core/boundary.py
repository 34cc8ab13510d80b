"""The boundary's verdict: may this command be sent now?

The guarded adapter (``tillerman.controller.dispatch.adapter``) reads, just before every send,
the intent's durable record back from the ledger and the thread's snapshot, and asks
``judge``. Nothing here reads or writes anything: the verdict is a function of what the
adapter read and of the current rule set, so a table of values tests every row.

The checks, in order; the first that fails refuses the command (a ``BoundaryRefusal``,
whose ``reason`` becomes the ``boundary`` of the recorded ``refused`` fact):

* ``command_mismatch`` — the command is for another thread than its intent;
* ``replayed`` — the intent was simulated by replay;
* ``unauthorized`` — no grant lets the intent's producer request its mode on its
  thread (authority is the producer's, as in ``tillerman.rules.policy``);
* ``command_mismatch`` — a ``RunVerify`` names another command than the intent's ``verify``;
* a steer, queue add or interrupt must be the command of the intent's mode, for its
  expected turn (``command_mismatch``), and is sent only while the ledger shows the
  intent ``dispatch_unknown`` under the very ``attempt`` the command carries
  (``no_dispatch_record``): the durable dispatch record exists, and a second, stale
  machine cannot send a second copy;
* a terminate or a queue resume belongs to an interrupt intent, a terminate only to
  the interrupted turn and a resume only to an intent that asked for it
  (``command_mismatch``), and either only once the ledger shows that turn interrupted
  (``no_dispatch_record``);
* a stop's command is one of a stop's (``tillerman.controller.core.stop``); its writes
  (goal pause, queue delete, interrupt, terminate) go only while the ledger shows the
  stop under way, under the ``attempt`` of its dispatch record (``no_dispatch_record``);
* an interrupt (a stop's too) meets none of the policy's hazards (``tillerman.rules.policy.hazard``,
  the one definition both use): no approval pending, no external effect unknown, no
  critical tool running unless the intent is ``force``d AND its producer holds
  ``interrupt_critical`` (``interrupt_hazard``). That forced interrupt is cleared with
  a fact to record, durably, before the send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tillerman.controller.core.commands import (
    DISPATCH_COMMANDS,
    Command,
    Interrupt,
    ListTerminals,
    PauseGoal,
    QueueAdd,
    QueueDelete,
    QueueList,
    ReadGoal,
    ReadTurns,
    ResumeQueue,
    RunVerify,
    Steer,
    Terminate,
)
from tillerman.controller.core.delivery import dispatch_record
from tillerman.controller.core.facts import Refused
from tillerman.controller.core.intent_requests import evidence_envelope
from tillerman.controller.core.rpc_errors import Refusal
from tillerman.controller.core.stop import stop_attempt
from tillerman.ledger.events import Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import IntentView
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.rules.policy import hazard
from tillerman.rules.ruleset import INTERRUPT_CRITICAL, RuleSet


class BoundaryRefusal(Exception):
    """A command refused at the adapter's boundary; nothing was sent."""

    reason: ClassVar[str] = "refused_at_boundary"

    def as_fact(self, command: Command, now: float) -> Refused:
        """The refusal as the delivery machine takes it: definite, since nothing was sent."""
        return Refused(command, Refusal.REFUSED, {"boundary": self.reason, "detail": str(self)}, now)


class CommandMismatch(BoundaryRefusal):
    """The command does not belong to its intent (another thread, turn or mode)."""

    reason = "command_mismatch"


class ReplayedIntent(BoundaryRefusal):
    """The intent was simulated by replay: it can never be dispatched."""

    reason = "replayed"


class Unauthorized(BoundaryRefusal):
    """No grant lets the intent's producer request this action on this thread."""

    reason = "unauthorized"


class NoDispatchRecord(BoundaryRefusal):
    """The ledger does not record the step this command follows: ``dispatch_unknown``
    under this attempt (a dispatch), or the interrupt acknowledged (terminate, resume)."""

    reason = "no_dispatch_record"


class InterruptHazard(BoundaryRefusal):
    """An approval is pending, an external effect is unknown, or a critical tool runs."""

    reason = "interrupt_hazard"


@dataclass(frozen=True)
class Verdict:
    """Refused (nothing may be sent), or cleared with what must be on record, fsynced,
    before the send."""

    refusal: BoundaryRefusal | None = None
    record: tuple[Envelope, ...] = ()


#: What an interrupt refused for a hazard says, by ``tillerman.rules.policy.hazard``'s reason.
_HAZARD_DETAIL = {
    "approval_pending": "an approval is pending on thread {thread}",
    "external_effect_unknown": "an external effect on thread {thread} is unknown",
    "critical_tool": "a critical tool runs on thread {thread}",
    "critical_tool_force_not_granted": "a critical tool runs on thread {thread}"
                                       " and the producer holds no interrupt_critical grant",
}


def judge(command: Command, view: IntentView, snapshot: ThreadSnapshot, ruleset: RuleSet, now: float) -> Verdict:
    """Every boundary check of one command, against the ledger's record of its intent
    (``view``) and its thread (``snapshot``); ``now`` stamps what must be recorded."""
    refusal = _refusal(command, view, snapshot, ruleset)
    if refusal is not None:
        return Verdict(refusal)
    intent = view.intent
    if isinstance(command, Interrupt) and snapshot.critical_tool:  # cleared: forced, and granted
        return Verdict(record=(evidence_envelope(
            intent, State.DISPATCH_UNKNOWN, "forced_during_critical_tool",
            {"grant": INTERRUPT_CRITICAL, "producer": intent.producer}, "forced", now),))
    return Verdict()


def _refusal(command: Command, view: IntentView, snapshot: ThreadSnapshot, ruleset: RuleSet) -> BoundaryRefusal | None:
    intent = view.intent
    if command.thread_id != intent.thread_id:
        return CommandMismatch(f"command for thread {command.thread_id}, intent {intent.id} is for {intent.thread_id}")
    if intent.replayed:
        return ReplayedIntent(f"intent {intent.id} was simulated by replay and is never dispatched")
    if not ruleset.allows(intent.producer, intent.mode, intent.thread_id):
        return Unauthorized(f"no grant lets {intent.producer} {intent.mode} on thread {intent.thread_id}")
    if isinstance(command, RunVerify) and command.command != intent.verify:
        return CommandMismatch(f"intent {intent.id} names another readback command")
    if intent.mode == "stop":
        return _stop_refusal(view, command, snapshot, ruleset)
    if isinstance(command, DISPATCH_COMMANDS):
        return _dispatch_refusal(view, command) or (
            _hazard_refusal(view, snapshot, ruleset) if isinstance(command, Interrupt) else None)
    if isinstance(command, Terminate | ResumeQueue):
        return _after_interrupt_refusal(view, command)
    return None


def _dispatch_refusal(view: IntentView, command: Steer | QueueAdd | Interrupt) -> BoundaryRefusal | None:
    intent = view.intent
    expected_kind = {"steer": Steer, "queue": QueueAdd, "interrupt": Interrupt}[intent.mode]
    if not isinstance(command, expected_kind):
        return CommandMismatch(f"a {type(command).__name__} for a {intent.mode} intent")
    # The latest record: the dispatch, or a following steer's latest retarget (which names
    # the turn it is sent to).
    record = dispatch_record(view)
    expected = record[1] if record is not None and intent.follows_active_turn else intent.expected_turn_id
    turn = getattr(command, "expected_turn_id", None) or getattr(command, "turn_id", None)
    if intent.mode != "queue" and turn != expected:
        return CommandMismatch(f"command targets turn {turn}, intent {intent.id} expects {expected}")
    if view.state != State.DISPATCH_UNKNOWN:
        return NoDispatchRecord(f"intent {intent.id} is {view.state} in the ledger, not dispatch_unknown")
    if record is None or record[0] != command.attempt:
        return NoDispatchRecord(f"the ledger's dispatch record of {intent.id} is not attempt {command.attempt}")
    return None


def _after_interrupt_refusal(view: IntentView, command: Terminate | ResumeQueue) -> BoundaryRefusal | None:
    intent = view.intent
    if intent.mode != "interrupt":
        return CommandMismatch(f"a {type(command).__name__} for a {intent.mode} intent")
    if isinstance(command, Terminate) and command.turn_id != intent.expected_turn_id:
        return CommandMismatch(f"process of turn {command.turn_id}; only turn {intent.expected_turn_id}'s are ours")
    if isinstance(command, ResumeQueue) and not intent.resume_queue:
        return CommandMismatch(f"intent {intent.id} did not ask to resume the queue")
    if not any(h.kind == "transition" and h.state == State.ACKNOWLEDGED and h.reason == "turn_interrupted"
               for h in view.history):
        return NoDispatchRecord(f"the ledger does not show turn {intent.expected_turn_id} interrupted")
    return None


#: What a stop sends: its reads, and the writes that go out under its dispatch record.
_STOP_READS = (ReadGoal, ReadTurns, QueueList, ListTerminals)
_STOP_WRITES = (PauseGoal, QueueDelete, Interrupt, Terminate)


def _stop_refusal(view: IntentView, command: Command, snapshot: ThreadSnapshot,
                  ruleset: RuleSet) -> BoundaryRefusal | None:
    """A stop's command: one of its own kinds; a write only while the ledger shows the stop
    under way (dispatch_unknown, or acknowledged and verifying) under the attempt the
    command carries; its interrupt meets no hazard (as an interrupt's)."""
    intent = view.intent
    if not isinstance(command, _STOP_READS + _STOP_WRITES):
        return CommandMismatch(f"a {type(command).__name__} for a stop intent")
    if isinstance(command, _STOP_READS):
        return None
    if view.state not in (State.DISPATCH_UNKNOWN, State.ACKNOWLEDGED):
        return NoDispatchRecord(f"stop {intent.id} is {view.state} in the ledger, not under way")
    attempt = getattr(command, "attempt", None)
    if attempt is not None and attempt != stop_attempt(view):
        return NoDispatchRecord(f"the ledger's dispatch record of {intent.id} is not attempt {attempt}")
    return _hazard_refusal(view, snapshot, ruleset) if isinstance(command, Interrupt) else None


def _hazard_refusal(view: IntentView, snapshot: ThreadSnapshot, ruleset: RuleSet) -> InterruptHazard | None:
    # Forced or not: interrupting during an approval races the human's answer, and an
    # interrupt never undoes an effect that already crossed its boundary.
    found = hazard(view.intent, snapshot, ruleset)
    return None if found is None else InterruptHazard(_HAZARD_DETAIL[found].format(thread=view.intent.thread_id))
