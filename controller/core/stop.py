"""A stop: "this thread does no more work until a person resumes it", as a sans-IO machine.

An interrupt ends one turn; on a thread with a Codex goal the server starts the next
turn a few milliseconds later, and a resumed queue or any client's ``thread/resume``
wakes the goal again. A stop (``--mode stop``) targets the thread. Its steps, each a
command the adapter carries out and each preceded by a read of what it changes:

1. ``ReadGoal`` (``thread/goal/get``); an active goal → ``PauseGoal``
   (``thread/goal/set status=paused``, with ``origin``), recorded as ``goal_updated``
   ``by="tillerman"``. No goal (or a release without goals: the read is refused) →
   nothing to pause, and the evidence says so.
2. ``QueueList``; each entry of tillerman's own (its ``clientUserMessageId`` names an
   intent) → ``QueueDelete``. Messages queued by anyone else stay: they are a person's.
3. ``ReadTurns``; a running turn → ``Interrupt`` it, then wait for its end.
4. ``ListTerminals`` → ``Terminate`` every background terminal of the thread (an
   interrupt ends only its own turn's: a stopped thread runs no command at all).
5. → acknowledged ``stop_applied``; then, ``SETTLE`` seconds later, ``ReadTurns`` +
   ``ReadGoal`` again: no turn running and no active goal → ``effect_verified``
   ``stop_verified``. Work found (a turn that started meanwhile, a goal set active
   again) → ``work_found`` evidence and the steps again, at most ``STOP_ROUNDS``
   readbacks, then ``effect_failed`` ``still_working`` and a report.

Why the readback waits: Codex starts a goal's next turn 5–10 ms after a turn ends, and a
pause that lands in that gap does not undo a start already decided. That turn appears
after the pause, and without the wait it could appear after a readback made at once,
which would then verify a thread about to work. After ``SETTLE`` seconds it is found
running (or done) and the steps end it.

Idempotent by construction: every step reads before it writes, and every write is
harmless when repeated — pausing a paused goal changes nothing (measured on 0.171.0),
deleting a message already gone answers ``{"deleted": false}``, an interrupt with no
turn running is refused ``no_active_turn`` (and a second interrupt of a turn already
being interrupted ends the same turn), terminating a process that exited is refused.
So nothing waits on an outcome that is unknown: a timeout, a lost connection or a
restart (``Reconcile`` on a fresh machine) starts the steps again from the first read,
never by resending a write blindly. Every write goes out under the durable dispatch
record's ``attempt`` (the boundary checks it), as a steer's does.
"""

from __future__ import annotations

from tillerman.controller.core.commands import (
    Command,
    Interrupt,
    ListTerminals,
    Output,
    PauseGoal,
    QueueDelete,
    QueueList,
    ReadGoal,
    ReadTurns,
    Terminate,
)
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch, Fact, NoAnswer, Observed, Reconcile, Refused, Replied, Tick
from tillerman.controller.core.intent_requests import SOURCE
from tillerman.ledger.events import Envelope, GoalUpdated, TurnCompleted
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import client_id_to_intent_id
from tillerman.ledger.projections import IntentView
from tillerman.ledger.snapshot import GOAL_ACTIVE
from tillerman.monitor.codex_wire import Goal, QueueDeleted, QueuePage, TerminalList, Terminated, TurnPage
from tillerman.monitor.digest import digest

S = State
#: Readbacks that may find work again before the stop is failed (``still_working``).
STOP_ROUNDS = 3
#: Seconds a step may wait for its answer (or a sent interrupt for its turn's end)
#: before a ``Reconcile`` starts the steps again from the first read.
RECHECK_AFTER = 5.0
#: Seconds between the steps and the verifying readback: a continuation turn Codex had
#: decided to start before the pause reached it has started by then, even on a loaded
#: machine (it starts 5–10 ms after the previous turn's end).
SETTLE = 1.0
#: The reason recorded with each readback that found work.
WORK_FOUND = "work_found"
_STEPPING = frozenset({S.DISPATCH_UNKNOWN, S.ACKNOWLEDGED})
_UNREAD = object()  # a readback answer not in yet


def goal_origin(producer: str) -> str:
    """What a stop tells Codex about who paused the goal: a person's request is "user",
    a rule's is "automatic" (Codex's two ``ThreadGoalMutationOrigin`` values)."""
    return "automatic" if producer.startswith("rule:") else "user"


def stop_attempt(view: IntentView) -> str | None:
    """The attempt token of a stop's durable dispatch record: every write of the stop goes
    out under it, and only while the ledger shows the stop under way."""
    return next((str(h.evidence.get("attempt")) for h in view.history
                 if h.kind == "transition" and h.state == S.DISPATCH_UNKNOWN), None)


def machine_from_view(view: IntentView, *, turn_items: frozenset[str] = frozenset()) -> Delivery:
    """The delivery machine of an intent rebuilt from the ledger: a stop's, or the one
    every other mode has (``Delivery.from_view``)."""
    if view.intent.mode == "stop":
        return StopDelivery.from_view(view)
    return Delivery.from_view(view, turn_items=turn_items)


class StopDelivery(Delivery):
    """The delivery machine of one stop intent; see the module docstring."""

    def __init__(self, intent, state: State = S.PROPOSED, *, attempt: str | None = None, rounds: int = 0):
        super().__init__(intent, state)
        self._attempt = attempt
        self._rounds = rounds  # readbacks that found work so far
        self._step: str | None = None  # the step in flight; None: a Reconcile starts them
        self._step_at = 0.0
        self._outstanding: set[str] = set()  # deletes or terminates still unanswered
        self._interrupting: str | None = None  # the turn our interrupt ends
        self._readback: dict[str, object] = {}  # the verifying readback's answers so far

    @classmethod
    def from_view(cls, view: IntentView, *, turn_items: frozenset[str] = frozenset()) -> StopDelivery:
        rounds = sum(1 for h in view.history if h.kind == "evidence" and h.reason == WORK_FOUND)
        return cls(view.intent, view.state, attempt=stop_attempt(view), rounds=rounds)

    @property
    def finished(self) -> bool:
        return self.state in (S.EFFECT_VERIFIED, S.EFFECT_FAILED, S.EXPIRED, S.REJECTED)

    def handle(self, fact: Fact) -> Output:
        match fact:
            case Dispatch():
                return self._dispatch_stop(fact)
            case Reconcile():
                return self._reconcile_stop(fact.now)
            case Replied():
                return self._replied_stop(fact.command, fact.result, fact.now)
            case Refused():
                return self._refused_stop(fact)
            case NoAnswer():
                # Outcome unknown: nothing is resent; the next Reconcile reads again.
                self._step = None
                return self._out(self._evidence(fact.cause, {"command": type(fact.command).__name__, **fact.evidence},
                                                f"no_answer:{type(fact.command).__name__}:{fact.now}", fact.now))
            case Observed(event=TurnCompleted() as ended) if self._ends_our_interrupt(ended):
                return self._turn_ended(ended, fact.now)
            case Tick():
                return self._tick(fact.now)
        return Output()

    # -- the steps --------------------------------------------------------------------

    def _dispatch_stop(self, fact: Dispatch) -> Output:
        if self.state is not S.PROPOSED:
            return Output()  # already under way
        if self.intent.replayed:
            return self._out(self._move(S.REJECTED, "not_dispatchable", {"replayed": True}, fact.now))
        record = self._move(S.DISPATCH_UNKNOWN, "dispatching", {
            "attempt": fact.attempt, "mode": "stop", "running_turn": fact.active_turn}, fact.now)
        self._attempt = fact.attempt
        return Output((record,), self._begin(fact.now), durable=True)

    def _reconcile_stop(self, now: float) -> Output:
        if self.state not in _STEPPING or self._attempt is None:
            return Output()
        if self._step is not None and now - self._step_at < RECHECK_AFTER:
            return Output()  # a step is under way (or an interrupt's turn is ending)
        return self._out(commands=self._begin(now))

    def _begin(self, now: float) -> tuple[Command, ...]:
        if self.state is S.ACKNOWLEDGED:
            return self._verify(now)  # the steps were carried out: read back what they did
        return self._go("goal", now, ReadGoal(**self._ids()))

    def _go(self, step: str, now: float, *commands: Command) -> tuple[Command, ...]:
        self._step, self._step_at = step, now
        self._outstanding.clear()
        return commands

    def _withdraw(self, now: float) -> tuple[Command, ...]:
        return self._go("queue", now, QueueList(**self._ids()))

    def _find_running(self, now: float) -> tuple[Command, ...]:
        return self._go("turns", now, ReadTurns(**self._ids()))

    def _terminate_all(self, now: float) -> tuple[Command, ...]:
        return self._go("terminals", now, ListTerminals(**self._ids()))

    def _verify(self, now: float) -> tuple[Command, ...]:
        self._readback = {}
        settled = now + SETTLE
        return self._go("verify", now, ReadTurns(**self._ids(), verifying=True, not_before=settled),
                        ReadGoal(**self._ids(), verifying=True, not_before=settled))

    # -- answers ----------------------------------------------------------------------

    def _replied_stop(self, command: Command, result: object, now: float) -> Output:
        if self.state not in _STEPPING:
            return Output()
        match command, result:
            case ReadGoal(verifying=True), Goal():
                return self._read_back(goal=result.status, now=now)
            case ReadGoal(), Goal(status=status):
                if status == GOAL_ACTIVE:
                    return self._out(commands=self._go("pause", now, PauseGoal(
                        **self._ids(), origin=goal_origin(self.intent.producer), attempt=self._attempt)))
                return self._out(self._evidence("goal_read", {"goal_status": status}, f"goal_read:{now}", now),
                                 commands=self._withdraw(now))
            case PauseGoal(), Goal():
                return self._out(self._goal_paused(command, result, now), commands=self._withdraw(now))
            case QueueList(), QueuePage(entries=entries):
                return self._queue_listed(entries, now)
            case QueueDelete(), QueueDeleted(deleted=deleted):
                evidence = {"intent_id": command.withdrawn_intent_id, "submission_id": command.submission_id,
                            "deleted": deleted}
                return self._answered(command.submission_id, self._evidence(
                    "queue_withdrawn", evidence, f"queue_withdrawn:{command.submission_id}:{now}", now),
                    then=self._find_running, now=now)
            case ReadTurns(verifying=True), TurnPage():
                return self._read_back(turn=_running(result), now=now)
            case ReadTurns(), TurnPage():
                running = _running(result)
                if running is None:
                    return self._out(commands=self._terminate_all(now))
                self._interrupting = running
                return self._out(commands=self._go("interrupt", now, Interrupt(
                    **self._ids(), turn_id=running, attempt=self._attempt)))
            case Interrupt(), _:
                # The turn's end (observed) moves on; until then the reply is evidence.
                return self._out(self._evidence("interrupt_accepted", {"turn_id": command.turn_id},
                                                f"interrupt_accepted:{command.turn_id}", now))
            case ListTerminals(), TerminalList(terminals=terminals):
                return self._terminals_listed_stop(terminals, now)
            case Terminate(), Terminated(terminated=terminated):
                return self._answered(command.process_id, self._evidence(
                    "terminated", {"process_id": command.process_id, "item_id": command.item_id,
                                   "terminated": terminated}, f"terminated:{command.process_id}", now),
                    then=self._applied, now=now)
        raise TypeError(f"{type(result).__name__} is no reply to a stop's {type(command).__name__}")

    def _goal_paused(self, command: PauseGoal, goal: Goal, now: float) -> tuple[Envelope, ...]:
        """The pause is tillerman's own change to the goal: recorded as the goal's new state,
        ``by="tillerman"``, with the origin the request gave (Codex does not echo it)."""
        update = GoalUpdated(
            thread_id=self.intent.thread_id, status=goal.status or "paused",
            objective_digest=digest(goal.objective) if goal.objective is not None else None,
            origin=command.origin, token_budget=goal.token_budget, tokens_used=goal.tokens_used,
            time_used_seconds=goal.time_used_seconds, by="tillerman")
        return (Envelope(event_id=f"{self.intent.id}:goal_paused:{now}", event=update, source=SOURCE, at=now),
                *self._evidence("goal_paused", {"goal_status": goal.status, "origin": command.origin},
                                f"goal_paused:{now}", now))

    def _queue_listed(self, entries, now: float) -> Output:
        ours = [(e.id, client_id_to_intent_id(e.client_user_message_id)) for e in entries]
        ours = [(submission, intent_id) for submission, intent_id in ours if intent_id is not None]
        evidence = self._evidence("queue_checked", {"entries": len(entries), "ours": len(ours)},
                                  f"queue_checked:{now}", now)
        if not ours:
            return self._out(evidence, commands=self._find_running(now))
        commands = self._go("withdraw", now, *(QueueDelete(**self._ids(), submission_id=submission,
                                                           withdrawn_intent_id=intent_id, attempt=self._attempt)
                                               for submission, intent_id in ours))
        self._outstanding = {submission for submission, _ in ours}
        return self._out(evidence, commands=commands)

    def _terminals_listed_stop(self, terminals, now: float) -> Output:
        running = [t for t in terminals if t.process_id is not None]
        envelopes = list(self._evidence("terminals_listed", {"listed": len(terminals)}, f"terminals_listed:{now}",
                                        now))
        if not running:
            return self._applied(now, envelopes)
        commands = self._go("terminate", now, *(Terminate(**self._ids(), process_id=t.process_id,
                                                          item_id=t.item_id or "", turn_id=self._interrupting or "")
                                                for t in running))
        self._outstanding = {t.process_id for t in running}
        for t in running:
            envelopes += self._evidence("terminate_requested", {"process_id": t.process_id, "item_id": t.item_id},
                                        f"terminate_requested:{t.process_id}:{now}", now)
        return Output(tuple(envelopes), commands)

    def _answered(self, key: str, envelopes: tuple[Envelope, ...], *, then, now: float) -> Output:
        """One of several deletes or terminates came back; the next step once all have."""
        self._outstanding.discard(key)
        if self._outstanding:
            return self._out(envelopes)
        following = then(now)
        if isinstance(following, Output):
            return _joined(self._out(envelopes), following)
        return self._out(envelopes, commands=following)

    def _ends_our_interrupt(self, event: TurnCompleted) -> bool:
        return (event.thread_id == self.intent.thread_id and event.turn_id is not None
                and event.turn_id == self._interrupting and self._step == "interrupt")

    def _turn_ended(self, event: TurnCompleted, now: float) -> Output:
        self._interrupting = None
        evidence = self._evidence("turn_ended", {"turn_id": event.turn_id, "turn_status": event.status},
                                  f"turn_ended:{event.turn_id}", now)
        return self._out(evidence, commands=self._terminate_all(now))

    def _applied(self, now: float, envelopes: list[Envelope] | tuple[Envelope, ...] = ()) -> Output:
        """Every step carried out: acknowledged (once), then the verifying readback."""
        moved = () if self.state is S.ACKNOWLEDGED else (self._move(S.ACKNOWLEDGED, "stop_applied", {}, now),)
        return self._out(tuple(envelopes), *moved, commands=self._verify(now))

    def _read_back(self, *, now: float, goal: object = _UNREAD, turn: object = _UNREAD) -> Output:
        """One of the verifying readback's two answers; the verdict once both are in."""
        if goal is not _UNREAD:
            self._readback["goal_status"] = goal
        if turn is not _UNREAD:
            self._readback["running_turn"] = turn
        if len(self._readback) < 2:
            return Output()
        found = dict(self._readback)
        self._step = None
        if found["running_turn"] is None and found["goal_status"] != GOAL_ACTIVE:
            return self._out(self._move(S.EFFECT_VERIFIED, "stop_verified", found, now))
        self._rounds += 1
        evidence = self._evidence(WORK_FOUND, {**found, "round": self._rounds}, f"{WORK_FOUND}:{self._rounds}", now)
        if self._rounds >= STOP_ROUNDS:
            return self._out(evidence, self._move(S.EFFECT_FAILED, "still_working", found, now),
                             self._report("still_working", found, now))
        return self._out(evidence, commands=self._go("goal", now, ReadGoal(**self._ids())))

    # -- refusals ---------------------------------------------------------------------

    def _refused_stop(self, fact: Refused) -> Output:
        command, refusal, now = fact.command, fact.refusal.value, fact.now
        name = type(command).__name__
        evidence = self._evidence(f"{name}_refused", {"refusal": refusal, **fact.evidence},
                                  f"refused:{name}:{now}", now)
        if self.state not in _STEPPING:
            return Output()
        if refusal == "thread_not_found" and self.state is S.DISPATCH_UNKNOWN:
            return self._out(self._move(S.REJECTED, "thread_not_found", {"command": name, **fact.evidence}, now))
        match command:
            case ReadGoal(verifying=True):
                return _joined(self._out(evidence), self._read_back(goal=None, now=now))
            case ReadGoal() | PauseGoal():
                # No goal to pause (none, cleared meanwhile, or a release without goals):
                # the stop is the interrupt and the withdrawal; the readback checks again.
                return self._out(evidence, commands=self._withdraw(now))
            case QueueDelete():
                return self._answered(command.submission_id, evidence, then=self._find_running, now=now)
            case Interrupt() if refusal == "no_active_turn":
                self._interrupting = None  # it ended between the read and the interrupt
                return self._out(evidence, commands=self._terminate_all(now))
            case Terminate():
                return self._answered(command.process_id, evidence, then=self._applied, now=now)
        # Held at the boundary (a hazard, a revoked grant) or refused otherwise: the next
        # Reconcile starts the steps again, judged again.
        self._step = None
        return self._out(evidence)


def _running(page: TurnPage) -> str | None:
    """The turn the listing shows running (a settled listing: a turn still listed
    ``interrupted`` without an end time has ended, ``turn_listing``)."""
    return next((turn.id for turn in page.turns if turn.running), None)


def _joined(first: Output, second: Output) -> Output:
    return Output(first.envelopes + second.envelopes, first.commands + second.commands, first.durable or second.durable)
