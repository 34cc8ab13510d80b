"""The report and the timeline of the recorded Codex 0.171.0 goal session: each thread's
goal changes and what started its turns (inferred live from the trace, read from the
rollout), in the account's text, --json and --db, and as marks on the timeline page."""

from __future__ import annotations

import json
import sqlite3

from tests.controller.test_goal_display import ROLLOUT, budget_limited_ledger, run
from tests.controller.test_timeline import embedded_data
from tests.monitor.support import SESSIONS


def test_the_account_counts_turns_by_trigger_and_the_goals_changes(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    thread, _ = budget_limited_ledger(ledger)
    goals = json.loads(run("report", "--json", "--ledger", str(ledger)))["goals"]
    assert {k: f["value"] for k, f in goals["turns_by_trigger"].items()} == {"goal": 2, "user": 2}
    assert goals["inferred_triggers"]["value"] == 4
    assert (goals["goal_changes"]["value"], goals["budget_limited"]["value"]) == (2, 1)
    (row,) = goals["threads"]
    assert (row["thread_id"], row["goal_status"], row["goal_statuses"], row["turns_by_trigger"]) == (
        thread, "budgetLimited", ["active", "budgetLimited"], {"goal": 2, "user": 2})
    text = run("report", "--ledger", str(ledger))
    assert f"  thread {thread}: goal active -> budgetLimited (now budgetLimited, {row['tokens_used']} of 20000" \
           " tokens); turns by trigger: goal 2, user 2" in text


def test_a_replayed_rollout_says_what_started_each_turn_without_inferring():
    goals = json.loads(run("report", "--json", str(SESSIONS / ROLLOUT)))["goals"]
    assert {k: f["value"] for k, f in goals["turns_by_trigger"].items()} == {"goal": 2, "queue": 1, "user": 1}
    assert goals["inferred_triggers"]["value"] == 0


def test_the_report_database_has_each_turns_trigger_and_the_goal_changes(tmp_path):
    ledger, db = tmp_path / "ledger.sqlite3", tmp_path / "account.db"
    budget_limited_ledger(ledger)
    run("report", "--ledger", str(ledger), "--db", str(db))
    with sqlite3.connect(db) as con:
        turns = con.execute("select trigger, trigger_inferred from turns order by started_at").fetchall()
        changes = con.execute("select status, token_budget from goal_changes order by seq").fetchall()
        figures = dict(con.execute("select name, value from account where section = 'goals'").fetchall())
    con.close()
    assert turns == [("user", 1), ("goal", 1), ("goal", 1), ("user", 1)]
    assert changes == [("active", 20000), ("budgetLimited", 20000)]
    assert figures["turns_by_trigger:goal"] == 2 and figures["budget_limited"] == 1


def test_the_timeline_marks_the_goals_changes_and_each_turns_trigger(tmp_path):
    ledger, page = tmp_path / "ledger.sqlite3", tmp_path / "timeline.html"
    budget_limited_ledger(ledger)
    run("timeline", "--ledger", str(ledger), "--html", str(page))
    data = embedded_data(page.read_text())
    assert [(g["status"], g["halted"]) for g in data["goals"]] == [("active", False), ("budgetLimited", True)]
    assert [(t["trigger"], t["inferred"]) for t in data["turns"]] == [
        ("user", True), ("goal", True), ("goal", True), ("user", True)]
