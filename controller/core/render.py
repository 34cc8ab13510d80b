"""Intents and reports as plain JSON-ready dicts (times ISO-8601 UTC)."""

from __future__ import annotations

from tillerman.controller.core.overdue import Overdue
from tillerman.controller.core.timefmt import iso
from tillerman.ledger.projections import IntentView


def intent_json(view: IntentView, *, history: bool) -> dict:
    i = view.intent
    data = {
        "id": i.id,
        "thread": i.thread_id,
        "expected_turn": i.expected_turn_id,
        "mode": i.mode,
        "state": view.state,
        "owner": i.owner,
        "producer": i.producer,
        "text": i.text,
        "text_digest": i.text_digest,
        "client_user_message_id": i.client_user_message_id,
        "created_at": iso(i.created_at),
        "ack_deadline": iso(i.ack_deadline),
        "effect_deadline": iso(i.effect_deadline),
        "expires_at": iso(i.expires_at),
        "expect": i.expect,
        "verify": i.verify,
        "supersedes": i.supersedes,
        "ack_token": i.ack_token,
        "force": i.force,
        "resume_queue": i.resume_queue,
        "replayed": i.replayed,
        "rule_id": i.rule_id,
        "task_class": i.task_label,
        "ruleset_digest": i.ruleset_digest,
        "last_decision": None if view.last_decision is None else
        {"action": view.last_decision[0], "reason": view.last_decision[1]},
    }
    if history:
        data["history"] = [
            {"seq": h.seq, "at": iso(h.at), "kind": h.kind, "state": h.state,
             "reason": h.reason, "evidence": h.evidence}
            for h in view.history
        ]
    return data


def overdue_json(o: Overdue) -> dict:
    return {
        "intent": o.intent_id,
        "thread": o.thread_id,
        "expected_turn": o.expected_turn_id,
        "mode": o.mode,
        "state": o.state,
        "owner": o.owner,
        "deadline": o.deadline,
        "due_at": iso(o.due_at),
        "overdue_seconds": round(o.overdue_for, 3),
        "age_seconds": round(o.age, 3),
        "why": o.why,
    }
