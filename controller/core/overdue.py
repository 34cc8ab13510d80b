"""Which owned intents passed their acknowledgement or effect deadline, and why."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import IntentView, Projection

#: States waiting for the recipient to acknowledge, and those waiting for an effect.
_AWAITING_ACK = frozenset({State.PROPOSED, State.DISPATCH_UNKNOWN, State.QUEUED})
_AWAITING_EFFECT = frozenset({State.ACKNOWLEDGED, State.ACTION_STARTED})

_WHY = {
    State.PROPOSED: "not dispatched yet (held by policy: check its last decision)",
    State.DISPATCH_UNKNOWN: "delivery outcome unknown; it is never resent, and settles when the echo"
    " appears or a readback decides once the turn it was meant for (a queued message: the turn it waits"
    " behind) has ended",
    State.QUEUED: "accepted by the server but no clientId echo yet",
    State.ACKNOWLEDGED: "acknowledged, but the expected action has not started",
    State.ACTION_STARTED: "action started, but the effect is not verified",
}


#: How the notifier and a resolution name an intent's overdue notice: ``overdue:INTENT``.
OVERDUE_SUBJECT = "overdue:"


def overdue_subject(intent_id: str) -> str:
    """The subject of ``intent_id``'s overdue notice."""
    return f"{OVERDUE_SUBJECT}{intent_id}"


class Overdue(msgspec.Struct, frozen=True, kw_only=True):
    intent_id: str
    thread_id: str
    expected_turn_id: str | None
    mode: str
    state: str
    owner: str | None
    deadline: str  # "ack" | "effect"
    due_at: float
    overdue_for: float
    age: float
    why: str


def overdue(projection: Projection, now: float, resolved_at: Mapping[str, float] | None = None) -> list[Overdue]:
    """The intents past a deadline and needing attention: one whose notice a person
    resolved after that deadline passed (``resolved_at``: subject -> when, as
    ``notice_resolution.resolutions`` reads them) is left out."""
    found = []
    for view in projection.open_intents():
        due = deadline(view)
        if due is None or now < due[1]:
            continue
        if resolution_covers((resolved_at or {}).get(overdue_subject(view.intent.id)), due[1]):
            continue
        intent, state = view.intent, view.state
        why = _WHY.get(state, state.value)
        if view.last_decision:
            why += f"; last decision: {view.last_decision[0]} ({view.last_decision[1]})"
        found.append(Overdue(
            intent_id=intent.id, thread_id=intent.thread_id, expected_turn_id=intent.expected_turn_id,
            mode=intent.mode, state=view.state, owner=intent.owner, deadline=due[0], due_at=due[1],
            overdue_for=now - due[1], age=now - intent.created_at, why=why,
        ))
    return sorted(found, key=lambda o: (o.due_at, o.intent_id))


def deadline(view: IntentView) -> tuple[str, float] | None:
    """The deadline the intent waits on now: ("ack" | "effect", when); None when it waits on none."""
    if view.state in _AWAITING_ACK:
        return "ack", view.intent.ack_deadline
    if view.state in _AWAITING_EFFECT and view.intent.effect_deadline is not None:
        return "effect", view.intent.effect_deadline
    return None


def resolution_covers(resolved_at: float | None, due_at: float) -> bool:
    """Whether a resolution made at ``resolved_at`` covers the deadline ``due_at``: it
    does when the deadline had passed by then; a later one is news to the person."""
    return resolved_at is not None and resolved_at >= due_at
