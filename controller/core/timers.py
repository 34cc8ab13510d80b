"""When the next decision round is due, kept up to date instead of rescanned.

A round is due at the earliest moment after ``now`` of: an open intent's
acknowledgement, effect or expiry deadline; a thread's next rule timer
(``tillerman.rules.detect.triggers_next_due``). The daemon sleeps until then; replay's
virtual clock jumps there. Rescanning every thread and intent for it cost the daemon
2.5 ms per round at 50 threads (a snapshot per thread per round), and replay a rescan
per event.

Here a thread's due is computed again only when an entry about it was folded
(``note``: every change to a thread's state comes with its ``thread_id``), or when the
moment it held for has passed: its due itself, or the ``expires`` of one of its rules
(out of force, the rule's timer no longer counts). Dues sit in a heap with lazy
invalidation: a superseded entry stays where it is and is dropped when it surfaces.
An intent's deadlines never change: they are pushed when it is proposed and dropped
once it is closed or they are past. ``next_due`` answers what ``brute_force_due`` over
every thread and open intent would (tests/controller/test_timers.py, on random folds).

Time is expected to move forward. When it goes back — replay gives each file its own
clock; a wall clock can be stepped back — everything is computed again, as it is for a
new projection or a new rule set.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterable

from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry
from tillerman.ledger.projections import IntentView, Projection, is_open
from tillerman.rules.detect import Triggers, triggers, triggers_next_due
from tillerman.rules.ruleset import RuleSet

#: A thread's triggers under a rule set: taken from the fold by default; replay
#: passes the ones it keeps up to date as it folds.
TriggersOf = Callable[[Projection, str, RuleSet], Triggers]


def fresh_triggers(projection: Projection, thread_id: str, ruleset: RuleSet) -> Triggers:
    watched = projection.watched(thread_id)
    return triggers(watched, ruleset) if watched is not None else Triggers((), ())


def deadlines(view: IntentView) -> tuple[float, ...]:
    """The moments an open intent's decision can change by itself."""
    intent = view.intent
    return tuple(t for t in (intent.ack_deadline, intent.effect_deadline, intent.expires_at) if t is not None)


def brute_force_due(projection: Projection, ruleset: RuleSet, now: float,
                    triggers_of: TriggersOf = fresh_triggers) -> float | None:
    """The definition ``Timers.next_due`` keeps: every open intent and thread, scanned."""
    dues: Iterable[float | None] = itertools.chain(
        (t for view in projection.intents.values() if is_open(view) for t in deadlines(view) if t > now),
        (triggers_next_due(triggers_of(projection, t, ruleset), now) for t in projection.threads))
    return min((due for due in dues if due is not None), default=None)


class Timers:
    def __init__(self, triggers_of: TriggersOf = fresh_triggers) -> None:
        self._triggers_of = triggers_of
        self._tokens = itertools.count()
        self._reset(None, None)

    def _reset(self, projection: Projection | None, ruleset: RuleSet | None) -> None:
        self._projection, self._ruleset = projection, ruleset
        self._expiring = ruleset is not None and any(rule.expires is not None for rule in ruleset.rules)
        self._now: float | None = None
        self._current: dict[str, int] = {}  # thread -> token of its live heap entries
        self._due_of: dict[str, float] = {}  # thread -> the due of its live entry, when it has one
        self._loose: set[str] = set()  # threads whose live entry is only a lower bound (``lower``)
        self._dues: list[tuple[float, int, str]] = []  # (due, token, thread)
        self._checks: list[tuple[float, int, str]] = []  # (a rule of the thread leaves force, token, thread)
        self._deadlines: list[tuple[float, str]] = []  # (deadline, intent id)
        self._open: set[str] = set()
        self._threads: set[str] = set(projection.threads) if projection is not None else set()
        self._intents: set[str] = set(projection.intents) if projection is not None else set()

    def changed(self, thread_id: str) -> None:
        """The thread's triggers changed: its due is computed again at the next ``next_due``
        (what ``note`` does for an entry about it; replay tells only real changes)."""
        self._threads.add(thread_id)

    def lower(self, thread_id: str, due: float | None) -> None:
        """The thread's triggers changed and ``due`` is their ``triggers_next_due`` now (at
        or after the last ``next_due``). A due no earlier than the one its entry holds
        leaves the entry where it is, as a lower bound, computed again only once it is
        the earliest (``next_due``): replay moves a thread's quiet timer at nearly every
        event, and it is rarely the earliest."""
        if self._expiring or thread_id in self._threads or thread_id not in self._current:
            self._threads.add(thread_id)  # computed exactly, with its rules' leaving force
            return
        held = self._due_of.get(thread_id)
        if due is None or (held is not None and due >= held):
            if held is not None:
                self._loose.add(thread_id)
            return
        token = self._current[thread_id] = next(self._tokens)
        heapq.heappush(self._dues, (due, token, thread_id))
        self._due_of[thread_id] = due
        self._loose.discard(thread_id)

    def later(self, thread_id: str, bound: float) -> None:
        """The thread's triggers changed, and none of its timers falls due before ``bound``
        unless it did before the change: its entry becomes (or stays) a lower bound,
        computed again only once it is the earliest (``next_due``)."""
        if self._expiring or thread_id in self._threads or thread_id not in self._current:
            self._threads.add(thread_id)
            return
        held = self._due_of.get(thread_id)
        if held is None or bound < held:
            token = self._current[thread_id] = next(self._tokens)
            heapq.heappush(self._dues, (bound, token, thread_id))
            self._due_of[thread_id] = bound
        self._loose.add(thread_id)

    def horizon(self, now: float) -> float:
        """A moment before which ``next_due`` asked at ``now`` (of the same projection and
        rule set) certainly answers nothing: replay asks only when an event reaches it."""
        if self._threads or self._intents or self._now is None or now < self._now:
            return -math.inf
        return min(self._dues[0][0] if self._dues else math.inf, self._checks[0][0] if self._checks else math.inf,
                   self._deadlines[0][0] if self._deadlines else math.inf)

    def reset(self) -> None:
        """Compute everything again at the next ``next_due``."""
        self._reset(None, None)

    def note(self, entry: Entry) -> None:
        """An entry was folded: what it is about is computed again at the next ``next_due``."""
        event = entry.envelope.event
        if event.thread_id is not None:
            self._threads.add(event.thread_id)
        if isinstance(event, ev.IntentProposed):
            self._intents.add(event.intent.id)
        elif isinstance(event, ev.IntentTransition):
            self._intents.add(event.intent_id)

    def next_due(self, projection: Projection, ruleset: RuleSet, now: float) -> float | None:
        if projection is not self._projection or ruleset is not self._ruleset or (
                self._now is not None and now < self._now):
            self._reset(projection, ruleset)
        self._now = now
        if self._threads:
            for thread_id in self._threads:
                self._compute(thread_id, now)
            self._threads.clear()
        if self._intents:
            for intent_id in self._intents:
                self._intent(intent_id, now)
            self._intents.clear()
        current, loose = self._current, self._loose
        checks, dues = self._checks, self._dues
        while checks and (checks[0][0] <= now or checks[0][1] != current[checks[0][2]]):
            _, token, thread_id = heapq.heappop(checks)
            if token == current[thread_id]:
                self._compute(thread_id, now)
        # A thread whose moment has come, or whose entry is a lower bound, first: again.
        while dues and (dues[0][0] <= now or dues[0][1] != current[dues[0][2]] or dues[0][2] in loose):
            _, token, thread_id = heapq.heappop(dues)
            if token == current[thread_id]:
                self._compute(thread_id, now)
        if len(self._dues) > 2 * len(current) + 64:  # superseded entries that time has not reached yet
            self._dues = [e for e in self._dues if e[1] == current[e[2]]]
            self._checks = [e for e in self._checks if e[1] == current[e[2]]]
            heapq.heapify(self._dues)
            heapq.heapify(self._checks)
        if len(self._deadlines) > 4 * len(self._open) + 64:  # closed intents' deadlines not reached yet
            self._deadlines = [d for d in self._deadlines if d[1] in self._open]
            heapq.heapify(self._deadlines)
        deadlines_ = self._deadlines
        while deadlines_ and (deadlines_[0][0] <= now or deadlines_[0][1] not in self._open):
            heapq.heappop(deadlines_)
        if not self._dues:
            return deadlines_[0][0] if deadlines_ else None
        return min(self._dues[0][0], deadlines_[0][0]) if deadlines_ else self._dues[0][0]

    def _compute(self, thread_id: str, now: float) -> None:
        token = self._current[thread_id] = next(self._tokens)
        self._loose.discard(thread_id)
        self._due_of.pop(thread_id, None)
        if thread_id not in self._projection.threads:  # an intent's thread the fold never saw
            return
        trig = self._triggers_of(self._projection, thread_id, self._ruleset)
        due = triggers_next_due(trig, now)
        if due is None:  # nothing lasting: time alone never changes that
            return
        heapq.heappush(self._dues, (due, token, thread_id))
        self._due_of[thread_id] = due
        if not self._expiring:
            return
        # A rule leaving force before ``due`` may take the earliest timer with it.
        leaves = [t for _, _, rule in trig.timers
                  if rule.expires is not None and now < (t := rule.out_of_force_at() or 0.0) < due]
        if leaves:
            heapq.heappush(self._checks, (min(leaves), token, thread_id))

    def _intent(self, intent_id: str, now: float) -> None:
        view = self._projection.intents.get(intent_id)
        if view is None or not is_open(view):
            self._open.discard(intent_id)
        elif intent_id not in self._open:
            self._open.add(intent_id)
            for t in deadlines(view):
                if t > now:
                    heapq.heappush(self._deadlines, (t, intent_id))
