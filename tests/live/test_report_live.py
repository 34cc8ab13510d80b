"""``tillerman report`` and ``tillerman timeline`` on the ledger of a daemon that delivered
a few intents through the REAL Codex app-server (0.171.0 by default): the report's figures equal
counts taken here straight from the raw ledger events, and the timeline page opens in
headless chromium with a turn band and a marker for every intent.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.codex_server import AppServer
from fixtures.scripted_model import ScriptedModel
from tests.browser import chromium_dom, chromium_screenshot
from tests.live.daemon_support import OWNER, OWNER_GRANT, SETTLED, Session, ruleset_from, session
from tillerman.controller.cli.main import main
from tillerman.ledger import events as ev

pytestmark = [pytest.mark.live, pytest.mark.anyio]

DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "timeline-live.png"


def propose(s: Session, *args: str) -> str:
    result = CliRunner().invoke(main, ["intent", "propose", "--ledger", str(s.recorder.path), "--owner", OWNER,
                                       "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["id"]


async def supervised_session(s: Session, workspace: Path) -> list[str]:
    """A steer and a queued message (task class "docs") into one thread, and an interrupt
    (unlabeled) of another thread's running command: each settled."""
    await s.start_daemon(ruleset_from(s.tmp_path, "", OWNER_GRANT))
    thread, turn = await s.start_command(workspace, "RUN: sleep 1")
    steer = propose(s, "--thread", thread, "--expected-turn", turn, "--mode", "steer", "--task-class", "docs",
                    "--text", "Write the notes down.")
    await s.wait_state(steer, SETTLED)
    queued = propose(s, "--thread", thread, "--mode", "queue", "--task-class", "docs", "--text", "Then summarize.")
    await s.wait_state(queued, SETTLED)
    other, running = await s.start_command(workspace, "RUN: sleep 5")
    stop = propose(s, "--thread", other, "--expected-turn", running, "--mode", "interrupt", "--text", "Stop that.")
    await s.wait_state(stop, SETTLED)
    await s.turn_completed(other, running)
    return [steer, queued, stop]


def raw_counts(entries: list[ev.Entry]) -> dict:
    """The figures, counted here from the raw events without the report's fold."""
    group_of: dict[str, tuple[str, str]] = {}
    created: dict[str, float] = {}
    to_ack: dict[tuple[str, str], list[float]] = {}
    last: dict[str, ev.IntentTransition] = {}
    dispatched: Counter = Counter()
    interrupted = set()
    for entry in entries:
        event = entry.envelope.event
        if isinstance(event, ev.IntentProposed):
            task = event.intent.task_class if isinstance(event.intent.task_class, str) else "unlabeled"
            group_of[event.intent.id] = (event.intent.mode, task)
            created[event.intent.id] = event.intent.created_at
        elif isinstance(event, ev.IntentTransition):
            last[event.intent_id] = event
            if event.to_state == "acknowledged":
                to_ack.setdefault(group_of[event.intent_id], []).append(entry.envelope.at - created[event.intent_id])
            if event.to_state == "dispatch_unknown":
                dispatched[group_of[event.intent_id]] += 1
        elif isinstance(event, ev.TurnCompleted) and event.status == "interrupted":
            interrupted.add((event.thread_id, event.turn_id))
    return {
        "proposed": Counter(group_of.values()),
        "dispatched": dispatched,
        "acknowledged": Counter(group_of[i] for i, t in last.items() if t.to_state == "acknowledged"),
        "to_ack": to_ack,
        "rejected": sum(1 for t in last.values() if t.to_state == "rejected"),
        "interrupted_turns": len(interrupted),
        "reports": sum(1 for e in entries if isinstance(e.envelope.event, ev.Report)
                       and not e.envelope.event.detail.get("shadow")),
    }


async def test_report_equals_the_raw_ledger_counts_and_the_timeline_draws_the_intents(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path,
) -> None:
    async with session(app_server, tmp_path) as s:
        intents = await supervised_session(s, workspace)
        ledger = s.recorder.path
        entries = s.entries()
    raw = raw_counts(entries)
    result = CliRunner().invoke(main, ["report", "--ledger", str(ledger), "--json", "--db", str(tmp_path / "r.db")])
    assert result.exit_code == 0, result.output
    account = json.loads(result.output)
    groups = {(g["key"]["mode"], g["key"]["task_class"]): g for g in account["groups"]}
    assert set(groups) == {("steer", "docs"), ("queue", "docs"), ("interrupt", "unlabeled")}
    for key, group in groups.items():
        assert group["proposed"]["value"] == raw["proposed"][key] == 1
        assert group["dispatched"]["value"] == raw["dispatched"][key]
        acked = group["precision_ack"]
        assert acked["value"] == raw["acknowledged"][key] / raw["dispatched"][key], (key, acked)
        assert group["intent_to_ack"]["max"]["value"] == round(max(raw["to_ack"][key]), 3) > 0
    assert account["totals"]["proposed"]["value"] == len(intents)
    assert account["totals"]["rejected"]["value"] == raw["rejected"]
    assert account["cancelled_work"]["interrupted_turns"]["value"] == raw["interrupted_turns"] >= 1
    assert account["cancelled_work"]["interrupted_by_intent"]["value"] == 1
    assert account["cancelled_work"]["commands_terminated"]["value"] >= 1
    assert account["owner_interruptions"]["reports"]["value"] == raw["reports"]
    assert account["reviewer"]["calls"] == {"value": 0, "how": account["reviewer"]["calls"]["how"], "events": 0}
    delivery = account["delivery"]
    assert (delivery["duplicate_deliveries"]["value"], delivery["silently_lost"]["value"], delivery["ok"]) == (0, 0, True)

    page = tmp_path / "timeline.html"
    drawn = CliRunner().invoke(main, ["timeline", "--ledger", str(ledger), "--html", str(page)])
    assert drawn.exit_code == 0, drawn.output
    dom = chromium_dom(page)
    for intent_id in intents:
        assert f'data-intent="{intent_id}"' in dom
    assert dom.count('class="mark turn-band') >= 3
    assert 'title="transition: acknowledged (' in dom  # each step names its state and reason on hover
    assert "tool-call" in dom
    shot = chromium_screenshot(page, tmp_path / "timeline.png", size="1400,360")
    if os.environ.get("TILLERMAN_UPDATE_DOCS"):  # how docs/timeline-live.png is made
        shutil.copyfile(shot, DOCS_SCREENSHOT)
