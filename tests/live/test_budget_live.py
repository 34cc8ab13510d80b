"""A budget rule on a live thread, against the REAL app-server (0.171.0 by default) and the
scripted model, which reports ``usage`` in each ``response.completed``: the daemon records
``thread/tokenUsage/updated``, the rule (tokens per thread) fires once however many usage
lines follow, its steer (or its stop) goes through the normal delivery to
``effect_verified``, and ``tillerman report --json`` shows the figure that crossed
(docs/usage/usage-and-budgets.md, "Budget rules")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.codex_server import codex_version, held_command
from fixtures.rule_texts import grant, rule
from tests.live.daemon_support import ruleset_from, session, wait_until
from tillerman.controller.cli.main import main
from tillerman.ledger.events import Report, Usage

pytestmark = [pytest.mark.live, pytest.mark.anyio]

#: Over at the first response: each request carries Codex's instructions, thousands of tokens.
LIMIT = 1000


FINAL = frozenset({"effect_verified", "effect_failed", "expired", "rejected"})


def budget_rule(action: str, text: str, **keys: object) -> str:
    return rule("spend", condition={"kind": "budget", "measure": "tokens", "over": LIMIT, "per": "thread"},
                action=action, text=text, **keys)


def budget_reports(s, thread: str) -> list[Report]:
    return [r for r in s.events(Report) if r.rule_id == "spend" and r.thread_id == thread]


async def crossed_once(s, tmp_path: Path, thread: str, workspace: Path, action: str, text: str,
                       grants: list[str], **keys: object):
    """The rule found once, its intent proposed; returns (report, intent view) once final.
    A steer is read by the model once the held command ends (the gate); a stop ends the
    turn while the command still runs."""
    gate = workspace / f"gate-{action}"
    await s.start_daemon(ruleset_from(tmp_path, budget_rule(action, text, **keys), grant("rule:spend", grants)))
    turn = await s.start_turn(thread, held_command(gate))
    await wait_until(lambda: budget_reports(s, thread), "the budget rule to fire", timeout=60)
    view = await wait_until(lambda: next(iter(v for v in s.projection().intents.values()
                                              if v.intent.thread_id == thread and v.intent.rule_id == "spend"), None),
                            "the rule's intent", timeout=30)
    if action != "stop":
        # The steer reaches the running turn before its command may end: on a loaded machine
        # the turn could otherwise end first, and a steer with no turn to go to is rejected.
        await s.wait_state(view.intent.id, FINAL | {"queued", "acknowledged", "action_started"}, timeout=60)
        gate.touch()
    settled = await s.wait_state(view.intent.id, FINAL, timeout=60)
    await s.turn_completed(thread, turn, timeout=60)
    gate.touch()
    if action == "stop":  # a person's turn after the stop: more usage on the same thread
        await s.turn_completed(thread, await s.start_turn(thread, "say hello"), timeout=60)
    await wait_until(lambda: len([u for u in s.events(Usage) if u.thread_id == thread]) >= 2,
                     "a second usage line after the crossing", timeout=30)
    (report,) = budget_reports(s, thread)  # once: the lines after it record nothing
    return report, settled


def report_json(ledger: Path) -> dict:
    shown = CliRunner().invoke(main, ["report", "--json", "--ledger", str(ledger)])
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.output)


def assert_report_shows(shown: dict, report: Report, settled) -> None:
    """``tillerman report --json`` lists the one crossing with its figure and where the
    intent proposed with it ended."""
    (item,) = shown["budgets"]["items"]
    assert (item["figure"], item["limit"], item["measure"], item["per"], item["source_kind"]) == (
        report.detail["figure"], LIMIT, "tokens", "thread", "codex_live"), item
    assert (item["intent_id"], item["intent_state"]) == (settled.intent.id, settled.state), item


def found_keys(value, key: str):
    """Every value of ``key`` anywhere in the report's JSON."""
    if isinstance(value, dict):
        if key in value:
            yield value[key]
        for inner in value.values():
            yield from found_keys(inner, key)
    elif isinstance(value, list):
        for inner in value:
            yield from found_keys(inner, key)


async def test_a_budget_steer_fires_once_and_is_verified(app_server, workspace: Path, tmp_path: Path):
    async with session(app_server, tmp_path) as s:
        thread = await s.start_thread(workspace)
        report, settled = await crossed_once(
            s, tmp_path, thread, workspace, "steer", "Over budget: wrap up. CREATE: wrapped.txt wrapped-up",
            ["steer"], verify=f'test "$(cat {workspace}/wrapped.txt)" = wrapped-up')
        assert settled.state == "effect_verified", (codex_version(), settled.state, settled.history)
        assert report.detail["figure"] >= LIMIT and report.detail["source_kind"] == "codex_live"
        usage = [u for u in s.events(Usage) if u.thread_id == thread]
        assert sum(u.tokens.total for u in usage) >= report.detail["figure"]
        assert report.detail["proposed"] == settled.intent.id  # the figure recorded beside the proposal
        shown = report_json(tmp_path / "ledger.sqlite3")
        assert list(found_keys(shown, "reports_by_rule")) == [{"spend": 1}], shown
        assert_report_shows(shown, report, settled)


async def test_a_budget_stop_fires_once_and_the_thread_stops(app_server, workspace: Path, tmp_path: Path):
    async with session(app_server, tmp_path) as s:
        thread = await s.start_thread(workspace)
        report, settled = await crossed_once(s, tmp_path, thread, workspace, "stop", "over budget: stop until I look", ["stop"])
        assert settled.state == "effect_verified", (codex_version(), settled.state, settled.history)
        assert report.detail["figure"] >= LIMIT and report.detail["proposed"] == settled.intent.id
        assert settled.history[-1].reason == "stop_verified"
        # the test saw the person's turn end on its own connection; the daemon's record of it may come a moment later
        await wait_until(lambda: s.projection().snapshot(thread).active_turn_id is None,
                         "the daemon to record the person's turn ending", timeout=30)
        assert_report_shows(report_json(tmp_path / "ledger.sqlite3"), report, settled)
