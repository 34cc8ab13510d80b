"""One decision round, written once: the daemon and replay both drive it.

A round folds what was recorded (``fold``) and decides (``decide``): the detection rules
where one can fire (``Step.step``), what review answers lead to, the policy for the open
intents (``Step.decide_intents``), and which review checkpoints are due. It returns what
to carry out. What it records goes through the one port it is given, ``append``: the
ledger numbers the rows (and drops a duplicate), so the round folds the rows the port
returns, never what it meant to write. It has no socket, file or clock of its own: the
daemon gives it its ledger and the wall clock, replay a ledger and its virtual clock,
and the daemon's round and replay's are one code path (Temporal's replayer runs the
worker's own code for the same reason).

A fold has no side effect. A new observation on a thread where a delivery waits
(``delivering``) becomes a fact for that delivery (``observed``), queued in order with
the driver's own (``carry``) until the driver takes them (``take``): the daemon carries
them out after the round's commit, never inside the round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import msgspec

from tillerman.controller.core.reconcile import observed
from tillerman.controller.core.supervisor import Step
from tillerman.controller.core.watches import Watches
from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import IntentView, Projection
from tillerman.rules.decision import Decision
from tillerman.rules.detect import triggers_may_find
from tillerman.rules.ruleset import RuleSet

#: What a delivery machine waits to see on its thread (``tillerman.controller.core.delivery``).
DELIVERY_EVENTS = (ev.UserMessage, ev.AgentMessage, ev.TurnCompleted, ev.TurnStarted, ev.ItemStarted,
                   ev.ItemCompleted)

#: Append envelopes; the rows to fold, in seq order: those written (a duplicate is not),
#: and before them any row another writer committed past the fold meanwhile.
Append = Callable[[list[Envelope]], Iterable[Entry]]
#: The intents whose deliveries wait on a thread for what is observed there.
Delivering = Callable[[str], Sequence[Intent]]
#: The facts one decision leads to for its intent's delivery, as (intent id, fact).
Carry = tuple[str, object]


class Reviews(Protocol):
    """What a round asks of review checkpoints
    (``tillerman.controller.review.checkpoints.Checkpoints``: the reviews' machinery is
    not the core's, so the round names only what it calls)."""

    reviewers: Mapping[str, object]

    def note(self, entry: Entry) -> None: ...

    def consequences(self, projection: Projection, ruleset: RuleSet, now: float) -> list[Envelope]: ...

    def due(self, projection: Projection, views: Iterable[IntentView], ruleset: RuleSet,
            now: float) -> list: ...

    def next_due(self, views: Iterable[IntentView], ruleset: RuleSet) -> float | None: ...


class Decided(msgspec.Struct, frozen=True):
    """What one ``decide`` leaves its driver: every current decision of the intents it
    judged (recorded only where it changed), and the review checkpoints to ask off the
    decision path (those its ``answer`` did not settle)."""

    decisions: list[tuple[IntentView, Decision]]
    jobs: list


class Round:
    def __init__(self, projection: Projection, step: Step, append: Append, *, reviews: Reviews | None = None,
                 followers: Sequence[Callable[[Entry], None]] = (), delivering: Delivering | None = None) -> None:
        self.projection = projection  # the driver may put a fold read again in its place
        self.step = step  # its rule set may change between rounds (a reload)
        self.append = append
        self.reviews = reviews
        # What the driver keeps of each folded entry beside the round (the daemon's
        # notices, metrics and threads to judge; replay's digest): state, not actions.
        self.followers = tuple(followers)
        self.delivering = delivering
        # Each thread's rule triggers, and when the next round is due: kept up to date by
        # the fold, so a round runs the detection rules only where one can fire.
        self.watches = Watches(projection, step.ruleset)
        self._carry: list[Carry] = []

    # -- the fold ----------------------------------------------------------------------

    def fold(self, entries: Iterable[Entry], now: float | None) -> None:
        """Fold rows of the ledger (ours or another writer's, the same way) at ``now``
        (None: before any time is known); each new observation on a thread where a
        delivery waits is queued for it (``take``)."""
        projection, watches, reviews = self.projection, self.watches, self.reviews
        watches.rebase(projection, self.step.ruleset)
        for entry in entries:
            projection.apply(entry)
            watches.note(entry, now)
            if reviews is not None:
                reviews.note(entry)
            for follow in self.followers:
                follow(entry)
            event = entry.envelope.event
            if self.delivering is not None and isinstance(event, DELIVERY_EVENTS):
                self._sighted(event, now)

    def fold_ahead(self, env: Envelope, seq: int, now: float | None) -> None:
        """Fold an observation the ledger is certain to store at ``seq``, before it is
        appended (replay appends them in batches): an observation is never a decision,
        a report or an intent, so the followers have nothing to keep of it, and no
        delivery waits in replay."""
        self.projection.apply_envelope(env, seq)
        if env.event.thread_id is not None:
            self.watches.fold(env.event.thread_id, now)
        if self.reviews is not None:
            self.reviews.note(Entry(seq=seq, envelope=env, prev_hash="", hash=""))

    def record(self, envelopes: list[Envelope], now: float | None) -> None:
        """Append through the port, and fold the rows it returns."""
        if envelopes:
            self.fold(self.append(envelopes), now)

    def _sighted(self, event: ev.Event, now: float | None) -> None:
        waiting = self.delivering(event.thread_id) if event.thread_id is not None else ()
        if waiting:
            snapshot = self.projection.snapshot(event.thread_id)
            self._carry.extend((intent.id, observed(snapshot, intent, event, now)) for intent in waiting)

    # -- what to carry out -------------------------------------------------------------

    def carry(self, intent_id: str, fact: object) -> None:
        """A fact the driver made of a decision, queued in order with the fold's own."""
        self._carry.append((intent_id, fact))

    def take(self) -> list[Carry]:
        """Every fact queued since the last ``take``, in order, for the driver to carry out."""
        taken, self._carry = self._carry, []
        return taken

    # -- deciding ----------------------------------------------------------------------

    def may_decide(self, thread_id: str, now: float) -> bool:
        """Whether deciding for the thread at ``now`` can record anything: an intent is
        open, reviews are kept, or one of its rules can fire (most events: none)."""
        if self.projection.open_ids or self.reviews is not None:
            return True
        found = self.watches.kept(thread_id)
        return found is not None and triggers_may_find(found, now)

    def decide(self, threads: Iterable[str], now: float | None, *, every_intent: bool = False,
               ready: Callable[[str], bool] | None = None,
               act: Callable[[list[tuple[IntentView, Decision]]], None] | None = None,
               answer: Callable[[object], list[Envelope] | None] | None = None) -> Decided:
        """Judge ``threads`` at ``now`` (None: before any time is known, judged at 0):
        detection where a rule can fire, then what review answers lead to, then the
        policy for their open intents (every open intent with ``every_intent``; only
        those whose thread is ``ready``), then the review checkpoints due.

        ``act`` takes the decisions as soon as they are recorded, before the checkpoints
        are asked (the daemon's dispatches may record and fold what they settle);
        ``answer`` gives a checkpoint's records at once where the driver has them
        (replay: a recorded answer, or a call in this thread), or None to ask later."""
        at = 0.0 if now is None else now
        projection, step = self.projection, self.step
        self.watches.rebase(projection, step.ruleset)
        threads = list(threads)
        finding = self.watches.finding(threads, at)  # elsewhere ``detect`` would find nothing
        if finding:
            self.record(step.step(projection, finding, at), now)
        if self.reviews is not None:
            self.record(self.reviews.consequences(projection, step.ruleset, at), now)
        views = self._open_views(threads, every_intent, ready)
        decisions: list[tuple[IntentView, Decision]] = []
        if views:
            envelopes, decisions = step.decide_intents(projection, views, at)
            self.record(envelopes, now)
        if act is not None and decisions:
            act(decisions)
        jobs = self._checkpoints(views, at, now, answer) if self.reviews is not None and self.reviews.reviewers \
            else []
        return Decided(decisions, jobs)

    def _open_views(self, threads: list[str], every_intent: bool,
                    ready: Callable[[str], bool] | None) -> list[IntentView]:
        if not self.projection.open_ids:  # most rounds come with no intent open
            return []
        wanted = set(threads)
        return [v for v in self.projection.open_intents()
                if (every_intent or v.intent.thread_id in wanted) and (ready is None or ready(v.intent.thread_id))]

    def _checkpoints(self, views: list[IntentView], at: float, now: float | None,
                     answer: Callable[[object], list[Envelope] | None] | None) -> list:
        """The checkpoints due for the intents judged (as they stand after their
        decisions), and for the turns that ended; those answered at once are recorded,
        and what their answers lead to with them."""
        reviews, projection = self.reviews, self.projection
        current = [projection.intents[v.intent.id] for v in views if v.intent.id in projection.intents]
        waiting, answered = [], False
        for job in reviews.due(projection, current, self.step.ruleset, at):
            records = answer(job) if answer is not None else None
            if records:
                self.record(records, now)
                answered = True
            else:
                waiting.append(job)
        if answered:
            self.record(reviews.consequences(projection, self.step.ruleset, at), now)
        return waiting

    # -- when next ---------------------------------------------------------------------

    def timers_due(self, now: float) -> float | None:
        """The earliest deadline of an open intent or rule timer after ``now``
        (``tillerman.controller.core.timers``: only the threads folded since are computed again)."""
        return self.watches.timers.next_due(self.projection, self.step.ruleset, now)

    def next_due(self, now: float) -> float | None:
        """``timers_due``, and the moment an intent with a reviewer is overdue for the
        second time (a checkpoint)."""
        due = self.timers_due(now)
        if self.reviews is not None and self.reviews.reviewers:
            second = self.reviews.next_due(self.projection.open_intents(), self.step.ruleset)
            if second is not None and second > now:
                due = second if due is None else min(due, second)
        return due
