"""``tillerman report --db FILE``: the account and the rows under it as plain tables in
a SQLite file of its own, built with sqlite-utils, for ``sqlite-utils query`` or
Datasette. The file is marked as a report database (SQLite's ``application_id``), so a
later run recognises it and replaces it whole; nothing else is ever replaced by one
(``tillerman.ledger.paths``).

Tables: ``account`` (one row per figure), ``intents``, ``journeys`` (each intent's
states, decisions and evidence, in seq order), ``turns``, ``tool_calls``,
``interventions`` (the decisions about intents), ``notifications`` (the reports made
for a person), ``goal_changes`` (each change of a thread's Codex goal), ``labels`` (every
owner's label, ``standing`` the one that counts; a finding's label names the ``event_id``
of its ``notifications`` row); a turn's row says
what started it (``trigger``, ``trigger_inferred``). Labels and reasons are searchable (FTS on ``intents`` and ``journeys``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import sqlite_utils

from tillerman.controller.report.account import Account, Delays, Figure, Group, Spend
from tillerman.controller.report.fold import Facts

#: SQLite's ``application_id`` of a report database ("TlmR"), at byte 68 of its header.
APPLICATION_ID = 0x546C6D52
_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_report_db(head: bytes) -> bool:
    """Whether a file's first bytes are those of a report database ``write_db`` wrote."""
    return head.startswith(_SQLITE_MAGIC) and head[68:72] == APPLICATION_ID.to_bytes(4, "big")


def write_db(path: Path, facts: Facts, result: Account) -> None:
    """Fill ``path``, a new empty file."""
    db = sqlite_utils.Database(path)
    try:
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        _tables(db, facts, result)
    finally:
        db.close()


def _tables(db: sqlite_utils.Database, facts: Facts, result: Account) -> None:
    _fill(db, "account", account_rows(result), _ACCOUNT_COLUMNS, "id")
    intents = facts.projection.intents.values()
    _fill(db, "intents", ({
        "id": v.intent.id, "thread_id": v.intent.thread_id, "expected_turn_id": v.intent.expected_turn_id,
        "mode": v.intent.mode, "task_class": v.intent.task_label, "rule_id": v.intent.rule_id,
        "owner": v.intent.owner, "producer": v.intent.producer, "state": str(v.state),
        "reason": next((h.reason for h in reversed(v.history) if h.kind == "transition"), None),
        "created_at": v.intent.created_at, "has_check": v.intent.has_check, "text_digest": v.intent.text_digest,
    } for v in intents), _INTENT_COLUMNS, "id")
    _fill(db, "journeys", ({
        "intent_id": v.intent.id, "seq": h.seq, "at": h.at, "kind": h.kind, "state": str(h.state),
        "reason": h.reason, "evidence": json.dumps(h.evidence, sort_keys=True),
    } for v in intents for h in v.history), _JOURNEY_COLUMNS, ("intent_id", "seq"),
        foreign_keys=[("intent_id", "intents", "id")])
    _fill(db, "turns", ({
        "thread_id": t.thread_id, "turn_id": t.turn_id, "started_at": t.started_at, "ended_at": t.ended_at,
        "status": t.status, "seconds": t.seconds, **_trigger_columns(facts.trigger(t)),
    } for t in facts.turns.values()), _TURN_COLUMNS, ("thread_id", "turn_id"))
    _fill(db, "tool_calls", ({
        "thread_id": c.thread_id, "turn_id": c.turn_id, "item_id": c.item_id, "item_type": c.item_type,
        "tool": c.tool, "critical": c.critical, "started_at": c.started_at, "ended_at": c.ended_at,
        "status": c.status, "exit_code": c.exit_code,
    } for c in facts.calls.values()), _CALL_COLUMNS, ("thread_id", "item_id"))
    _fill(db, "interventions", (msgspec.structs.asdict(d) for d in facts.decisions), _DECISION_COLUMNS, "seq")
    _fill(db, "notifications", (msgspec.structs.asdict(r) for r in facts.reports), _REPORT_COLUMNS, "seq")
    _fill(db, "goal_changes", (msgspec.structs.asdict(c) for c in facts.goal_changes), _GOAL_CHANGE_COLUMNS, "seq")
    _fill(db, "labels", ({"seq": given.seq, "at": given.at, "subject": given.subject, "verdict": given.verdict,
                          "note": given.note, "by": given.by, "thread": given.thread,
                          "standing": given == standing}
                         for standing in facts.labels.all_current() for given in facts.labels.history(standing.subject)),
          _LABEL_COLUMNS, "seq")
    for table, columns in (("journeys", ["intent_id"]), ("turns", ["status"]), ("tool_calls", ["turn_id"]),
                           ("interventions", ["intent_id"]), ("notifications", ["thread_id"]),
                           ("intents", ["task_class"]), ("intents", ["thread_id"]),
                           ("goal_changes", ["thread_id"]), ("turns", ["trigger"])):
        db[table].create_index(columns, if_not_exists=True)
    db["intents"].enable_fts(["task_class", "mode", "rule_id", "owner", "state", "reason"])
    db["journeys"].enable_fts(["state", "reason"])
    db["notifications"].enable_fts(["rule_id", "finding"])


def _trigger_columns(trigger: tuple[str | None, bool]) -> dict:
    return {"trigger": trigger[0], "trigger_inferred": trigger[1] if trigger[0] is not None else None}


def _fill(db: sqlite_utils.Database, name: str, rows, columns: dict, pk, foreign_keys=None) -> None:
    """Create the table with its columns first, so an empty one is still there to query."""
    db[name].create(columns, pk=pk, foreign_keys=foreign_keys)
    db[name].insert_all(rows)


def account_rows(result: Account) -> Iterator[dict]:
    """One row per figure: section, group, name, value, how, events, why."""
    counter = iter(range(1, 1 << 30))

    def row(section: str, group: str, name: str, figure: Figure) -> dict:
        return {"id": next(counter), "section": section, "group_key": group, "name": name, "value": figure.value,
                "how": figure.how, "events": figure.events, "why": figure.why}

    for group in (result.totals, *result.groups):
        key = ",".join(f"{k}={v}" for k, v in group.key.items()) or "all"
        yield from (row("interventions", key, name, figure) for name, figure in _group_figures(group))
    for section in ("delivery", "cancelled_work", "after_interventions", "owner_interruptions", "reviewer", "stalls",
                    "goals", "budgets"):
        for name, value in msgspec.structs.asdict(getattr(result, section)).items():
            if isinstance(value, Figure):
                yield row(section, "all", name, value)
            elif isinstance(value, Spend):
                yield from (row(section, "all", f"{name}:{part}", figure) for part, figure in _spend_figures(value))
    for trigger, figure in result.goals.turns_by_trigger.items():
        yield row("goals", "all", f"turns_by_trigger:{trigger}", figure)
    labels = result.owner_labels
    yield row("owner_labels", "all", "labels", labels.labels)
    for dimension in ("rule", "reviewer", "mode"):
        for name, measured in getattr(labels, f"by_{dimension}").items():
            yield row("owner_labels", f"{dimension}={name}", "precision", measured.precision)
            yield row("owner_labels", f"{dimension}={name}", "labeled",
                      Figure(value=measured.labeled, how="subjects with a standing label", events=measured.labeled))
            yield row("owner_labels", f"{dimension}={name}", "unlabeled",
                      Figure(value=measured.unlabeled, how="subjects with no label", events=measured.unlabeled))
    for name, agreed in labels.reviewer_agreement.items():
        yield row("owner_labels", f"reviewer={name}", "agreement", agreed.agreement)


def _spend_figures(spend: Spend) -> Iterator[tuple[str, Figure]]:
    """A spend's tokens and cost as figures (a cost with no price says whose)."""
    for part, value in (*spend.tokens.items(), ("cost_usd", spend.cost_usd)):
        why = spend.why if value is None else None
        if value is None and why is None:
            why = "no price for " + ", ".join(f"{m['model']} ({m['reason']})" for m in spend.cost_missing) \
                if part == "cost_usd" and spend.cost_missing else "out of range"
        yield part, Figure(value=value, how=spend.how, events=spend.turns, why=why)


def _group_figures(group: Group) -> Iterator[tuple[str, Figure]]:
    for name, value in msgspec.structs.asdict(group).items():
        if isinstance(value, Figure):
            yield name, value
        elif isinstance(value, Delays):
            yield from ((f"{name}_{q}", getattr(value, q)) for q in ("p50", "p95", "max"))
        elif name in ("rejected_by_reason", "expired_by_reason"):
            verb = name.split("_")[0]
            yield from ((f"{verb}:{reason}", Figure(value=n, how=f"intents {verb} with reason {reason}", events=n))
                        for reason, n in value.items())


# Column types, so an empty table still has its columns (a query on it answers nothing, not an error).
_ACCOUNT_COLUMNS = {"id": int, "section": str, "group_key": str, "name": str, "value": float, "how": str,
                    "events": int, "why": str}
_INTENT_COLUMNS = {"id": str, "thread_id": str, "expected_turn_id": str, "mode": str, "task_class": str,
                   "rule_id": str, "owner": str, "producer": str, "state": str, "reason": str,
                   "created_at": float, "has_check": int, "text_digest": str}
_JOURNEY_COLUMNS = {"intent_id": str, "seq": int, "at": float, "kind": str, "state": str, "reason": str,
                    "evidence": str}
_TURN_COLUMNS = {"thread_id": str, "turn_id": str, "started_at": float, "ended_at": float, "status": str,
                 "seconds": float, "trigger": str, "trigger_inferred": int}
_CALL_COLUMNS = {"thread_id": str, "turn_id": str, "item_id": str, "item_type": str, "tool": str, "critical": int,
                 "started_at": float, "ended_at": float, "status": str, "exit_code": int}
_DECISION_COLUMNS = {"seq": int, "at": float, "thread_id": str, "intent_id": str, "action": str, "reason": str,
                     "rule_id": str, "shadow": int}
_REPORT_COLUMNS = {"seq": int, "at": float, "thread_id": str, "turn_id": str, "rule_id": str, "finding": str,
                   "action": str, "shadow": int, "intent_id": str, "event_id": str}
_LABEL_COLUMNS = {"seq": int, "at": float, "subject": str, "verdict": str, "note": str, "by": str, "thread": str,
                  "standing": int}
_GOAL_CHANGE_COLUMNS = {"seq": int, "at": float, "thread_id": str, "status": str, "by": str, "token_budget": int,
                        "tokens_used": int, "turn_id": str}
