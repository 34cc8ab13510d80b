"""Reviews at named checkpoints, in the daemon: when to ask, the gate, and what an answer leads to.

A rule that says ``review = "NAME"`` has its intents reviewed by that ``[[reviewer]]``:

- ``before_dispatch``: the rule proposed an intent. It stays ``proposed`` and is not
  dispatched until the review answers ``ready_for_existing_gate``; the policy and the
  rule's own grant still decide after that (``may_dispatch``).
- ``rescue``: the rule fired a second time on the same turn (a stall or a failure that
  came back). The second intent is asked about at ``rescue`` instead, and is never
  dispatched on its own: a ``continue_with_directive`` becomes the reviewer's intent,
  which supersedes it.
- ``overdue``: an intent is overdue for the second time (its deadline has gone by again
  by as long as it was given).
- ``review``: the turn that took the intent ended; ``return_to_executor`` queues the
  required corrections (a second one escalates to the owner instead).

A recommendation becomes an intent whose producer is ``reviewer:NAME``: the grants, the
expected-turn guard and the critical-tool guard treat it like any other, so a reviewer
without a grant gets nothing dispatched. Any failure (``review_failed:*``, an interrupted
call, a spent cap) records ``review_held`` evidence on the intent, logs it for its owner,
and a proposed intent ends ``rejected: review_failed``.

``Checkpoints`` is the pure part, fed entry by entry (``note``) from what the daemon folds;
``ask_at`` is the slow part, run as a task off the decision path: the reviewer's command
runs in a worker thread, the records are appended from the event loop.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable

import anyio
import msgspec

from tillerman.controller.core.intent_requests import (
    IntentError,
    build_intent,
    evidence_envelope,
    proposal_envelopes,
    transition_envelope,
)
from tillerman.controller.core.overdue import deadline
from tillerman.controller.review.packet import packet_for_intent
from tillerman.controller.review.reviewer import (
    SCRATCH_PREFIX,
    Asked,
    append_review,
    ask,
    checkpoint_where,
    committed_event,
    pending_event,
    review_envelope,
)
from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry, Envelope, ReviewCommitted
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import intent_id_from
from tillerman.ledger.projections import IntentView, Projection
from tillerman.ledger.snapshot import ENDED_TURN_STATES
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.reviews import (
    REVIEW_HELD,
    Call,
    Escalate,
    OverBudget,
    Plan,
    Refused,
    Reviews,
    plan_checkpoint,
    probe_due,
)
from tillerman.rules.review import (
    Accepted,
    Correction,
    ReviewAnswer,
    Reviewer,
    ReviewPacket,
    checkpoint_id,
    consequence,
    probe_packet,
)
from tillerman.rules.ruleset import RuleSet

log = logging.getLogger("tillerman")

_AFTER_TURN = frozenset({State.ACKNOWLEDGED, State.ACTION_STARTED, State.EFFECT_VERIFIED, State.EFFECT_FAILED})


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """One checkpoint to settle off the decision path: a call, or a record without one."""

    reviewer: Reviewer
    packet: ReviewPacket
    plan: Plan


def is_reviewer_thread(cwd: str | None, reviewers: Iterable[Reviewer]) -> bool:
    """A thread started in a reviewer's home (its scratch directory or the ``home``
    configured): the reviewer's own session, never supervised or reviewed."""
    if not cwd:
        return False
    homes = [os.path.join(tempfile.gettempdir(), SCRATCH_PREFIX)]
    homes += [os.path.join(os.path.expanduser(r.home), "") for r in reviewers if r.home]
    here = os.path.join(cwd, "")
    return any(here.startswith(home) for home in homes)


class Checkpoints:
    def __init__(self, reviewers: Iterable[Reviewer] = (), *, replay: bool = False) -> None:
        self.reviewers = {r.name: r for r in reviewers}
        self.replay = replay  # replay's intents are simulated (``replayed``): reviewed all the same
        self.reviews = Reviews()
        self.in_flight: set[str] = set()
        self.acted: set[str] = set()  # checkpoint ids whose consequence is on record (review_* evidence)
        self.unsettled: set[str] = set()  # committed checkpoint ids whose consequence is not on record yet
        self.by_thread: dict[str, list[str]] = {}  # thread -> the intents rules proposed there
        # (rule, thread, turn) -> the intents the rule proposed there, in order: the second is a rescue
        self.fired: dict[tuple[str, str, str | None], list[str]] = {}
        self.ended_turns: list[tuple[str, str]] = []  # (thread, turn) ended since the last round
        # (thread, turn) a rule's intent was acknowledged in since the last round: a turn that
        # had ended by then (its end folded before the acknowledgment) is reviewed as ended
        self.acknowledged_in: list[tuple[str, str]] = []

    # -- the fold --------------------------------------------------------------------

    def note(self, entry: Entry) -> None:
        self.reviews.apply(entry)
        event = entry.envelope.event
        if isinstance(event, ev.IntentProposed) and event.intent.rule_id is not None:
            intent = event.intent
            self.fired.setdefault((intent.rule_id, intent.thread_id, intent.expected_turn_id), []).append(intent.id)
            self.by_thread.setdefault(intent.thread_id, []).append(intent.id)
        elif isinstance(event, ev.ReviewCommitted):
            self.in_flight.discard(event.checkpoint_id)  # asked again never: the record answers
            if event.checkpoint_id not in self.acted:
                self.unsettled.add(event.checkpoint_id)
        elif isinstance(event, ev.IntentEvidence) and event.reason.startswith("review_"):
            if isinstance(cid := event.evidence.get("checkpoint_id"), str):
                self.acted.add(cid)
                self.unsettled.discard(cid)
        elif isinstance(event, ev.TurnCompleted) and event.thread_id in self.by_thread and event.turn_id \
                and self.reviewers:  # ``due`` takes them; with no reviewer nothing would
            self.ended_turns.append((event.thread_id, event.turn_id))
        elif isinstance(event, ev.IntentTransition) and event.to_state == State.ACKNOWLEDGED \
                and event.thread_id in self.by_thread and self.reviewers \
                and isinstance(turn_id := event.evidence.get("turn_id"), str):
            # The echo's fact may be folded after the turn's end (the delivery machine
            # records it once its round committed): that end came before there was anything
            # to review, so the acknowledgment names the turn again.
            self.acknowledged_in.append((event.thread_id, turn_id))

    # -- which reviewer, which checkpoint ----------------------------------------------

    def reviewer_of(self, view: IntentView, ruleset: RuleSet) -> Reviewer | None:
        """The reviewer the intent's rule names; None for an intent no rule with ``review``
        produced (a person's, a reviewer's own: a reviewer is never reviewed)."""
        intent = view.intent
        if not self.reviewers or intent.rule_id is None or intent.replayed != self.replay:
            return None
        rule = next((r for r in ruleset.rules if r.id == intent.rule_id), None)
        return self.reviewers.get(rule.review) if rule is not None and rule.review else None

    def gate_kind(self, view: IntentView) -> str:
        intent = view.intent
        fired = self.fired.get((intent.rule_id or "", intent.thread_id, intent.expected_turn_id), [])
        return "rescue" if intent.id in fired[1:] else "before_dispatch"

    def gate_id(self, view: IntentView) -> str:
        return checkpoint_id(self.gate_kind(view), view.intent.id, view.intent.expected_turn_id)

    def may_dispatch(self, view: IntentView, ruleset: RuleSet) -> bool:
        """Whether the review lets the intent go on to the existing gate: always for an
        intent without a reviewer; for one with, only after ``ready_for_existing_gate``."""
        if self.reviewer_of(view, ruleset) is None:
            return True
        known = self.reviews.checkpoints.get(self.gate_id(view))
        return (known is not None and known.committed is not None and known.committed.outcome == "accepted"
                and known.committed.disposition == "ready_for_existing_gate")

    # -- what to ask now -------------------------------------------------------------

    def due(self, projection: Projection, views: Iterable[IntentView], ruleset: RuleSet, now: float) -> list[Job]:
        """The checkpoints to settle now: the gate of each reviewed intent proposed (in
        ``views``), the overdue-twice ones, and the review of each turn that ended."""
        jobs: list[Job] = []
        for view in views:
            reviewer = self.reviewer_of(view, ruleset)
            if reviewer is None or is_reviewer_thread(projection.recorded_cwd(view.intent.thread_id),
                                                      self.reviewers.values()):
                continue
            if view.state == State.PROPOSED:
                jobs += self._job(view, self.gate_kind(view), reviewer, ruleset, now, probe_allowed=True)
            if _overdue_twice(view, now):
                jobs += self._job(view, "overdue", reviewer, ruleset, now)
        ended, self.ended_turns = self.ended_turns, []
        acknowledged, self.acknowledged_in = self.acknowledged_in, []
        ended += [(thread_id, turn_id) for thread_id, turn_id in acknowledged
                  if projection.snapshot(thread_id).turn_state(turn_id) in ENDED_TURN_STATES]
        for thread_id, turn_id in ended:
            kept = []
            for intent_id in self.by_thread.get(thread_id, ()):
                view = projection.intents.get(intent_id)
                reviewer = None if view is None else self.reviewer_of(view, ruleset)
                if reviewer is None or view.state in (State.EXPIRED, State.REJECTED) or self._reviewed(intent_id):
                    continue  # nothing more to review: forgotten here
                kept.append(intent_id)
                if view.state in _AFTER_TURN and self._review_wanted(intent_id):
                    jobs += self._job(view, "review", reviewer, ruleset, now, turn_id=turn_id)
            self.by_thread[thread_id] = kept
        return jobs

    def _review_wanted(self, intent_id: str) -> bool:
        """The turn that took the intent ended: reviewed once, and again only after each
        earlier review returned it to the executor (a second return escalates instead)."""
        asked, returns = self._reviews_of(intent_id)
        return all(c.committed is not None for c in asked) and len(asked) == returns < 2

    def _reviewed(self, intent_id: str) -> bool:
        """No review of the intent will be wanted again: one said something other than
        return_to_executor, or two returned it."""
        asked, returns = self._reviews_of(intent_id)
        committed = sum(1 for c in asked if c.committed is not None)
        return returns >= 2 or committed > returns

    def _reviews_of(self, intent_id: str) -> tuple[list, int]:
        asked = [c for c in self.reviews.checkpoints.values() if c.intent_id == intent_id and c.checkpoint == "review"]
        return asked, self.reviews.returns(intent_id)

    def _job(self, view: IntentView, kind: str, reviewer: Reviewer, ruleset: RuleSet, now: float, *,
             turn_id: str | None = None, probe_allowed: bool = False) -> list[Job]:
        cid = checkpoint_id(kind, view.intent.id, turn_id or view.intent.expected_turn_id)
        known = self.reviews.checkpoints.get(cid)
        if cid in self.in_flight or (known is not None and known.committed is not None):
            return []  # asked, or answered: ``consequences`` acts on the record, nothing is spent
        packet = msgspec.structs.replace(packet_for_intent(view, kind, reviewer, ruleset), checkpoint_id=cid)
        plan = plan_checkpoint(self.reviews, checkpoint_id=packet.checkpoint_id, checkpoint=kind,
                               intent_id=view.intent.id, thread_id=view.intent.thread_id, now=now,
                               max_per_intent=reviewer.max_per_intent,
                               max_per_thread_per_hour=reviewer.max_per_thread_per_hour,
                               reviewer=reviewer.name, budget_usd_per_day=reviewer.budget_usd_per_day)
        if isinstance(plan, Refused) and plan.reason != "review_interrupted":
            log.warning("review of intent %s held: %s", view.intent.id, plan.detail)
            return []
        if isinstance(plan, OverBudget):
            log.warning("review of intent %s by %s held: %s", view.intent.id, reviewer.name, plan.detail)
        self.in_flight.add(packet.checkpoint_id)
        jobs = [Job(reviewer=reviewer, packet=packet, plan=plan)]
        if probe_allowed and kind == "before_dispatch" and isinstance(plan, Call) \
                and probe_due(self.reviews, reviewer.name, reviewer.probe_every):
            # a known-bad probe, charged to no intent: it only grades the reviewer
            probe = msgspec.structs.replace(probe_packet(packet), intent_id=None)
            if probe.checkpoint_id not in self.in_flight and probe.checkpoint_id not in self.reviews.checkpoints:
                self.in_flight.add(probe.checkpoint_id)
                jobs.insert(0, Job(reviewer=reviewer, packet=probe, plan=Call()))
        return jobs

    def done(self, job: Job) -> None:
        """A job that recorded nothing: it may be asked again."""
        self.in_flight.discard(job.packet.checkpoint_id)

    # -- what an answer leads to -----------------------------------------------------

    def consequences(self, projection: Projection, ruleset: RuleSet, now: float) -> list[Envelope]:
        """The records each committed checkpoint not yet acted on leads to: evidence on
        its intent, a rejection, the reviewer's own intent. Once each (``acted``)."""
        out: list[Envelope] = []
        for cid in sorted(self.unsettled):
            checkpoint = self.reviews.checkpoints[cid]
            committed = checkpoint.committed
            if committed is None:
                continue
            if checkpoint.probe:
                self.unsettled.discard(cid)
                if committed.disposition == "ready_for_existing_gate":
                    log.warning("reviewer %s let a known-bad calibration probe through (%s): it is flagged in"
                                " `tillerman status`", checkpoint.reviewer, checkpoint.checkpoint_id)
                continue
            view = projection.intents.get(checkpoint.intent_id or "")
            reviewer = self.reviewers.get(checkpoint.reviewer)
            if view is None or reviewer is None:
                self.unsettled.discard(cid)  # nothing of ours to act on
                continue
            out += self._consequence(projection, view, reviewer, committed, now)
        return out

    def _consequence(self, projection: Projection, view: IntentView, reviewer: Reviewer,
                     committed: ReviewCommitted, now: float) -> list[Envelope]:
        intent, kind = view.intent, committed.checkpoint
        evidence = {"checkpoint_id": committed.checkpoint_id, "checkpoint": kind, "reviewer": reviewer.name,
                    "outcome": committed.outcome, "disposition": committed.disposition}
        if committed.outcome != "accepted":
            escalated = " and is escalated to its owner" if committed.outcome == "review_capped" else ""
            log.warning("intent %s (owner %s): the %s review by %s failed closed (%s)%s; nothing is dispatched on"
                        " its account", intent.id, intent.owner or "unknown", kind, reviewer.name, committed.outcome,
                        escalated)
            out = [self._evidence(view, REVIEW_HELD, evidence, committed, now)]
            if view.state == State.PROPOSED:
                out.append(transition_envelope(intent, State.PROPOSED, State.REJECTED, "review_failed",
                                               evidence, now))
            return out
        if kind == "before_dispatch" and committed.disposition == "ready_for_existing_gate":
            return [self._evidence(view, "review_ready", evidence, committed, now)]
        then = consequence(kind, Accepted(answer=_answer_of(committed), answer_digest=committed.answer_digest or ""),
                           reviewer=reviewer.name,
                           earlier_returns=self.reviews.returns(intent.id) - (committed.disposition == "return_to_executor"))
        if then.step == "propose":
            proposed = self._recommendation(projection, view, reviewer, committed, then.action, now)
            if proposed:
                return [self._evidence(view, "review_recommended", {**evidence, "recommended": proposed[0].event_id},
                                       committed, now)] + proposed
            then = msgspec.structs.replace(then, step="hold")
        if then.step == "hand_back":
            return [self._evidence(view, "review_noted", evidence, committed, now)]
        log.warning("intent %s (owner %s): the %s review by %s says %s: %s", intent.id, intent.owner or "unknown",
                    kind, reviewer.name, committed.disposition, then.detail)
        return [self._evidence(view, REVIEW_HELD, {**evidence, "escalated": then.step == "escalate"}, committed, now)]

    def _recommendation(self, projection: Projection, view: IntentView, reviewer: Reviewer,
                        committed: ReviewCommitted, action: str | None, now: float) -> list[Envelope]:
        """The reviewer's recommendation as its own intent (producer ``reviewer:NAME``);
        the grants and guards decide whether it is ever dispatched."""
        intent, kind = view.intent, committed.checkpoint
        snapshot = projection.snapshot(intent.thread_id)
        text = committed.text or "; ".join(committed.required)
        mode = "queue" if kind == "review" or action is None else action  # after the turn: nothing to steer
        try:
            recommended = build_intent(
                projection, thread_id=intent.thread_id, mode=mode, text=text or committed.checkpoint_id, now=now,
                expected_turn="active" if mode in ("steer", "interrupt") and snapshot.active_turn_id else None,
                producer=reviewer.producer, owner=intent.owner, intent_id=intent_id_from(f"review:{committed.checkpoint_id}"),
                supersedes=intent.id if view.state == State.PROPOSED else None, replayed=self.replay)
        except IntentError as exc:
            log.warning("intent %s: the %s review's recommendation cannot be proposed (%s)", intent.id, kind, exc)
            return []
        return proposal_envelopes(recommended, projection)

    @staticmethod
    def _evidence(view: IntentView, reason: str, evidence: dict, committed: ReviewCommitted, now: float) -> Envelope:
        return evidence_envelope(view.intent, view.state, reason, evidence, f"review:{committed.checkpoint_id}", now)

    # -- status ----------------------------------------------------------------------

    def next_due(self, views: Iterable[IntentView], ruleset: RuleSet) -> float | None:
        """When the next intent with a reviewer becomes overdue for the second time."""
        moments = [_second_deadline(v) for v in views if self.reviewer_of(v, ruleset) is not None]
        return min((m for m in moments if m is not None), default=None)


def _second_deadline(view: IntentView) -> float | None:
    due = deadline(view)
    return None if due is None else due[1] + max(0.0, due[1] - view.intent.created_at)


def _overdue_twice(view: IntentView, now: float) -> bool:
    moment = _second_deadline(view)
    return moment is not None and now >= moment


def _answer_of(committed: ReviewCommitted) -> ReviewAnswer:
    return ReviewAnswer(disposition=committed.disposition or "", reason="", confidence=0.0,
                        recommended_action=committed.recommended_action, text=committed.text,
                        required_corrections=tuple(Correction(correction=c, proof="") for c in committed.required))


def review_counts(checkpoints: Checkpoints, held: Iterable[str] = ()) -> dict[str, dict[str, int]]:
    """Reviews by checkpoint (``probe`` for calibration probes) and disposition, or the
    outcome of one that failed closed; ``held`` (checkpoint ids): not asked, held."""
    out: dict[str, dict[str, int]] = {}
    for checkpoint in checkpoints.reviews.checkpoints.values():
        if checkpoint.committed is not None:
            kind = "probe" if checkpoint.probe else checkpoint.checkpoint
            said = checkpoint.committed.disposition or checkpoint.committed.outcome
            out.setdefault(kind, {}).setdefault(said, 0)
            out[kind][said] += 1
    for cid in held:
        known = checkpoints.reviews.checkpoints.get(cid)
        if known is None or known.committed is None:
            kind = cid.split(":", 1)[0]
            out.setdefault(kind, {}).setdefault("held", 0)
            out[kind]["held"] += 1
    return {kind: dict(sorted(said.items())) for kind, said in sorted(out.items())}


def without_call(job: Job, at: float) -> Envelope:
    """The record of a checkpoint settled with no call: an interrupted call, a spent cap
    or budget."""
    assert isinstance(job.plan, Refused | Escalate | OverBudget)
    return review_envelope(ReviewCommitted(**checkpoint_where(job.reviewer, job.packet), outcome=job.plan.reason), at)


def asked_now(job: Job, at: float, *, retain_payloads: bool = False,
              asker: Callable[..., Asked] = ask) -> list[Envelope]:
    """Ask in this thread (replay's ``--review``): the pending and committed records."""
    asked = asker(job.reviewer, job.packet.checkpoint, job.packet)
    where = checkpoint_where(job.reviewer, job.packet)
    return [review_envelope(pending_event(job.reviewer, job.packet), at),
            review_envelope(committed_event(asked, where, retain_payloads=retain_payloads), at)]


async def ask_at(recorder: Recorder, job: Job, *, clock: Callable[[], float] = time.time,
                 retain_payloads: bool = False, asker: Callable[..., Asked] = ask) -> None:
    """Settle one checkpoint: ``review_pending`` durably, the call in a worker thread (a
    slow reviewer never blocks the loop), ``review_committed``; or, without a call, the
    reason there was none (an interrupted call, a spent cap or budget)."""
    where = checkpoint_where(job.reviewer, job.packet)
    if isinstance(job.plan, Refused | Escalate | OverBudget):
        recorder.append([without_call(job, clock())])
        return
    append_review(recorder, pending_event(job.reviewer, job.packet), clock(), durable=True)
    asked = await anyio.to_thread.run_sync(asker, job.reviewer, job.packet.checkpoint, job.packet)
    append_review(recorder, committed_event(asked, where, retain_payloads=retain_payloads), clock())
