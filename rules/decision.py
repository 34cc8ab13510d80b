"""The registered action vocabulary and the decision value ``decide()`` returns.

The vocabulary is closed: a rule or a reviewer can only choose one of these, never
invent a new power by naming one.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class Action(StrEnum):
    OBSERVE = "observe"
    OBSERVE_CRITICAL = "observe_critical"
    RECONCILE = "reconcile"
    RECONCILE_TURN = "reconcile_turn"
    REPORT_OVERDUE = "report_overdue"
    STEER = "steer"
    QUEUE = "queue"
    INTERRUPT = "interrupt"
    STOP = "stop"
    VERIFY_EFFECT = "verify_effect"
    EXPIRE = "expire"
    ESCALATE = "escalate"


#: Actions that send something to the agent (need a grant; never for replayed intents).
DISPATCH_ACTIONS = frozenset({Action.STEER, Action.QUEUE, Action.INTERRUPT, Action.STOP})


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    action: Action
    reason: str
    rule_id: str | None = None
    rule_version: int | None = None
