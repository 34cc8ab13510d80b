"""Intents, reports and goals as plain JSON-ready dicts (times ISO-8601 UTC)."""

from __future__ import annotations

from collections.abc import Iterable

from tillerman.controller.core.overdue import Overdue
from tillerman.controller.core.timefmt import iso
from tillerman.ledger.events import Entry, GoalCleared, GoalUpdated
from tillerman.ledger.projections import IntentView, Projection, ThreadState, is_open
from tillerman.ledger.snapshot import ThreadGoal

#: The ledger kinds that change a thread's goal (``Recorder.history(kinds=...)``).
GOAL_KINDS = ("goal_updated", "goal_cleared")


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


def goal_json(goal: ThreadGoal | None) -> dict | None:
    """A thread's Codex goal as the commands show it; None when none was seen on it."""
    if goal is None:
        return None
    return {"status": goal.status, "token_budget": goal.token_budget, "tokens_used": goal.tokens_used,
            "time_used_seconds": goal.time_used_seconds, "origin": goal.origin,
            "objective_digest": goal.objective_digest, "changed_at": iso(goal.changed_at),
            "changed_by": goal.changed_by, "turn": goal.turn_id}


def goal_text(goal: dict | None) -> str:
    """One table cell for ``goal_json``'s goal: its status and its use of the budget
    ("budgetLimited 26043/20000 tokens", "active 1200 tokens"), "-" for none."""
    if goal is None:
        return "-"
    used, budget = goal["tokens_used"], goal["token_budget"]
    if budget is not None:
        return f"{goal['status']} {'?' if used is None else used}/{budget} tokens"
    return goal["status"] if used is None else f"{goal['status']} {used} tokens"


def trigger_counts(thread: ThreadState) -> dict[str, int]:
    """What started the thread's recent turns (``ThreadState.turn_triggers``, its last
    ``RECENT_TURNS``: user, goal, queue, unknown; read from a rollout or inferred live),
    counted by trigger."""
    counts: dict[str, int] = {}
    for trigger, _ in thread.turn_triggers.values():
        counts[trigger] = counts.get(trigger, 0) + 1
    return dict(sorted(counts.items()))


def goals_at(entries: Iterable[Entry], thread_id: str, seqs: Iterable[int]) -> dict[int, ThreadGoal | None]:
    """The thread's goal as it stood at each of ``seqs`` (after the row there), folded
    from ``entries`` in seq order (only its goal rows are read: ``GOAL_KINDS``)."""
    wanted = sorted(set(seqs))
    fold, found, entries = Projection(), {}, iter(entries)
    pending = next(entries, None)
    for seq in wanted:
        while pending is not None and pending.seq <= seq:
            event = pending.envelope.event
            if isinstance(event, GoalUpdated | GoalCleared) and event.thread_id == thread_id:
                fold.apply(pending)
            pending = next(entries, None)
        thread = fold.threads.get(thread_id)
        found[seq] = thread.goal if thread is not None else None
    return found


def intent_goals(view: IntentView, goal_entries: Iterable[Entry], last_seq: int) -> dict:
    """The intent's thread's goal as it stood when the intent was proposed, and when it
    settled (``goal_at_end``) or, while it is open, now (``goal_now``, as of
    ``last_seq``); nothing when the thread had no goal at either. ``goal_entries``: the
    ledger's goal rows (``GOAL_KINDS``) in seq order."""
    proposed = view.history[0].seq if view.history else last_seq
    still_open = is_open(view)
    end = last_seq if still_open or not view.history else view.history[-1].seq
    found = goals_at(goal_entries, view.intent.thread_id, (proposed, end))
    if found[proposed] is None and found[end] is None:
        return {}
    return {"goal_at_proposal": goal_json(found[proposed]),
            "goal_now" if still_open else "goal_at_end": goal_json(found[end])}
