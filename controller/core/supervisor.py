"""One supervision step, shared by the daemon and by replay: given the folded state,
the rule set and the time, what should be recorded next.

Sans-IO: ``step()`` reads a projection and returns envelopes (reports, proposed
intents, decisions, expiries); the caller appends them to the ledger and folds them
back. It never dispatches: a dispatch decision is a recorded value that the
daemon's delivery machine carries out (and replay never does). Because the step is
a function of the ledger and the clock, replay on a virtual clock and the live
daemon make the same decisions from the same events.

Which threads a step need judge (where a rule can fire) and when the next step is
due with no event (an intent's deadline, a rule's timer) is
``tillerman.controller.core.watches`` and ``tillerman.controller.core.timers``, shared by both:
kept up to date by what they fold, never rescanned.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from tillerman.controller.core.intent_requests import (
    SOURCE,
    IntentError,
    build_intent,
    proposal_envelopes,
    transition_envelope,
)
from tillerman.ledger.events import DecisionRecorded, Envelope, Report
from tillerman.ledger.intent_states import TRANSITIONS as _MOVES
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import PRE_TOOL_USE, Intent, intent_id_from
from tillerman.ledger.projections import IntentView, Projection
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.rules.decision import DISPATCH_ACTIONS, Action, Decision
from tillerman.rules.detect import Finding, detect
from tillerman.rules.policy import STEER_AT_PRE_TOOL_USE, capabilities, decide
from tillerman.rules.ruleset import RuleSet

#: Decisions the controller settles itself, with no transport involved: the policy's
#: reason -> the ledger's reason for the terminal move.
_EXPIRY_REASONS = {"expires_at_passed": "expires_at_passed", "turn_ended": "turn_ended",
                   "effect_deadline_passed": "effect_deadline_passed"}
_REFUSAL_REASONS = {"no_grant": "no_grant", "missing_expected_turn": "invalid",
                    "not_steerable": "not_dispatchable", "rule_not_active": "not_dispatchable",
                    "rule_version_changed": "not_dispatchable"}


class Step:
    def __init__(self, ruleset: RuleSet, *, replay: bool) -> None:
        self.ruleset = ruleset
        self.replay = replay
        self.seen_findings: set[str] = set()

    def step(self, projection: Projection, thread_ids: Iterable[str], now: float) -> list[Envelope]:
        out: list[Envelope] = []
        for thread_id in sorted(set(thread_ids)):
            for finding in detect(projection.snapshot(thread_id), now, self.ruleset):
                out.extend(self._on_finding(projection, finding, now))
        return out

    def decide_intents(
        self, projection: Projection, views: Iterable[IntentView], now: float
    ) -> tuple[list[Envelope], list[tuple[IntentView, Decision]]]:
        """Decide each open intent. A decision is recorded only when it changed; every
        current decision is returned, for the daemon to carry out (replay never does)."""
        out: list[Envelope] = []
        decided: list[tuple[IntentView, Decision]] = []
        snapshots: dict[str, ThreadSnapshot] = {}  # one per thread: nothing folds meanwhile
        for view in sorted(views, key=lambda v: v.intent.id):
            thread_id = view.intent.thread_id
            if thread_id not in snapshots:
                snapshots[thread_id] = projection.snapshot(thread_id)
            decision = decide(view.intent, view.state, snapshots[thread_id], now, self.ruleset)
            decided.append((view, decision))
            if view.last_decision == (decision.action, decision.reason):
                continue
            out.append(self._decision_envelope(view, decision, now))
            settled = self._settle(view, decision)
            if settled is not None:
                out.append(transition_envelope(view.intent, view.state, settled[0], settled[1],
                                               {"decision": decision.action.value}, now))
        return out, decided

    @staticmethod
    def _settle(view: IntentView, decision: Decision) -> tuple[State, str] | None:
        """A terminal move the decision itself settles, before any transport."""
        if decision.action is Action.EXPIRE and decision.reason in _EXPIRY_REASONS:
            if (view.state, State.EXPIRED) in _MOVES:
                return State.EXPIRED, _EXPIRY_REASONS[decision.reason]
        if decision.action is Action.ESCALATE and view.state == State.PROPOSED and decision.reason in _REFUSAL_REASONS:
            return State.REJECTED, _REFUSAL_REASONS[decision.reason]
        return None

    # -- findings ----------------------------------------------------------------

    def _on_finding(self, projection: Projection, finding: Finding, now: float) -> list[Envelope]:
        if finding.key in self.seen_findings:
            return []
        self.seen_findings.add(finding.key)
        action = Action(finding.action)
        if finding.status == "shadow":
            return self._shadow(projection, finding, action, now)
        if action in DISPATCH_ACTIONS and finding.status == "active":
            try:
                proposed = self._propose(projection, finding, action, now)
            except IntentError as exc:  # e.g. a steer finding with no turn to target
                return [self._report(finding, action, now, {"not_proposed": str(exc)})]
            if proposed and "usage_seq" in finding.detail:
                # A budget's crossing: the figure that crossed and its source are recorded
                # beside the proposal (the intent holds only its text), for the report.
                proposed.append(self._report(finding, action, now, {"proposed": intent_id_from(finding.key)}))
            return proposed
        return [self._report(finding, action, now, {})]

    def _report(self, finding: Finding, action: Action, now: float, extra: dict) -> Envelope:
        report = Report(
            thread_id=finding.thread_id, turn_id=finding.turn_id, rule_id=finding.rule_id,
            rule_version=finding.rule_version, finding=finding.finding,
            ruleset_digest=self.ruleset.digest,
            detail={**finding.detail, "action": action.value, "status": finding.status, **extra},
        )
        return Envelope(event_id=f"report:{finding.key}", event=report, source=SOURCE, at=now)

    def _shadow(self, projection: Projection, finding: Finding, action: Action, now: float) -> list[Envelope]:
        """A shadow rule's finding: a report marked shadow and, for a dispatch action, the
        decision the policy would have made at this moment were the rule active, recorded
        as a shadow decision about the intent it would have proposed. Neither the intent
        nor anything dispatchable is ever recorded."""
        if action not in DISPATCH_ACTIONS:
            return [self._report(finding, action, now, {"shadow": True})]
        try:
            intent = self._intent(projection, finding, action, now)
        except IntentError as exc:
            return [self._report(finding, action, now, {"shadow": True, "not_proposed": str(exc)})]
        as_active = msgspec.structs.replace(self.ruleset, rules=tuple(
            msgspec.structs.replace(r, status="active") if r.id == finding.rule_id else r for r in self.ruleset.rules))
        decision = decide(intent, State.PROPOSED, projection.snapshot(finding.thread_id), now, as_active)
        event = DecisionRecorded(
            thread_id=finding.thread_id, turn_id=finding.turn_id, intent_id=intent.id,
            action=decision.action.value, reason=decision.reason, rule_id=finding.rule_id,
            rule_version=finding.rule_version, ruleset_digest=self.ruleset.digest, shadow=True,
        )
        return [self._report(finding, action, now, {"shadow": True, "would_be_intent": intent.id}),
                Envelope(event_id=f"shadow:{finding.key}", event=event, source=SOURCE, at=now)]

    def _propose(self, projection: Projection, finding: Finding, action: Action, now: float) -> list[Envelope]:
        if intent_id_from(finding.key) in projection.intents:
            return []
        return proposal_envelopes(self._intent(projection, finding, action, now), projection)

    def _intent(self, projection: Projection, finding: Finding, action: Action, now: float) -> Intent:
        intent_id = intent_id_from(finding.key)
        rule = self.ruleset.rule(finding.rule_id)
        labels = {"task_class": rule.task_class} if rule is not None and isinstance(rule.task_class, str) else {}
        return build_intent(
            projection, thread_id=finding.thread_id, mode=action.value, text=finding.text or finding.finding,
            now=now, expected_turn=None if action is Action.STOP else finding.turn_id,  # a stop targets the thread
            deliver_at=_delivery_point(action, projection.snapshot(finding.thread_id)),
            ack_deadline=finding.ack_deadline if finding.ack_deadline is not None else 120.0,
            producer=f"rule:{finding.rule_id}", owner=None, intent_id=intent_id, verify=finding.verify,
            rule_id=finding.rule_id, rule_version=finding.rule_version,
            ruleset_digest=self.ruleset.digest, replayed=self.replay, **labels,
        )

    def _decision_envelope(self, view: IntentView, decision: Decision, now: float) -> Envelope:
        count = sum(1 for h in view.history if h.kind == "decision")
        event = DecisionRecorded(
            thread_id=view.intent.thread_id, turn_id=view.intent.expected_turn_id, intent_id=view.intent.id,
            action=decision.action.value, reason=decision.reason, rule_id=decision.rule_id,
            rule_version=decision.rule_version, ruleset_digest=self.ruleset.digest,
        )
        return Envelope(event_id=f"{view.intent.id}:decision:{count}:{decision.action}:{decision.reason}",
                        event=event, source=SOURCE, at=now)


def _delivery_point(action: Action, snapshot: ThreadSnapshot) -> str | None:
    """Where a rule's steer is delivered: a thread reached only through Claude Code's
    hooks takes a steer only before its next tool call (PreToolUse's deny); anywhere else
    the steer follows the running turn, as a person's does by default."""
    if action is Action.STEER and STEER_AT_PRE_TOOL_USE in capabilities(snapshot):
        return PRE_TOOL_USE
    return None
