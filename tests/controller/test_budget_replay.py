"""Replay decides the same budget reports as the daemon: a recorded Codex rollout with
token_count lines, replayed, and its observations and usage handed to a daemon one round
per row on a clock at the row's time."""

from __future__ import annotations

import datetime


from tests.controller.test_round import SESSION, think_each
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger import events as ev
from tillerman.ledger.events import OBSERVATION_KINDS
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.decision import Action
from tillerman.rules.ruleset import Budget, Rule, build_ruleset

#: Four responses of three turns (9,858 + 10,004, then 10,064 and 10,277 tokens).
ROLLOUT = SESSION.parent / "codex-rollout" / "live-0.163-supervised.jsonl"


def _budget(rule_id: str, condition: Budget) -> Rule:
    return Rule(id=rule_id, version=1, status="active", condition=condition, action=Action.REPORT_OVERDUE,
                owner="ann", review_by=datetime.date(2099, 1, 1), text=rule_id)


BUDGETS = build_ruleset((_budget("turn", Budget(measure="tokens", over=15_000, per="turn")),
                         _budget("thread", Budget(measure="tokens", over=20_000, per="thread")),
                         _budget("day", Budget(measure="tokens", over=35_000, per="day")),
                         _budget("context", Budget(measure="context", over=0.03, per="turn"))), ())


def _budget_reports(rows) -> list[tuple]:
    return [(e.envelope.event.rule_id, e.envelope.event.detail["instance"], e.envelope.event.detail["figure"],
             e.envelope.event.detail["usage_seq"] is not None, e.envelope.at)
            for e in rows if isinstance(e.envelope.event, ev.Report)]


def test_the_daemon_and_replay_report_the_same_budget_crossings(tmp_path):
    replayed = MemoryRecorder()
    Replayer(replayed, BUDGETS).run([str(ROLLOUT)])
    found = _budget_reports(replayed.read())
    # each crossing once: the first turn (19,862), the thread and the day, each turn's context
    assert sorted((rule, figure) for rule, _, figure, _, _ in found if rule != "context") == [
        ("day", 40203), ("thread", 29926), ("turn", 19862)]
    assert len([r for r in found if r[0] == "context"]) == 3
    rows = [e.envelope for e in replayed.read()
            if ev.kind_of(e.envelope.event) in OBSERVATION_KINDS or isinstance(e.envelope.event, ev.Usage)]

    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        think_each(recorder, BUDGETS, rows)
        assert _budget_reports(recorder.read()) == found
