"""The intent state machine, as data.

Every legal move is one row of ``TRANSITIONS``: (from, to) -> the reasons that may
carry it. A move not in the table is refused with ``IllegalTransition`` before
anything is written. Evidence for a state already reached (a late ``{"turnId"}``
reply after the echo, a second echo) is not a transition: it is recorded as an
``intent_evidence`` event and never refused.

    proposed ──▶ dispatch_unknown ──▶ queued ──▶ acknowledged ──▶ action_started
        │               │  │            │            │   │              │
        ▼               ▼  ▼            ▼            ▼   ▼              ▼
    rejected/expired  rejected/expired  expired   effect_verified / effect_failed / expired
"""

from __future__ import annotations

from enum import StrEnum

from tillerman.ledger.errors import IllegalTransition
from tillerman.ledger.intents import Intent


class State(StrEnum):
    PROPOSED = "proposed"
    DISPATCH_UNKNOWN = "dispatch_unknown"
    QUEUED = "queued"
    ACKNOWLEDGED = "acknowledged"
    ACTION_STARTED = "action_started"
    EFFECT_VERIFIED = "effect_verified"
    EFFECT_FAILED = "effect_failed"
    EXPIRED = "expired"
    REJECTED = "rejected"


S = State

#: (from, to) -> reasons allowed for that move. The table in docs/design.md
#: "Intents: the delivery protocol", row by row.
TRANSITIONS: dict[tuple[State, State], frozenset[str]] = {
    # the dispatcher is about to call the transport (committed first)
    (S.PROPOSED, S.DISPATCH_UNKNOWN): frozenset({"dispatching"}),
    # refused before any request
    # review_failed: a reviewer asked before dispatch failed closed (tillerman.controller.review.checkpoints)
    (S.PROPOSED, S.REJECTED): frozenset({"no_grant", "invalid", "thread_unknown", "not_dispatchable", "review_failed"}),
    (S.PROPOSED, S.EXPIRED): frozenset({"expires_at_passed", "turn_ended", "cancelled", "superseded"}),
    # the transport accepted it: steer {"turnId"}, queue a submission id, interrupt {}
    (S.DISPATCH_UNKNOWN, S.QUEUED): frozenset({"accepted"}),
    # the echo arrived before the reply, or a readback after a crash found it
    # stop_applied: a stop's steps are carried out (goal paused, our queued messages
    # withdrawn, the running turn interrupted, the thread's commands terminated)
    (S.DISPATCH_UNKNOWN, S.ACKNOWLEDGED): frozenset(
        {"echo", "readback_found", "ack_token", "turn_interrupted", "stop_applied"}),
    # a definite refusal; a failed steer has no side effects
    (S.DISPATCH_UNKNOWN, S.REJECTED): frozenset(
        {"stale_turn", "no_active_turn", "thread_not_found", "invalid_input", "queue_busy", "refused"}
    ),
    # the expected turn ended and a readback shows our clientId absent
    # ack token: the echo came, then the turn that took it ended without the token
    # deny_not_honoured: the tool call a Claude Code hook denied to deliver a steer ran anyway
    # withdrawn: a stop deleted our queued message from the server's queue (its
    # thread/queue/delete answered deleted: true), so it can never start a turn
    (S.DISPATCH_UNKNOWN, S.EXPIRED): frozenset({"not_delivered", "ack_token_missing", "deny_not_honoured",
                                                "withdrawn"}),
    (S.QUEUED, S.ACKNOWLEDGED): frozenset({"echo", "ack_token", "turn_interrupted", "queue_turn_started"}),
    (S.QUEUED, S.EXPIRED): frozenset({"lost_after_accept", "expires_at_passed", "ack_token_missing", "withdrawn"}),
    (S.ACKNOWLEDGED, S.ACTION_STARTED): frozenset({"expect_matched"}),
    # stop_verified: a stop's readback (thread/turns/list, thread/goal/get) shows no turn
    # running and no active goal
    (S.ACKNOWLEDGED, S.EFFECT_VERIFIED): frozenset({"verify_passed", "stop_verified"}),
    # cwd_unknown: the thread's working directory is unknown, so the readback cannot run there
    # still_working: a stop's readbacks kept finding a turn running or the goal active
    (S.ACKNOWLEDGED, S.EFFECT_FAILED): frozenset({"verify_failed", "cwd_unknown", "still_working"}),
    (S.ACKNOWLEDGED, S.EXPIRED): frozenset({"effect_deadline_passed"}),
    (S.ACTION_STARTED, S.EFFECT_VERIFIED): frozenset({"verify_passed"}),
    (S.ACTION_STARTED, S.EFFECT_FAILED): frozenset({"verify_failed", "cwd_unknown"}),
    (S.ACTION_STARTED, S.EXPIRED): frozenset({"effect_deadline_passed"}),
}

ALWAYS_TERMINAL = frozenset({S.EFFECT_VERIFIED, S.EFFECT_FAILED, S.EXPIRED, S.REJECTED})


def known_state(name: str, intent_id: str) -> State:
    """A state named by an event (offered, or stored by a newer or forged writer);
    ``IllegalTransition`` for a name this version does not know: no move to or from it."""
    try:
        return State(name)
    except ValueError:
        raise IllegalTransition(f"intent {intent_id}: {name!r} is not an intent state this tillerman knows") from None


def is_terminal(state: State, intent: Intent) -> bool:
    """``acknowledged`` is terminal only for an intent with nothing left to check."""
    if state in ALWAYS_TERMINAL:
        return True
    return state is S.ACKNOWLEDGED and not intent.has_check


def check_transition(from_state: State, to_state: State, reason: str) -> None:
    """Raise ``IllegalTransition`` unless the table allows this move for this reason."""
    allowed = TRANSITIONS.get((from_state, to_state))
    if allowed is None:
        legal = sorted(to for (frm, to) in TRANSITIONS if frm is from_state)
        hint = f"legal next states: {', '.join(legal)}" if legal else f"{from_state} is terminal"
        raise IllegalTransition(f"intent cannot move from {from_state} to {to_state} ({hint})")
    if reason not in allowed:
        raise IllegalTransition(
            f"{from_state} -> {to_state} needs one of the reasons {', '.join(sorted(allowed))}; got {reason!r}"
        )
