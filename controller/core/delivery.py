"""The delivery protocol as a sans-IO machine: ledger facts in, envelopes and commands out.

One ``Delivery`` per intent. It owns no socket and no clock: the driver
(``tillerman.controller.dispatch.driver``) hands it a fact (``handle(fact)``; the facts are
in ``tillerman.controller.core.facts``) and gets an ``Output`` back — ledger envelopes to
append (intent transitions and evidence, built with
``tillerman.controller.core.intent_requests``) and adapter commands to execute, in that
order (``tillerman.controller.core.commands``). The machine's ``state`` is a cache of the
ledger's: if an append is refused (``IllegalTransition``) or conflicts, another
writer moved the intent first; the driver drops the commands and rebuilds the
machine from the ledger (``Delivery.from_view``). A server's reply reaches it as a typed
value (``tillerman.monitor.codex_wire`` reads the JSON; the adapter picks the parser by
command), so the machine never walks JSON and its tests need neither a server nor a ledger.

Theory of operation (docs/design.md "Intents: the delivery protocol"):

* ``Dispatch`` moves proposed → dispatch_unknown and asks for the one dispatch
  command. That output is ``durable``: the driver appends it with a full fsync and
  only then executes the command, so a crash can never leave a send unrecorded. The
  record carries an ``attempt`` token the adapter checks at its boundary: a second,
  stale machine cannot send a second copy.
* Nothing is ever resent. A timeout, a dropped connection or an unrecognized error
  (``tillerman.controller.core.rpc_errors``) is recorded as evidence and the intent stays
  dispatch_unknown: an accepted steer may be pending inside the server, invisible
  to any readback, until its turn ends. A second ``Dispatch`` does nothing.
* Steer: ``{"turnId"}`` → queued (accepted, not delivered). The ``userMessage``
  whose ``clientId`` is ours, in the expected turn, → acknowledged; if it comes
  before the reply it acknowledges straight from dispatch_unknown and the late
  reply is evidence. With an ``ack_token`` the echo is ``delivered`` evidence and
  acknowledged waits for the token in an agent message after ours. When the expected
  turn ends unsettled, a ``ReadBack`` of that turn decides: found → acknowledged
  (with a token: said after our message → acknowledged, not said → expired
  ``ack_token_missing``, reported); absent → expired ``not_delivered``
  (dispatch_unknown) or ``lost_after_accept`` (queued, reported). A refusal is
  final — a stale turn is never retried against the turn the server says is active —
  except for a steer that follows the active turn (``Intent.follows_active``, below).
  The token of a queued message is owed in the turn it started: that turn's end
  reads it back the same way.
* Steer that follows the active turn (``--expected-turn active``): the dispatch names the
  turn running at send time (``target_turn``), if the intent may follow to it
  (``Intent.may_follow_to``: the turn its proposal named, or one that started after the
  proposal). A definite ``stale_turn`` / ``no_active_turn`` refusal of that send (a
  refused steer adds nothing to the thread) is ``retarget_waiting`` evidence, not a
  rejection; the next ``Reconcile`` that brings an eligible running turn the intent was
  not refused for, no hazard, and a fresh attempt token writes a durable ``retargeted``
  record (from turn, to turn, why) and sends again to that turn — one send outstanding at
  a time, each under its own record, until ``expires_at`` (then rejected with the last
  refusal). The echo counts only in the turn the current send named.
* Queue: the server does not deduplicate by ``clientUserMessageId``, so the add is
  preceded by a ``QueueList``; our entry already there → queued, no add. The new
  turn's ``userMessage`` with our clientId → acknowledged (``queue_turn_started``);
  accepted with that echo unseen (the daemon subscribed after the turn's first items),
  the end of any turn but the one it waits behind reads the thread's turns back for it.
  An add of unknown outcome names no turn, so its "expected turn" is the one it waits
  behind: the turn active when it was dispatched (recorded as ``behind_turn``). The
  server drains its queue when that turn ends, so from then on the readback — the
  queue list, then the thread's turns — finds an add it received: still queued, or in
  the turn it started. Only then, with no turn of the thread still running, does
  absence mean ``not_delivered``. An add sent to an idle thread (no turn to wait
  behind) settles only when found. The ack deadline makes it overdue, never expired.
  A stop that deleted our entry from the server's queue (``Reconcile.withdrawn_by``)
  settles it ``expired withdrawn``, naming the stop: it can never start a turn.
* Interrupt: ``{}`` → queued; the target turn completed ``interrupted`` →
  acknowledged. Then the background terminals are listed and only those whose item
  started in THAT turn are terminated; each request, result and late
  ``item/completed`` is evidence. Our interrupt pauses the server's queue: a
  non-empty queue is reported, and resumed only when the intent asks.
* Effects: an item matching ``expect`` → action_started; the ``verify`` readback
  (run by the adapter in the thread's working directory, read at verify time)
  decides effect_verified / effect_failed; a directory nobody can name is
  effect_failed ``cwd_unknown`` (never a guess); past ``effect_deadline`` → expired.
"""

from __future__ import annotations

from tillerman.controller.core.commands import (
    DISPATCH_COMMANDS,
    Command,
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
from tillerman.controller.core.facts import (
    Dispatch,
    Evidence,
    Fact,
    NoAnswer,
    Observed,
    Reconcile,
    Refused,
    Replied,
    Tick,
    Verified,
    VerifyDue,
)
from tillerman.controller.core.intent_requests import SOURCE, evidence_envelope, transition_envelope
from tillerman.controller.core.rpc_errors import EvidenceValue, Refusal
from tillerman.ledger.events import (
    AgentMessage,
    Envelope,
    Event,
    ItemCompleted,
    ItemStarted,
    Report,
    TurnCompleted,
    UserMessage,
)
from tillerman.ledger.intent_states import State, check_transition, is_terminal
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import HistoryItem, IntentView
from tillerman.ledger.snapshot import ENDED_TURN_STATES
from tillerman.monitor.codex_wire import (
    InterruptAccepted,
    QueuedSubmission,
    QueueEntry,
    QueuePage,
    QueueStarted,
    SteerAccepted,
    Terminal,
    TerminalList,
    Terminated,
    Turn,
    TurnPage,
)

S = State
#: The machine's own findings for a person carry this reporter in place of a rule.
REPORTER, REPORTER_VERSION = "tillerman:delivery", 1
#: Turns scanned per readback page (newest first); an older turn pages on.
READBACK_PAGE = 20
_UNSETTLED = frozenset({S.DISPATCH_UNKNOWN, S.QUEUED})
_CHECKING = frozenset({S.ACKNOWLEDGED, S.ACTION_STARTED})
#: Refusals that say the turn a steer named is no longer the running one (and that the
#: steer added nothing): a steer that follows the active turn waits for the next.
_TURN_MOVED_ON = frozenset({Refusal.STALE_TURN, Refusal.NO_ACTIVE_TURN})



def expect_matches(expect: str, event: ItemStarted) -> bool:
    """``expect`` is ``field=value`` terms separated by spaces, all of which must hold, over
    ``item_type``, ``tool``, ``args_digest`` and ``item_id`` (e.g.
    ``item_type=commandExecution args_digest=sha256:…``). Observations keep digests, not
    command text, so a command is named by its digest. An unknown field never matches."""
    terms = [term.partition("=") for term in expect.split()]
    fields = {"item_type": event.item_type, "tool": event.tool, "args_digest": event.args_digest,
              "item_id": event.item_id}
    return bool(terms) and all(sep and name in fields and fields[name] == value for name, sep, value in terms)


class Delivery:
    """The delivery machine of one intent; see the module docstring."""

    def __init__(self, intent: Intent, state: State = S.PROPOSED, *, turn_items: frozenset[str] = frozenset()):
        self.intent = intent
        self.state = state
        self._goal_active = False  # the thread's goal, as the last fact said
        self._turn_items: set[str] = set(turn_items)  # items started in the expected turn
        self._awaiting_add = False  # queue mode: this machine listed the queue and may add once
        self._attempt: str | None = None  # the dispatch record this machine wrote
        self._delivered_in: str | None = None  # ack_token mode: the echo's turn, token pending
        self._ack_turn: str | None = None  # where it was acknowledged: its end triggers verify
        self._terminating: dict[str, str] = {}  # process id -> item id
        self._terminated_items: set[str] = set()
        self._exited: set[str] = set()  # terminated items whose late item/completed arrived
        self._recorded: set[str] = set()  # evidence keys written by this machine
        self._behind_turn: str | None = None  # queue: the turn active when the add was dispatched
        self._behind_ended = False  # ...and it has ended: the server drained its queue since
        # A steer that follows the active turn: the turn its current send names (None while
        # it waits for one), the turns the server refused it for, and why the last was.
        self._target_turn: str | None = intent.expected_turn_id
        self._refused_turns: set[str] = set()
        self._waiting: tuple[str, str] | None = None  # waiting after a refusal: (refused turn, why)
        # The turn the server said was running when it refused (``found_turn_id``): newer
        # than the refused one, so the next send may name it though the fold lags behind.
        self._found_turn: str | None = None
        self._retargets = 0

    @classmethod
    def from_view(cls, view: IntentView, *, turn_items: frozenset[str] = frozenset()) -> Delivery:
        """Rebuild from the ledger after a restart or a lost race."""
        machine = cls(view.intent, view.state, turn_items=turn_items)
        machine._behind_turn = behind_turn(view)
        machine._ack_turn = ack_turn(view)
        for item in view.history:
            if view.intent.follows_active_turn:
                machine._follow_record(item)
            if item.kind == "evidence" and item.reason == "delivered":
                machine._delivered_in = _str(item.evidence.get("turn_id"))
            elif item.kind == "evidence" and item.reason == "terminate_requested":
                machine._terminating[str(item.evidence["process_id"])] = str(item.evidence["item_id"])
                machine._terminated_items.add(str(item.evidence["item_id"]))
            elif item.kind == "evidence" and item.reason == "late_item_completed":
                machine._exited.add(str(item.evidence["item_id"]))
        return machine

    def _follow_record(self, item: HistoryItem) -> None:
        """Rebuild a following steer's target and refusals from one record of its history."""
        if item.kind == "transition" and item.state == S.DISPATCH_UNKNOWN:
            self._attempt, self._target_turn = _str(item.evidence.get("attempt")), _str(item.evidence.get("target_turn"))
        elif item.kind == "evidence" and item.reason == "retarget_waiting":
            refused = str(item.evidence.get("from_turn"))
            self._refused_turns.add(refused)
            self._target_turn, self._waiting = None, (refused, str(item.evidence.get("why")))
            self._found_turn = _str(item.evidence.get("found_turn_id"))
        elif item.kind == "evidence" and item.reason == "retargeted":
            self._attempt, self._target_turn = _str(item.evidence.get("attempt")), _str(item.evidence.get("to_turn"))
            self._waiting = None
            self._retargets = int(item.evidence.get("retarget") or 0)

    @property
    def client_id(self) -> str:
        return self.intent.client_user_message_id

    @property
    def expected_turn(self) -> str | None:
        """The turn this intent's send names: its expected turn, or for a steer that follows
        the active turn the one its current send named (None while it waits for one)."""
        return self._target_turn if self.intent.follows_active_turn else self.intent.expected_turn_id

    @property
    def finished(self) -> bool:
        """Settled for good, and no terminated process still owes its late item/completed:
        the driver may stop feeding this machine."""
        return is_terminal(self.state, self.intent) and self._terminated_items <= self._exited

    def handle(self, fact: Fact) -> Output:
        match fact:
            case Dispatch():
                return self._dispatch(fact)
            case Reconcile():
                return self._reconcile(fact)
            case Replied():
                return self._replied(fact)
            case Refused():
                return self._refused(fact)
            case NoAnswer():
                return self._no_answer(fact)
            case Observed():
                self._goal_active = fact.goal_active
                return self._observed(fact.event, fact.now)
            case VerifyDue():
                return self._out(commands=self._verify_command())
            case Verified():
                return self._verified(fact)
            case Tick():
                return self._tick(fact.now)
        raise TypeError(f"not a delivery fact: {fact!r}")

    # -- dispatch ---------------------------------------------------------------------

    def _dispatch(self, fact: Dispatch) -> Output:
        if self.state is not S.PROPOSED:
            return Output()  # already under way: never a second send
        intent = self.intent
        if intent.replayed:
            return self._out(self._move(S.REJECTED, "not_dispatchable", {"replayed": True}, fact.now))
        if intent.mode == "stop":
            # A stop has its own machine (tillerman.controller.core.stop), built for an
            # app-server thread; a transport that drives this one (tillerman claude) has no
            # goal to pause, and says so rather than half-stopping.
            return self._out(self._move(S.REJECTED, "not_dispatchable", {"mode": "stop", "machine": "delivery"},
                                        fact.now))
        following = intent.mode == "steer" and intent.follows_active_turn
        if intent.mode != "queue" and intent.expected_turn_id is None and not following:
            return self._out(self._move(S.REJECTED, "invalid", {"missing": "expected_turn_id"}, fact.now))
        evidence: dict[str, EvidenceValue] = {"attempt": fact.attempt, "mode": intent.mode}
        if following:
            if not self._may_follow_to(fact.active_turn, fact.active_turn_started_at):
                return Output()  # between turns, or only an older turn runs: wait for the next
            self._target_turn = evidence["target_turn"] = fact.active_turn
        if intent.mode == "queue":
            self._behind_turn = fact.active_turn
            evidence["behind_turn"] = fact.active_turn
        record = self._move(S.DISPATCH_UNKNOWN, "dispatching", evidence, fact.now)
        self._attempt = fact.attempt
        ids = {"intent_id": intent.id, "thread_id": intent.thread_id}
        command: Command
        if intent.mode == "steer":
            command = self._steer(fact.attempt)
        elif intent.mode == "interrupt":
            command = Interrupt(**ids, turn_id=intent.expected_turn_id, attempt=fact.attempt)
        else:
            # The list comes first: the server would run a second copy of our entry.
            self._awaiting_add = True
            command = QueueList(**ids)
        return Output((record,), (command,), durable=True)

    def _steer(self, attempt: str) -> Steer:
        return Steer(**self._ids(), expected_turn_id=self.expected_turn, client_user_message_id=self.client_id,
                     text=self.intent.delivered_text, attempt=attempt)

    def _may_follow_to(self, turn_id: str | None, started_at: float | None) -> bool:
        return self.intent.may_follow_to(turn_id, started_at) and turn_id not in self._refused_turns

    # -- following the active turn -----------------------------------------------------

    def _retarget_waiting(self, command: Steer, fact: Refused) -> Output:
        """The server refused the send for a turn that ended: nothing was added, so wait for
        the next turn (``_retarget``), unless the intent's time is up."""
        refusal = fact.refusal.value
        evidence = {"command": _kind(command), **fact.evidence}
        if fact.now >= self.intent.expires_at:
            return self._out(self._move(S.REJECTED, refusal, evidence, fact.now))
        self._refused_turns.add(command.expected_turn_id)
        self._target_turn, self._waiting = None, (command.expected_turn_id, refusal)
        self._found_turn = _str(fact.evidence.get("found_turn_id"))
        return self._out(self._evidence("retarget_waiting", {
            "from_turn": command.expected_turn_id, "why": refusal, "attempt": command.attempt, **evidence},
            f"retarget_waiting:{command.attempt}", fact.now))

    def _retarget(self, fact: Reconcile) -> Output:
        """Waiting after a refusal: send again to the turn running now, if the intent may
        follow to it, nothing holds a send, and the fact brings a fresh attempt token.

        The turn running now is the one the server named in its refusal, when it named
        one: that turn was running after the refused one, which the intent could follow
        to, so it started later still. The fold's running turn is used otherwise; under a
        goal thread's short turns the fold can lag far behind the server, and a steer that
        sent only to the fold's turn was refused turn after turn and never landed."""
        refused_turn, refusal = self._waiting
        if fact.now >= self.intent.expires_at:
            return self._out(self._move(S.REJECTED, refusal, {"retarget": "expires_at_passed"}, fact.now))
        found = self._found_turn if self._found_turn not in self._refused_turns else None
        target = found or fact.active_turn
        if fact.held_by is not None or fact.attempt is None \
                or (found is None and not self._may_follow_to(target, fact.active_turn_started_at)):
            return Output()
        self._retargets += 1
        record = self._evidence("retargeted", {
            "attempt": fact.attempt, "from_turn": refused_turn, "to_turn": target,
            "why": refusal, "retarget": self._retargets}, f"retargeted:{self._retargets}", fact.now)
        self._attempt, self._target_turn, self._waiting, self._found_turn = fact.attempt, target, None, None
        # Durable, like the first dispatch record: a crash never leaves a send unrecorded.
        return Output(record, (self._steer(fact.attempt),), durable=True)

    # -- replies ----------------------------------------------------------------------

    def _replied(self, fact: Replied) -> Output:
        command, now = fact.command, fact.now
        match command, fact.result:
            case Steer(), SteerAccepted(turn_id=turn_id):
                return self._accepted({"turn_id": turn_id}, now)
            case Interrupt(), InterruptAccepted():
                return self._accepted({}, now)
            case QueueAdd(), QueuedSubmission(id=submission_id):
                return self._accepted({"queued_submission_id": submission_id}, now)
            case QueueList(), QueuePage(entries=entries):
                return self._queue_listed(entries, now)
            case ReadBack(), TurnPage():
                return self._read_back(command, fact.result, now)
            case ListTerminals(), TerminalList(terminals=terminals):
                return self._terminals_listed(terminals, now)
            case Terminate(), Terminated(terminated=terminated):
                return self._out(self._evidence("terminated", {
                    "process_id": command.process_id, "item_id": command.item_id,
                    "terminated": terminated}, f"terminated:{command.process_id}", now))
            case ResumeQueue(), QueueStarted(turn_id=turn_id):
                return self._out(self._evidence("queue_resumed", {"turn_id": turn_id}, "queue_resumed", now))
        # The adapter reads each reply with its command's parser: a mismatch is our bug.
        raise TypeError(f"{type(fact.result).__name__} is no reply to {_kind(command)}")

    def _accepted(self, evidence: Evidence, now: float) -> Output:
        if self.state is S.DISPATCH_UNKNOWN:
            return self._out(self._move(S.QUEUED, "accepted", evidence, now))
        # The echo (or the interrupted turn's end) came first: the reply is late evidence.
        return self._out(self._evidence("late_reply", evidence, "late_reply", now))

    def _queue_listed(self, entries: tuple[QueueEntry, ...], now: float) -> Output:
        if self.intent.mode == "interrupt":
            return self._queue_paused(entries, now)
        if self.state is not S.DISPATCH_UNKNOWN:
            return Output()
        ours = [e for e in entries if e.client_user_message_id == self.client_id]
        awaiting_add, self._awaiting_add = self._awaiting_add, False
        if ours:
            return self._out(self._move(S.QUEUED, "accepted", {
                "queued_submission_id": ours[0].id, "found_in_queue": True, "copies": len(ours)}, now))
        if awaiting_add:
            return self._out(commands=(QueueAdd(**self._ids(), client_user_message_id=self.client_id,
                                                text=self.intent.delivered_text, attempt=self._attempt),))
        # Reconciling an add of unknown outcome: has its turn already started?
        return self._out(commands=(ReadBack(**self._ids(), client_id=self.client_id, turn_id=None),))

    def _queue_paused(self, entries: tuple[QueueEntry, ...], now: float) -> Output:
        if not entries:
            return Output()
        detail = {"entries": len(entries), "resume": self.intent.resume_queue}
        if self._goal_active and self.intent.resume_queue:
            detail["resumes_goal"] = True  # the queue's turn ends, and the active goal's turns follow
        envelopes = [self._report("queue_paused", detail, now),
                     *self._evidence("queue_paused", detail, "queue_paused", now)]
        commands = (ResumeQueue(**self._ids()),) if self.intent.resume_queue else ()
        return Output(tuple(envelopes), commands)

    def _read_back(self, command: ReadBack, page: TurnPage, now: float) -> Output:
        if self.state not in _UNSETTLED:
            return Output()
        if command.turn_id is None:
            for turn in page.turns:
                found = _client_item(turn, self.client_id)
                if found is not None:
                    return self._found(turn, found, now)
            running = any(turn.running for turn in page.turns)
            if self.state is S.QUEUED or not self._behind_ended or running:
                # Accepted and still waiting in the server's queue, or an add of unknown
                # outcome before the turn it waits behind ended (or while a turn it may
                # have started runs): it may still land. The overdue report covers a long
                # wait; the ack deadline never settles it.
                return Output()
            return self._absent({"turn_id": None, "turn_status": None, "behind_turn": self._behind_turn,
                                 "via": "readback"}, now)
        turn = next((t for t in page.turns if t.id == command.turn_id), None)
        if turn is None:
            if page.next_cursor is not None:
                return self._out(commands=(ReadBack(**self._ids(), client_id=self.client_id,
                                                    turn_id=command.turn_id, cursor=page.next_cursor),))
            return self._absent({"turn_id": command.turn_id, "turn_status": "not_in_history"}, now)
        found = _client_item(turn, self.client_id)
        if found is not None:
            return self._found(turn, found, now)
        if turn.running:
            return Output()  # still active: an accepted steer may be pending inside the server
        return self._absent({"turn_id": command.turn_id, "turn_status": turn.status}, now)

    def _found(self, turn: Turn, ours: int, now: float) -> Output:
        """Our user message is ``turn.items[ours]``."""
        turn_id, item_id = turn.id, turn.items[ours].id
        token = self.intent.ack_token
        if token is not None and _token_after(turn, ours, token):
            return self._out(self._acknowledge("ack_token", {"turn_id": turn_id, "via": "readback"}, now))
        if token is not None:
            delivered = self._delivered(turn_id, item_id, now)
            if turn.status not in ENDED_TURN_STATES:
                return self._out(delivered)  # the agent may still say it in this turn
            # Delivered, but the turn that took it ended without the agent saying the token.
            evidence = {"turn_id": turn_id, "turn_status": turn.status, "via": "readback"}
            return self._out(delivered, self._move(S.EXPIRED, "ack_token_missing", evidence, now),
                             self._report("ack_token_missing", evidence, now))
        reason = "readback_found" if self.state is S.DISPATCH_UNKNOWN else self._echo_reason()
        return self._out(self._acknowledge(reason, {"turn_id": turn_id, "item_id": item_id, "via": "readback"}, now))

    def _absent(self, evidence: dict[str, EvidenceValue], now: float) -> Output:
        if self.state is S.DISPATCH_UNKNOWN:
            return self._out(self._move(S.EXPIRED, "not_delivered", evidence, now))
        # Accepted, then dropped (an interrupt before the next model call): a person should know.
        return self._out(self._move(S.EXPIRED, "lost_after_accept", evidence, now),
                         self._report("lost_after_accept", evidence, now))

    def _terminals_listed(self, terminals: tuple[Terminal, ...], now: float) -> Output:
        ours = [t for t in terminals if t.item_id in self._turn_items and t.process_id is not None
                and t.process_id not in self._terminating]
        envelopes = list(self._evidence("terminals_listed", {
            "listed": len(terminals), "of_interrupted_turn": len(ours)}, f"terminals_listed:{now}", now))
        commands = []
        for terminal in ours:
            process_id, item_id = terminal.process_id, terminal.item_id
            self._terminating[process_id] = item_id
            self._terminated_items.add(item_id)
            envelopes += self._evidence("terminate_requested", {"process_id": process_id, "item_id": item_id},
                                        f"terminate_requested:{process_id}", now)
            commands.append(Terminate(**self._ids(), process_id=process_id, item_id=item_id,
                                      turn_id=self.intent.expected_turn_id))
        return Output(tuple(envelopes), tuple(commands))

    # -- refusals ---------------------------------------------------------------------

    def _refused(self, fact: Refused) -> Output:
        command, refusal = fact.command, fact.refusal.value
        evidence = {"command": _kind(command), **fact.evidence}
        # The list before a queue add is part of the dispatch: refused, nothing was added.
        refuses_delivery = isinstance(command, DISPATCH_COMMANDS) or (
            isinstance(command, QueueList) and self._awaiting_add)
        self._awaiting_add = False
        if isinstance(command, Steer) and self.intent.follows_active_turn and command.attempt != self._attempt:
            refuses_delivery = False  # an earlier send's: the current one is still under way
        elif self.state is S.DISPATCH_UNKNOWN and isinstance(command, Steer) and self.intent.follows_active_turn \
                and fact.refusal in _TURN_MOVED_ON:
            return self._retarget_waiting(command, fact)
        if self.state is S.DISPATCH_UNKNOWN and refuses_delivery:
            # Definite and final: a stale turn is never retried against the one found.
            return self._out(self._move(S.REJECTED, refusal, evidence, fact.now))
        return self._out(self._evidence(f"{_kind(command)}_refused", {"refusal": refusal, **evidence},
                                        f"refused:{_kind(command)}:{fact.now}", fact.now))

    def _no_answer(self, fact: NoAnswer) -> Output:
        """Outcome unknown: evidence only. Never a resend; not even the add after a failed list."""
        self._awaiting_add = False
        return self._out(self._evidence(fact.cause, {"command": _kind(fact.command), **fact.evidence},
                                        f"no_answer:{_kind(fact.command)}:{fact.now}", fact.now))

    # -- observations -----------------------------------------------------------------

    def _observed(self, event: Event, now: float) -> Output:
        if event.thread_id != self.intent.thread_id:
            return Output()
        match event:
            case UserMessage() if event.client_id == self.client_id:
                return self._echo(event.turn_id, event.item_id, now)
            case AgentMessage() if self._delivered_in is not None and self._says_token(event):
                if self.state in _UNSETTLED:
                    return self._out(self._acknowledge("ack_token", {"turn_id": event.turn_id,
                                                                     "item_id": event.item_id}, now))
            case TurnCompleted():
                return self._turn_completed(event, now)
            case ItemStarted():
                return self._item_started(event, now)
            case ItemCompleted() if self._interrupted_turn_ended() and event.item_id in self._turn_items:
                if event.item_id in self._terminated_items:
                    self._exited.add(event.item_id)
                return self._out(self._evidence("late_item_completed", {
                    "item_id": event.item_id, "status": event.status, "exit_code": event.exit_code},
                    f"late_item_completed:{event.item_id}", now))
        return Output()

    def _says_token(self, event: AgentMessage) -> bool:
        """The ack token in an agent message: an intent id is detected at ingestion; any
        other text is visible only when payloads are retained (else the readback at the
        turn's end looks for it)."""
        token = self.intent.ack_token
        return token is not None and (token in event.ack_tokens or token in (event.text or ""))

    def _interrupted_turn_ended(self) -> bool:
        return self.intent.mode == "interrupt" and self.state not in _UNSETTLED and self.state is not S.PROPOSED

    def _echo(self, turn_id: str | None, item_id: str | None, now: float) -> Output:
        evidence = {"turn_id": turn_id, "item_id": item_id}
        if self.intent.mode == "steer" and turn_id != self.expected_turn:
            return self._out(self._evidence("echo_in_other_turn", evidence, f"echo:{item_id}", now))
        if self.state not in _UNSETTLED:
            # A second echo, or one after the intent settled: evidence, never a refusal.
            return self._out(self._evidence("echo", evidence, f"echo:{item_id}", now))
        if self.intent.ack_token is not None:
            return self._out(self._delivered(turn_id, item_id, now))
        return self._out(self._acknowledge(self._echo_reason(), evidence, now))

    def _echo_reason(self) -> str:
        if self.intent.mode == "queue" and self.state is S.QUEUED:
            return "queue_turn_started"
        return "echo"

    def _delivered(self, turn_id: str | None, item_id: str | None, now: float) -> tuple[Envelope, ...]:
        if self._delivered_in is not None:
            return ()
        self._delivered_in = turn_id or ""
        return self._evidence("delivered", {"turn_id": turn_id, "item_id": item_id}, "delivered", now)

    def _turn_completed(self, event: TurnCompleted, now: float) -> Output:
        if event.turn_id is not None and event.turn_id == self._behind_turn:
            self._behind_ended = True
        if event.turn_id is not None and event.turn_id == self.expected_turn and self.state in _UNSETTLED:
            return self._expected_turn_ended(event.status, now)
        if event.turn_id is not None and event.turn_id == self._delivered_in and self.state in _UNSETTLED:
            return self._out(commands=(self._read_back_token(),))  # queue: the turn our message started
        if event.turn_id is not None and event.turn_id == self._ack_turn and self.intent.mode != "interrupt":
            return self._out(commands=self._verify_command())
        if self.intent.mode == "queue" and self.state is S.QUEUED and self._delivered_in is None \
                and event.turn_id != self._behind_turn:
            # Our accepted message may have started this turn with its echo unseen: the
            # daemon subscribes to a thread at its `active` status, and the turn's first
            # items can go by before that resume (after a reconnect, under load). Its end
            # is seen (live, or in the resume's page), so the turns are read for our message.
            return self._out(commands=(ReadBack(**self._ids(), client_id=self.client_id, turn_id=None),))
        return Output()

    def _expected_turn_ended(self, status: str, now: float) -> Output:
        """The expected turn ended with this intent unsettled (or a restart found it ended)."""
        evidence = {"turn_id": self.expected_turn, "turn_status": status}
        if self.intent.mode == "interrupt":
            if status == "interrupted":
                # One turn ended; on a goal thread Codex starts the next unless the goal is
                # paused (a stop does that): the evidence says the work goes on.
                evidence |= {"goal_active": True} if self._goal_active else {}
                out = self._out(self._acknowledge("turn_interrupted", evidence, now))
                return Output(out.envelopes, (ListTerminals(**self._ids()), QueueList(**self._ids())))
            # It ended on its own: our interrupt did not end it.
            return self._absent(evidence, now)
        if self.intent.mode != "steer":
            return Output()
        # Our message landed or not, the token said or not: the turn's history decides.
        return self._out(commands=(ReadBack(**self._ids(), client_id=self.client_id,
                                            turn_id=self.expected_turn),))

    def _read_back_token(self) -> ReadBack:
        """The turn that took our message (token still owed) ended: did the agent say it?"""
        return ReadBack(**self._ids(), client_id=self.client_id, turn_id=self._delivered_in or None)

    def _item_started(self, event: ItemStarted, now: float) -> Output:
        if event.turn_id == self.intent.expected_turn_id and event.turn_id is not None:
            self._turn_items.add(event.item_id)
        expect = self.intent.expect
        if self.state is S.ACKNOWLEDGED and expect is not None and expect_matches(expect, event):
            return self._out(self._move(S.ACTION_STARTED, "expect_matched",
                                        {"item_id": event.item_id, "item_type": event.item_type}, now))
        return Output()

    # -- reconcile --------------------------------------------------------------------

    def _reconcile(self, fact: Reconcile) -> Output:
        self._turn_items |= fact.turn_items
        self._goal_active = fact.goal_active
        if self._behind_turn is not None and fact.behind_turn_state in ENDED_TURN_STATES:
            self._behind_ended = True
        if self.state not in _UNSETTLED:
            return Output()
        mode = self.intent.mode
        if fact.withdrawn_by is not None and mode == "queue":
            return self._out(self._move(S.EXPIRED, "withdrawn", {"stop_intent_id": fact.withdrawn_by}, fact.now))
        if self._waiting is not None and self.state is S.DISPATCH_UNKNOWN and fact.echo_turn_id is None:
            return self._retarget(fact)
        if fact.echo_turn_id is not None and mode != "interrupt":
            echoed = self._echo(fact.echo_turn_id, None, fact.now)
            if self._delivered_in is not None and fact.echo_turn_state in ENDED_TURN_STATES:
                return Output(echoed.envelopes, (self._read_back_token(),))
            return echoed
        if mode == "queue":
            # Never re-add: look for the entry, then for the turn it may have started
            # (a restart may have missed that turn's start, and with it the echo).
            if self.state is S.DISPATCH_UNKNOWN:
                return self._out(commands=(QueueList(**self._ids()),))
            return self._out(commands=(ReadBack(**self._ids(), client_id=self.client_id, turn_id=None),))
        if fact.expected_turn_state in ENDED_TURN_STATES:
            return self._expected_turn_ended(fact.expected_turn_state, fact.now)
        return Output()  # the expected turn is still active: the echo or its end will settle it

    # -- effects ----------------------------------------------------------------------

    def _verify_command(self) -> tuple[Command, ...]:
        verify = self.intent.verify
        ready = self.state is S.ACTION_STARTED or (self.state is S.ACKNOWLEDGED and self.intent.expect is None)
        if verify is None or not ready:
            return ()
        return (RunVerify(**self._ids(), command=verify),)

    def _verified(self, fact: Verified) -> Output:
        if self.state not in _CHECKING:
            return Output()
        if fact.cwd_digest is None:
            # Run elsewhere, the readback would check the wrong tree: no guessing.
            return self._out(self._move(S.EFFECT_FAILED, "cwd_unknown", {"exit_code": None}, fact.now))
        where = {"cwd_digest": fact.cwd_digest} | ({"cwd": fact.cwd} if fact.cwd is not None else {})
        if fact.exit_code is None:
            evidence = where | ({"error": fact.error} if fact.error is not None else {})
            return self._out(self._evidence("verify_inconclusive", evidence, f"verify_inconclusive:{fact.now}",
                                            fact.now))
        passed = fact.exit_code == 0
        return self._out(self._move(S.EFFECT_VERIFIED if passed else S.EFFECT_FAILED,
                                    "verify_passed" if passed else "verify_failed",
                                    {"exit_code": fact.exit_code, **where}, fact.now))

    def _tick(self, now: float) -> Output:
        deadline = self.intent.effect_deadline
        if self.state in _CHECKING and self.intent.has_check and deadline is not None and now >= deadline:
            return self._out(self._move(S.EXPIRED, "effect_deadline_passed", {"effect_deadline": deadline}, now))
        return Output()

    # -- building output --------------------------------------------------------------

    def _ids(self) -> dict[str, str]:
        return {"intent_id": self.intent.id, "thread_id": self.intent.thread_id}

    def _move(self, to: State, reason: str, evidence: Evidence, now: float) -> Envelope:
        # The machine checks its own moves against the table: a move it must not make is
        # its bug, found here, not first when the ledger refuses the append.
        check_transition(self.state, to, reason)
        envelope = transition_envelope(self.intent, self.state, to, reason, evidence, now)
        self.state = to
        return envelope

    def _acknowledge(self, reason: str, evidence: Evidence, now: float) -> Envelope:
        self._ack_turn = _str(evidence.get("turn_id"))
        return self._move(S.ACKNOWLEDGED, reason, evidence, now)

    def _evidence(self, reason: str, evidence: Evidence, key: str, now: float) -> tuple[Envelope, ...]:
        if key in self._recorded:
            return ()  # the same fact seen twice (two sources, a repeated list)
        self._recorded.add(key)
        return (evidence_envelope(self.intent, self.state, reason, evidence, key, now),)

    def _report(self, finding: str, detail: Evidence, now: float) -> Envelope:
        report = Report(thread_id=self.intent.thread_id, turn_id=self.intent.expected_turn_id,
                        rule_id=REPORTER, rule_version=REPORTER_VERSION, finding=finding,
                        detail={"intent_id": self.intent.id, **detail})
        return Envelope(event_id=f"report:{self.intent.id}:{finding}", event=report, source=SOURCE, at=now)

    @staticmethod
    def _out(*envelopes: Envelope | tuple[Envelope, ...], commands: tuple[Command, ...] = ()) -> Output:
        flat: list[Envelope] = []
        for item in envelopes:
            flat.extend(item if isinstance(item, tuple) else (item,))
        return Output(tuple(flat), commands)


# -- reading the record and the replies -------------------------------------------------


def behind_turn(view: IntentView) -> str | None:
    """The turn a queue intent's add waits behind, from its dispatch record."""
    return next((_str(item.evidence.get("behind_turn")) for item in view.history
                 if item.kind == "transition" and item.state == S.DISPATCH_UNKNOWN), None)


def dispatch_record(view: IntentView) -> tuple[str | None, str | None] | None:
    """The latest record a send must belong to, as (attempt, the turn it names): the
    dispatch transition, or a following steer's latest ``retargeted`` evidence; None
    before dispatch."""
    following = view.intent.follows_active_turn
    found = None
    for item in view.history:
        if item.kind == "transition" and item.state == S.DISPATCH_UNKNOWN:
            turn = _str(item.evidence.get("target_turn")) if following else view.intent.expected_turn_id
            found = (_str(item.evidence.get("attempt")), turn)
        elif following and item.kind == "evidence" and item.reason == "retargeted":
            found = (_str(item.evidence.get("attempt")), _str(item.evidence.get("to_turn")))
    return found


def target_turn(view: IntentView) -> str | None:
    """The turn an intent's delivery names now: its expected turn, or for a steer that
    follows the active turn the one its current send named (None while it waits)."""
    if not view.intent.follows_active_turn:
        return view.intent.expected_turn_id
    return Delivery.from_view(view).expected_turn


def ack_turn(view: IntentView) -> str | None:
    """The turn the intent was acknowledged in, from its record: that turn's end is when
    the agent is done with our message, and the ``verify`` readback may run."""
    return next((_str(item.evidence.get("turn_id")) for item in view.history
                 if item.kind == "transition" and item.state == S.ACKNOWLEDGED), None)


def _kind(command: Command) -> str:
    return type(command).__name__


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _client_item(turn: Turn, client_id: str) -> int | None:
    """Where in the turn our user message is (the first with our clientId), if it is there."""
    return next((index for index, item in enumerate(turn.items)
                 if item.type == "userMessage" and item.client_id == client_id), None)


def _token_after(turn: Turn, ours: int, token: str) -> bool:
    """Whether an agent message after our user message carries the ack token."""
    return any(item.type == "agentMessage" and token in (item.text or "") for item in turn.items[ours + 1:])
