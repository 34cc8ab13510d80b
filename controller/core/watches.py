"""Each thread's rule triggers, kept up to date as its state is folded: where a
decision round needs a snapshot and the detection rules, and when it is due next.

Shared by the daemon and by replay, so both decide alike. After every entry about a
thread is folded (``fold``), its triggers are taken again from the small part of its
state they read (``Watched``), and only when that part changed; the timers
(``tillerman.controller.core.timers``) are told the thread's due. A round then builds a
snapshot and runs ``detect`` only for the threads where a rule can fire at its moment
(``finding``: ``triggers_may_find``); elsewhere ``detect`` would return nothing. At 200
busy threads the daemon ran ``detect`` and recomputed a due for each thread an event
touched, in every round: half of a round's time, for findings that were never there.

Most events move only a thread's progress (``last_progress_at``), later. Then the
triggers kept find at least what new ones would (each of their moments is no later):
they stay, marked stale, and are taken again only when asked (``fresh``); the timers
get a lower bound (``Timers.later``) instead of a due computed again.

The triggers are of one projection under one rule set: ``rebase`` to another (the
daemon reads its fold again after a failed round, or reloads its rules) forgets them,
and each is taken again from the fold when next asked.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from tillerman.controller.core.timers import Timers
from tillerman.ledger.events import Entry, IntentProposed, IntentTransition
from tillerman.ledger.projections import Projection
from tillerman.ledger.snapshot import Watched
from tillerman.rules.detect import Triggers, triggers, triggers_may_find, triggers_next_due
from tillerman.rules.ruleset import RuleSet

NO_TRIGGERS = Triggers((), ())


class Watches:
    def __init__(self, projection: Projection, ruleset: RuleSet) -> None:
        self.timers = Timers(self._triggers_of)
        self._rebase(projection, ruleset)

    def _triggers_of(self, projection: Projection, thread_id: str, ruleset: RuleSet) -> Triggers:
        """What the timers ask, of the projection and rule set they were asked about."""
        self.rebase(projection, ruleset)
        return self.fresh(thread_id)

    def rebase(self, projection: Projection, ruleset: RuleSet) -> None:
        """Keep the triggers of ``projection`` under ``ruleset`` from now on."""
        if projection is not self.projection or ruleset is not self.ruleset:
            self._rebase(projection, ruleset)

    def _rebase(self, projection: Projection, ruleset: RuleSet) -> None:
        self.projection, self.ruleset = projection, ruleset
        self._watched: dict[str, Watched] = {}
        self._triggers: dict[str, Triggers] = {}
        # Threads whose kept triggers predate a later progress of theirs (``fold``), and
        # the shortest limit of each thread's timers: how soon after a progress its next
        # timer may fall due.
        self._stale: set[str] = set()
        self._soonest: dict[str, float | None] = {}

    def note(self, entry: Entry, now: float | None) -> None:
        """An entry was folded at ``now``: its thread's triggers (``fold``), and the
        deadlines of the intent it proposes or moves, for the timers."""
        event = entry.envelope.event
        if event.thread_id is not None:
            self.fold(event.thread_id, now)
        if isinstance(event, IntentProposed | IntentTransition):
            self.timers.note(entry)

    def fold(self, thread_id: str, now: float | None) -> None:
        """An entry about the thread was folded at ``now`` (None: before any time is
        known). Take its triggers again when what they read of it changed, and tell the
        timers its due (``Timers.lower``: a later one is not even pushed); equal triggers
        give the same due."""
        old = self._watched.get(thread_id)
        if old is not None and self.projection.moved_at_most_progress(thread_id, old):  # most events: no Watched built
            progress = self.projection.threads[thread_id].last_progress_at
            if progress == old.last_progress_at or self._progressed(thread_id, old, progress, now):
                return
        watched = self.projection.watched(thread_id)
        if watched is None or watched == old:
            return
        if old is not None and msgspec.structs.replace(old, last_progress_at=watched.last_progress_at) == watched \
                and self._progressed(thread_id, old, watched.last_progress_at, now):
            return
        found = self._keep(thread_id, watched)
        if now is None:
            self.timers.changed(thread_id)
        else:
            self.timers.lower(thread_id, triggers_next_due(found, now))

    def _keep(self, thread_id: str, watched: Watched) -> Triggers:
        self._watched[thread_id] = watched
        self._stale.discard(thread_id)
        found = self._triggers[thread_id] = triggers(watched, self.ruleset)
        self._soonest[thread_id] = min([limit for _, limit, _ in found.timers], default=None)
        return found

    def _progressed(self, thread_id: str, old: Watched, progress: float | None, now: float | None) -> bool:
        """Take a move of only the thread's progress, when it moved later: the timers that
        run from it moved later with it, the others stayed, so the kept triggers stay
        until asked (``fresh``). False for any other move: its triggers are taken again."""
        if old.last_progress_at is None or progress is None or progress <= old.last_progress_at or now is None:
            return False
        self._watched[thread_id] = msgspec.structs.replace(old, last_progress_at=progress)
        self._stale.add(thread_id)
        soonest = self._soonest[thread_id]
        if soonest is not None:
            self.timers.later(thread_id, progress + soonest)
        return True

    def kept(self, thread_id: str) -> Triggers | None:
        """The triggers kept for the thread, stale or not (they find at least what fresh
        ones would): None for a thread not folded since the last ``rebase``."""
        return self._triggers.get(thread_id)

    def fresh(self, thread_id: str) -> Triggers:
        """The thread's triggers as of its last fold."""
        if thread_id in self._stale:
            self._stale.discard(thread_id)
            self._triggers[thread_id] = triggers(self._watched[thread_id], self.ruleset)
        found = self._triggers.get(thread_id)
        if found is None:  # not folded since a rebase: from the fold as it stands
            watched = self.projection.watched(thread_id)
            return NO_TRIGGERS if watched is None else self._keep(thread_id, watched)
        return found

    def finding(self, thread_ids: Iterable[str], now: float) -> list[str]:
        """The threads among ``thread_ids`` where ``detect`` can find something at ``now``."""
        return [t for t in thread_ids if triggers_may_find(self.fresh(t), now)]

    def forget(self, thread_id: str) -> None:
        self._watched.pop(thread_id, None)
        self._triggers.pop(thread_id, None)
        self._soonest.pop(thread_id, None)
        self._stale.discard(thread_id)
