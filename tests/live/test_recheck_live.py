"""``tillerman replay --check`` on the ledger of a daemon that steered the REAL app-server:
every decision it recorded is decided again and agrees; the same history with a changed
rule set recorded fails at the decision the change turns around."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from fixtures.codex_server import AppServer
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import OWNER, OWNER_GRANT, SETTLED, ruleset_from, session, wait_until
from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests
from tillerman.ledger.events import DecisionRecorded, RulesetLoaded
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.files import load_grants
from tillerman.rules.ruleset import build_ruleset, ruleset_from_text, ruleset_text

pytestmark = [pytest.mark.live, pytest.mark.anyio]


def check(path: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["replay", "--check", "--json", str(path)])
    return result.exit_code, json.loads(result.output)


def with_rules_changed(source: Path, target: Path, grants: str) -> None:
    """The same history, but each ``ruleset_loaded`` records ``grants`` in place of the
    grants that decided (a copy, chained anew: editing the ledger in place is damage)."""
    with SQLiteRecorder(source, readonly=True) as old, SQLiteRecorder(target) as new:
        for entry in old.read():
            env = entry.envelope
            if isinstance(env.event, RulesetLoaded):
                recorded = ruleset_from_text(env.event.ruleset_text)
                changed = build_ruleset(recorded.rules, load_grants(grants, "changed.toml"))
                env = msgspec.structs.replace(env, event=msgspec.structs.replace(
                    env.event, ruleset_text=ruleset_text(changed)))
            assert new.append([env]).seqs == (entry.seq,)


async def test_a_live_daemons_decisions_agree_and_a_changed_grant_is_caught(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, "", OWNER_GRANT))
        thread = await s.start_thread(workspace)
        turn = await s.start_turn(thread, "RUN: sleep 1")
        await wait_until(lambda: s.sees_command_started(thread, turn), "the daemon to see the command")
        granted = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer", owner=OWNER,
                                  text="Keep going; the test only needs the echo.")
        refused = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer", owner="bob",
                                  text="Bob holds no grant.")
        assert (await s.wait_state(granted.id, SETTLED)).state == "acknowledged"
        assert (await s.wait_state(refused.id, SETTLED)).state == "rejected"
        assert await s.turn_completed(thread, turn) == "completed"
        recorded = {(d.intent_id, d.action, d.reason) for d in s.events(DecisionRecorded)}
        assert {(granted.id, "steer", "authorized"), (refused.id, "escalate", "no_grant")} <= recorded

    ledger = tmp_path / "ledger.sqlite3"
    code, result = check(ledger)
    assert code == 0, result
    assert result["ok"] and result["decisions"] == len(recorded) and result["rulesets"] >= 1

    changed = tmp_path / "changed.sqlite3"
    with_rules_changed(ledger, changed, f'[[grant]]\nsubject = "owner:{OWNER}"\nactions = ["queue"]\n')
    code, result = check(changed)
    assert code == 1, result
    diff = result["first_difference"]
    assert diff["intent"] == granted.id and diff["thread"] == thread
    assert (diff["recorded"], diff["redecided"]) == ({"action": "steer", "reason": "authorized"},
                                                     {"action": "escalate", "reason": "no_grant"})
