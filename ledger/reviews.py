"""The reviews a ledger records, folded: what each checkpoint came to and what was spent.

A checkpoint is asked at most once. ``review_pending`` is appended before the call and
``review_committed`` after it, so ``plan_checkpoint`` can tell, for a checkpoint id:

- committed: the recorded result stands; nothing is called and no cap is spent;
- pending without committed: the process died during the call, which may have been
  charged; it fails closed (``review_interrupted``) and is not called again;
- recorded under another checkpoint kind: refused, since returning another checkpoint's
  result would skip the one the caller believes it ran;
- a cap already spent (per intent, or per thread in the last hour): the owner is asked
  instead of the reviewer; reaching a cap escalates, it never loops;
- the reviewer's budget for the UTC day spent, or its spend not known: no call, the
  checkpoint fails closed (``review_failed:budget``). A call that ran and reported no cost
  (or a figure that is no cost: negative, not finite) leaves the day's spend unknown, and
  an unknown spend is never read as 0: it cannot be shown to be within the budget.

It also keeps the calibration count: how many ``ready_for_existing_gate`` answers a
reviewer gave in a row at ``before_dispatch`` (``probe_due``), and which known-bad
probes it let through (``probes_let_through``).

Pure: ``Reviews.apply`` folds one entry at a time, like ``tillerman.ledger.projections``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import msgspec

from tillerman.ledger.events import Entry, ReviewCommitted, ReviewPending

HOUR = 3600.0
DAY = 86400.0
INTERRUPTED = "review_interrupted"
OVER_BUDGET = "review_failed:budget"
#: Outcomes of a call whose command never ran: it cost nothing.
NEVER_RAN = frozenset({"review_failed:packet_refused", "review_failed:not_started"})


#: The evidence reason on an intent a review held (failed, capped, hold, escalated).
REVIEW_HELD = "review_held"

class Checkpoint(msgspec.Struct, kw_only=True):
    checkpoint_id: str
    checkpoint: str
    reviewer: str
    thread_id: str | None
    intent_id: str | None
    pending_at: float | None
    committed: ReviewCommitted | None = None
    probe: bool = False


class Reviews(msgspec.Struct, kw_only=True):
    checkpoints: dict[str, Checkpoint] = {}
    #: (time, thread id, intent id) of each call made (each pending record): what caps count.
    calls: list[tuple[float | None, str | None, str | None]] = []

    def apply(self, entry: Entry) -> None:
        event, at = entry.envelope.event, entry.envelope.at
        if isinstance(event, ReviewPending):
            if event.checkpoint_id in self.checkpoints:
                return  # a repeated pending record is not a second call
            self.checkpoints[event.checkpoint_id] = Checkpoint(
                checkpoint_id=event.checkpoint_id, checkpoint=event.checkpoint, reviewer=event.reviewer,
                thread_id=event.thread_id, intent_id=event.intent_id, pending_at=at, probe=event.probe)
            self.calls.append((at, event.thread_id, event.intent_id))
        elif isinstance(event, ReviewCommitted):
            known = self.checkpoints.get(event.checkpoint_id)
            if known is None:  # committed without a call: a result recorded by hand or a fail-closed refusal
                known = self.checkpoints[event.checkpoint_id] = Checkpoint(
                    checkpoint_id=event.checkpoint_id, checkpoint=event.checkpoint, reviewer=event.reviewer,
                    thread_id=event.thread_id, intent_id=event.intent_id, pending_at=None)
            if known.committed is None:
                known.committed = event

    def spent(self, *, intent_id: str | None, thread_id: str | None, now: float) -> tuple[int, int]:
        """Calls charged to the intent (ever), and to the thread in the hour before ``now``."""
        per_intent = sum(1 for _, _, intent in self.calls if intent_id is not None and intent == intent_id)
        per_thread = sum(1 for at, thread, _ in self.calls
                         if thread == thread_id and at is not None and now - HOUR < at <= now)
        return per_intent, per_thread

    def spent_today(self, reviewer: str, now: float) -> DaySpend:
        """What ``reviewer``'s calls made in the UTC day of ``now`` cost, probes included,
        counted by the day each call started. A call still running has no figure yet; it
        counts once committed."""
        start = now - now % DAY
        usd, unknown = 0.0, 0
        for checkpoint in self.checkpoints.values():
            committed = checkpoint.committed
            if checkpoint.reviewer != reviewer or checkpoint.pending_at is None or committed is None \
                    or not start <= checkpoint.pending_at < start + DAY:
                continue
            if is_cost(committed.cost_usd):
                usd += committed.cost_usd
            elif committed.outcome not in NEVER_RAN:
                unknown += 1
        return DaySpend(usd=usd, unknown=unknown)

    def returns(self, intent_id: str) -> int:
        """``return_to_executor`` answers recorded for the intent."""
        return sum(1 for c in self.checkpoints.values()
                   if c.intent_id == intent_id and c.committed is not None
                   and c.committed.disposition == "return_to_executor")


    def gate_streak(self, reviewer: str) -> int:
        """``ready_for_existing_gate`` answers in a row at ``before_dispatch`` by ``reviewer``,
        counted back from its latest answer to the latest probe or other answer."""
        streak = 0
        for checkpoint in reversed(self.checkpoints.values()):
            if checkpoint.reviewer != reviewer or checkpoint.checkpoint != "before_dispatch":
                continue
            if checkpoint.probe or checkpoint.committed is None \
                    or checkpoint.committed.disposition != "ready_for_existing_gate":
                break
            streak += 1
        return streak

    def probes_let_through(self, reviewer: str) -> list[str]:
        """The checkpoint ids of known-bad probes ``reviewer`` sent on to the gate."""
        return [c.checkpoint_id for c in self.checkpoints.values()
                if c.reviewer == reviewer and c.probe and c.committed is not None
                and c.committed.disposition == "ready_for_existing_gate"]

    def flagged(self) -> dict[str, list[str]]:
        """Reviewers that let a known-bad calibration probe through -> those probes' checkpoint ids."""
        names = sorted({c.reviewer for c in self.checkpoints.values() if c.probe})
        return {name: probes for name in names if (probes := self.probes_let_through(name))}


class DaySpend(msgspec.Struct, frozen=True, kw_only=True):
    usd: float  # the costs reported, summed
    unknown: int  # calls that ran and reported no cost (or a figure that is none)


def is_cost(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value >= 0


def probe_due(reviews: Reviews, reviewer: str, probe_every: int | None) -> bool:
    """Calibration: after ``probe_every`` gate answers in a row, a known-bad probe is next."""
    return probe_every is not None and reviews.gate_streak(reviewer) >= probe_every


def fold_reviews(entries: Iterable[Entry]) -> Reviews:
    reviews = Reviews()
    for entry in entries:
        reviews.apply(entry)
    return reviews


class Call(msgspec.Struct, frozen=True):
    """Ask the reviewer: append ``review_pending`` first."""


class Recorded(msgspec.Struct, frozen=True):
    """Asked before: this is what it came to; nothing is called or spent."""

    committed: ReviewCommitted


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    """No call: ``reason`` is recorded as the checkpoint's outcome (fail closed)."""

    reason: str  # "review_interrupted" | "review_failed:checkpoint_id_reused"
    detail: str


class Escalate(msgspec.Struct, frozen=True, kw_only=True):
    """A cap is spent: the owner is asked instead of the reviewer."""

    reason: Literal["review_capped"] = "review_capped"
    detail: str


class OverBudget(msgspec.Struct, frozen=True, kw_only=True):
    """The reviewer's budget for the day is spent, or its spend is unknown: no call, and
    the checkpoint fails closed (``reason`` is recorded as its outcome)."""

    reason: Literal["review_failed:budget"] = OVER_BUDGET
    detail: str


Plan = Call | Recorded | Refused | Escalate | OverBudget


def plan_checkpoint(reviews: Reviews, *, checkpoint_id: str, checkpoint: str, intent_id: str | None,
                    thread_id: str | None, now: float, max_per_intent: int, max_per_thread_per_hour: int,
                    reviewer: str = "", budget_usd_per_day: float | None = None) -> Plan:
    known = reviews.checkpoints.get(checkpoint_id)
    if known is not None and known.checkpoint != checkpoint:
        return Refused(reason="review_failed:checkpoint_id_reused",
                       detail=f"checkpoint id {checkpoint_id} was recorded for {known.checkpoint}, not {checkpoint}")
    if known is not None and known.committed is not None:
        return Recorded(known.committed)
    if known is not None:
        return Refused(reason=INTERRUPTED, detail=f"checkpoint {checkpoint_id} was called and never committed"
                                                  " (a restart during the call); it is not called again")
    per_intent, per_thread = reviews.spent(intent_id=intent_id, thread_id=thread_id, now=now)
    if intent_id is not None and per_intent >= max_per_intent:
        return Escalate(detail=f"{per_intent} review calls spent on intent {intent_id} (max_per_intent"
                               f" {max_per_intent})")
    if per_thread >= max_per_thread_per_hour:
        return Escalate(detail=f"{per_thread} review calls on thread {thread_id} in the last hour"
                               f" (max_per_thread_per_hour {max_per_thread_per_hour})")
    if budget_usd_per_day is not None:
        return _within_budget(reviews.spent_today(reviewer, now), reviewer, budget_usd_per_day)
    return Call()


def _within_budget(spent: DaySpend, reviewer: str, budget: float) -> Call | OverBudget:
    if spent.unknown:
        return OverBudget(detail=f"{spent.unknown} call(s) of reviewer {reviewer} today (UTC) reported no cost, so"
                                 f" its spend cannot be shown within budget_usd_per_day {budget:g}")
    if spent.usd >= budget:
        return OverBudget(detail=f"reviewer {reviewer} spent {spent.usd:.4f} USD today (UTC), budget_usd_per_day"
                                 f" {budget:g}")
    return Call()
