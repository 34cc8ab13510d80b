"""The guarded adapter: the only code that sends an intervention to the app-server.

The delivery machine (``tillerman.controller.delivery``) decides what to send; this module sends
it, and before every send checks AGAIN, at the boundary, against the ledger rather
than anyone's memory:

* the intent (its durable record, read back from the recorder) is not ``replayed``;
* a grant in the current rule set lets the intent's producer request its mode on
  its thread (authority is the producer's, as in ``tillerman.rules.policy``);
* a steer, queue add or interrupt is sent only while the ledger shows the intent
  ``dispatch_unknown`` under the very ``attempt`` the command carries (the durable
  dispatch record exists, and a second, stale machine cannot send a second copy); a
  terminate or a queue resume only after the ledger shows the interrupt acknowledged,
  and only for the interrupted turn, and a resume only when the intent asked for it;
* an interrupt is not sent while an approval is pending or an external effect is
  unknown, nor while a critical tool runs unless the intent is ``force``d AND its
  producer holds ``interrupt_critical`` — then that is recorded before the send.

The ``verify`` readback runs here too, in the thread's working directory as the server
(``thread/read``) or the ledger (the session file's ``cwd``) names it now; when neither
can, nothing runs and the machine fails the check (``cwd_unknown``).

A failed check raises a ``BoundaryRefusal`` subclass and sends nothing. Every request
runs under a timeout; its outcome comes back as a delivery fact (``Replied``,
``Refused`` for a recognized refusal, ``NoAnswer`` for a timeout, a dropped
connection or an unrecognized error — see ``tillerman.controller.rpc_errors``).

The wire format — requests, and replies read into the typed values the machine takes —
is ``tillerman.monitor.codex_wire``'s (the real app-server 0.163.0).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import anyio

from tillerman.controller.delivery import (
    DISPATCH_COMMANDS,
    READBACK_PAGE,
    Command,
    Delivery,
    Fact,
    Interrupt,
    ListTerminals,
    NoAnswer,
    QueueAdd,
    QueueList,
    ReadBack,
    Refused,
    Replied,
    ResumeQueue,
    RunVerify,
    Steer,
    Terminate,
    Verified,
)
from tillerman.controller.intent_requests import evidence_envelope, intent_view
from tillerman.controller.rpc_errors import Refusal, classify
from tillerman.ledger import projections
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import IntentView
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.monitor import codex_wire as wire
from tillerman.monitor.appserver_client import AppServerDisconnected
from tillerman.monitor.digest import digest
from tillerman.monitor.jsonrpc import RpcError
from tillerman.rules.ruleset import INTERRUPT_CRITICAL, RuleSet

DEFAULT_TIMEOUT = 10.0
DEFAULT_VERIFY_TIMEOUT = 60.0


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


class StaleDelivery(Exception):
    """The ledger already holds a different record of this move: another machine made it.
    Rebuild the machine from the ledger (``Delivery.from_view``) and carry on from there."""


class AppServerLike(Protocol):
    async def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = ...) -> Any: ...


def request_for(command: Command) -> wire.Request:
    """The JSON-RPC method and params of an app-server command."""
    thread_id = command.thread_id
    match command:
        case Steer():
            return wire.steer(thread_id, command.expected_turn_id, command.client_user_message_id, command.text)
        case QueueAdd():
            return wire.queue_add(thread_id, command.client_user_message_id, command.text)
        case Interrupt():
            return wire.interrupt(thread_id, command.turn_id)
        case QueueList():
            return wire.queue_list(thread_id)
        case ReadBack():
            # newest first, with items: only the full view carries every userMessage and its clientId
            return wire.turns_list(thread_id, READBACK_PAGE, cursor=command.cursor, full_items=True)
        case ListTerminals():
            return wire.terminals_list(thread_id)
        case Terminate():
            return wire.terminate(thread_id, command.process_id)
        case ResumeQueue():
            return wire.queue_start(thread_id)
    raise TypeError(f"{type(command).__name__} is not an app-server request")


#: How the reply to each command is read: the machine gets the typed value.
REPLY_PARSERS: dict[type[Command], Callable[[object], wire.Reply]] = {
    Steer: wire.parse_steer_accepted,
    QueueAdd: wire.parse_queued_submission,
    Interrupt: wire.parse_interrupt_accepted,
    QueueList: wire.parse_queue_page,
    ReadBack: wire.parse_turn_page,
    ListTerminals: wire.parse_terminal_list,
    Terminate: wire.parse_terminated,
    ResumeQueue: wire.parse_queue_started,
}


class GuardedAdapter:
    """Executes delivery commands over an app-server client, behind the boundary checks."""

    def __init__(
        self,
        client: AppServerLike,
        recorder: Recorder,
        ruleset: RuleSet,
        *,
        snapshot: Callable[[str], ThreadSnapshot] | None = None,
        recorded_cwd: Callable[[str], str | None] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        verify_timeout: float = DEFAULT_VERIFY_TIMEOUT,
        clock: Callable[[], float] = time.time,
        retain_payloads: bool = False,
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.ruleset = ruleset  # the daemon swaps in a reloaded rule set
        # The daemon passes its live projection's views; the defaults re-fold the ledger.
        self.snapshot = snapshot or (lambda thread_id: projections.load(recorder).snapshot(thread_id))
        self.recorded_cwd = recorded_cwd or (lambda thread_id: projections.load(recorder).recorded_cwd(thread_id))
        self.timeout = timeout
        self.verify_timeout = verify_timeout
        self.clock = clock
        self.retain_payloads = retain_payloads  # the verify directory's path goes into evidence

    async def execute(self, command: Command) -> Fact:
        """Check, then send; raises a ``BoundaryRefusal`` (nothing sent) or returns the outcome."""
        self.check(command)
        if isinstance(command, RunVerify):
            return await self._run_verify(command)
        method, params = request_for(command)
        try:
            result = await self.client.request(method, params, timeout=self.timeout)
        except RpcError as error:
            read = classify(error)
            if read.refusal is None:
                return NoAnswer(command, "unrecognized_error", self.clock(), read.evidence)
            return Refused(command, read.refusal, read.evidence, self.clock())
        except TimeoutError:
            return NoAnswer(command, "timeout", self.clock(), {"timeout": self.timeout})
        except AppServerDisconnected as lost:
            return NoAnswer(command, "disconnected", self.clock(), {"detail": str(lost)})
        return Replied(command, REPLY_PARSERS[type(command)](result), self.clock())

    def check(self, command: Command) -> IntentView:
        """Every boundary check for one command, against the ledger's record of its intent."""
        view = intent_view(self.recorder, command.intent_id)
        intent = view.intent
        if command.thread_id != intent.thread_id:
            raise CommandMismatch(f"command for thread {command.thread_id}, intent {intent.id} is for {intent.thread_id}")
        if intent.replayed:
            raise ReplayedIntent(f"intent {intent.id} was simulated by replay and is never dispatched")
        if not self.ruleset.allows(intent.producer, intent.mode, intent.thread_id):
            raise Unauthorized(f"no grant lets {intent.producer} {intent.mode} on thread {intent.thread_id}")
        if isinstance(command, RunVerify) and command.command != intent.verify:
            raise CommandMismatch(f"intent {intent.id} names another readback command")
        if isinstance(command, DISPATCH_COMMANDS):
            self._check_dispatch_record(view, command)
        if isinstance(command, Terminate | ResumeQueue):
            self._check_after_interrupt(view, command)
        if isinstance(command, Interrupt):
            self._check_interrupt_hazards(view)
        return view

    def _check_dispatch_record(self, view: IntentView, command: Steer | QueueAdd | Interrupt) -> None:
        intent = view.intent
        expected_kind = {"steer": Steer, "queue": QueueAdd, "interrupt": Interrupt}[intent.mode]
        if not isinstance(command, expected_kind):
            raise CommandMismatch(f"a {type(command).__name__} for a {intent.mode} intent")
        turn = getattr(command, "expected_turn_id", None) or getattr(command, "turn_id", None)
        if intent.mode != "queue" and turn != intent.expected_turn_id:
            raise CommandMismatch(f"command targets turn {turn}, intent {intent.id} expects {intent.expected_turn_id}")
        if view.state != State.DISPATCH_UNKNOWN:
            raise NoDispatchRecord(f"intent {intent.id} is {view.state} in the ledger, not dispatch_unknown")
        record = next((h for h in reversed(view.history)
                       if h.kind == "transition" and h.state == State.DISPATCH_UNKNOWN), None)
        if record is None or record.evidence.get("attempt") != command.attempt:
            raise NoDispatchRecord(f"the ledger's dispatch record of {intent.id} is not attempt {command.attempt}")

    def _check_after_interrupt(self, view: IntentView, command: Terminate | ResumeQueue) -> None:
        intent = view.intent
        if intent.mode != "interrupt":
            raise CommandMismatch(f"a {type(command).__name__} for a {intent.mode} intent")
        if isinstance(command, Terminate) and command.turn_id != intent.expected_turn_id:
            raise CommandMismatch(f"process of turn {command.turn_id}; only turn {intent.expected_turn_id}'s are ours")
        if isinstance(command, ResumeQueue) and not intent.resume_queue:
            raise CommandMismatch(f"intent {intent.id} did not ask to resume the queue")
        if not any(h.kind == "transition" and h.state == State.ACKNOWLEDGED and h.reason == "turn_interrupted"
                   for h in view.history):
            raise NoDispatchRecord(f"the ledger does not show turn {intent.expected_turn_id} interrupted")

    def _check_interrupt_hazards(self, view: IntentView) -> None:
        intent = view.intent
        snapshot = self.snapshot(intent.thread_id)
        # Forced or not: interrupting during an approval races the human's answer, and an
        # interrupt never undoes an effect that already crossed its boundary.
        if snapshot.approval_pending:
            raise InterruptHazard(f"an approval is pending on thread {intent.thread_id}")
        if snapshot.external_effect_unknown:
            raise InterruptHazard(f"an external effect on thread {intent.thread_id} is unknown")
        if not snapshot.critical_tool:
            return
        if not (intent.force and self.ruleset.allows(intent.producer, INTERRUPT_CRITICAL, intent.thread_id)):
            raise InterruptHazard(f"a critical tool runs on thread {intent.thread_id}"
                                  + (" and the producer holds no interrupt_critical grant" if intent.force else ""))
        self.recorder.append([evidence_envelope(
            intent, State.DISPATCH_UNKNOWN, "forced_during_critical_tool",
            {"grant": INTERRUPT_CRITICAL, "producer": intent.producer}, "forced", self.clock())], durable=True)

    async def _run_verify(self, command: RunVerify) -> Verified:
        """The intent's readback command, in a shell, in the thread's working directory
        (not the daemon's: ``test -f build/ok`` checks the agent's tree), under a timeout
        (killed when it expires). No directory, no run: the machine fails the check."""
        cwd = await self._thread_cwd(command.thread_id)
        if cwd is None:
            return Verified(None, self.clock(), cwd_digest=None)
        where = {"cwd_digest": digest(cwd), "cwd": cwd if self.retain_payloads else None}
        with anyio.move_on_after(self.verify_timeout):
            try:
                done = await anyio.run_process(["/bin/sh", "-c", command.command], cwd=cwd, check=False,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except OSError as exc:  # the directory is gone, or no shell: no verdict
                return Verified(None, self.clock(), **where, error=f"{type(exc).__name__}: {exc.strerror or exc}")
            return Verified(done.returncode, self.clock(), **where)
        return Verified(None, self.clock(), **where, error="timeout")

    async def _thread_cwd(self, thread_id: str) -> str | None:
        """The thread's working directory now: the server's (``thread/read``), else the one
        its session file named, when the ledger kept it (``--retain-payloads``)."""
        try:
            cwd = wire.parse_thread_cwd(await self.client.request(*wire.thread_read(thread_id), timeout=self.timeout))
        except (RpcError, TimeoutError, AppServerDisconnected):
            cwd = None
        return cwd or self.recorded_cwd(thread_id)


#: Named points of the dispatch protocol where a fault test may kill the daemon, in
#: protocol order (every dispatch mode passes each of them once):
#: ``dispatch_recording`` — the dispatch record is built, not yet written;
#: ``dispatch_recorded`` — the durable ``dispatch_unknown`` record is committed, nothing sent;
#: ``dispatch_sending`` — the boundary is about to send the steer, queue add or interrupt
#: (queue: after the list that precedes the add was answered);
#: ``dispatch_answered`` — the server accepted it, the answer is not yet recorded;
#: ``answer_recorded`` — the answer (or, echo first, the late-reply evidence) is committed.
CHECKPOINTS = ("dispatch_recording", "dispatch_recorded", "dispatch_sending", "dispatch_answered",
               "answer_recorded")


async def carry_out(
    machine: Delivery, fact: Fact, recorder: Recorder, adapter: GuardedAdapter,
    checkpoint: Callable[[str], None] = lambda point: None,
) -> None:
    """Feed one fact and everything it leads to: append each output (fsynced when it is a
    dispatch record) BEFORE executing its commands, then feed back their outcomes.

    ``checkpoint`` is called at each of ``CHECKPOINTS`` (a fault test kills the process
    there): around the durable dispatch record, just before a dispatch command goes to
    the transport, after the server accepted it, and after that answer is recorded.

    Raises ``IllegalTransition`` or ``StaleDelivery`` when another writer moved the intent
    first; nothing of the refused output was sent.
    """
    pending: list[Fact] = [fact]
    while pending:
        current = pending.pop(0)
        output = machine.handle(current)
        answered = isinstance(current, Replied) and isinstance(current.command, DISPATCH_COMMANDS)
        if output.envelopes:
            if output.durable:
                checkpoint("dispatch_recording")
            appended = recorder.append(output.envelopes, durable=output.durable)
            if appended.conflicts:
                raise StaleDelivery(f"intent {machine.intent.id}: the ledger holds another {appended.conflicts[0]}")
            if output.durable:
                checkpoint("dispatch_recorded")
        if answered:
            checkpoint("answer_recorded")
        for command in output.commands:
            if isinstance(command, DISPATCH_COMMANDS):
                checkpoint("dispatch_sending")
            try:
                outcome = await adapter.execute(command)
            except BoundaryRefusal as refusal:
                outcome = refusal.as_fact(command, adapter.clock())
            if isinstance(command, DISPATCH_COMMANDS) and isinstance(outcome, Replied):
                checkpoint("dispatch_answered")
            pending.append(outcome)
