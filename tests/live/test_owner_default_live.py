"""A new user with no configuration at all, against the real app-server: the daemon runs
with the rule set ``tillerman run`` builds when no config file exists, and the owner's
``tillerman intent propose`` (default ``--owner``) steers the running turn exactly once;
the same owner's interrupt needs a grant, and is refused before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner

from fixtures.codex_server import AppServer
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import SETTLED, reached_model, session
from tillerman.controller.cli.main import load_rules_or_fail, main
from tillerman.ledger.events import RulesetLoaded
from tillerman.rules.config import default_config_path
from tillerman.rules.owner import local_login

pytestmark = [pytest.mark.live, pytest.mark.anyio]


async def propose(ledger: Path, thread: str, mode: str, text: str) -> str:
    """``tillerman intent propose`` as a user types it (no --owner), in a worker thread:
    the daemon keeps running meanwhile."""
    args = ["intent", "propose", "--ledger", str(ledger), "--thread", thread, "--expected-turn", "active",
            "--mode", mode, "--text", text, "--json"]
    result = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(main, args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["id"]


def history(view) -> list[tuple[str, str]]:
    return [(h.state, h.reason) for h in view.history if h.kind in ("proposed", "transition")]


async def test_with_no_config_file_the_owners_steer_is_delivered_once_and_the_interrupt_refused(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    assert not default_config_path().exists()  # $XDG_CONFIG_HOME is an empty directory of this test's
    effective = load_rules_or_fail(None, None)  # what `tillerman run` decides with here
    owner = f"owner:{local_login()}"
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(effective.ruleset, patterns=effective.patterns)
        thread, turn = await s.start_command(workspace, "RUN: sleep 2")

        interrupt = await propose(s.recorder.path, thread, "interrupt", "Stop now. zq9i")
        refused = await s.wait_state(interrupt, SETTLED)
        assert history(refused) == [("proposed", owner), ("rejected", "no_grant")]

        steer = await propose(s.recorder.path, thread, "steer", "Read src/ before running anything else. zq9s")
        done = await s.wait_state(steer, {"acknowledged", "expired", "rejected"})
        assert await s.turn_completed(thread, turn) == "completed"

        assert done.intent.owner == local_login() and done.intent.expected_turn_id == turn
        assert history(done) == [("proposed", owner), ("dispatch_unknown", "dispatching"), ("queued", "accepted"),
                                 ("acknowledged", "echo")]
        echoes = [p for p in s.user_messages(thread) if p["item"].get("clientId") == done.intent.client_user_message_id]
        assert [p["turnId"] for p in echoes] == [turn]  # delivered once, into its turn
        assert [m["params"]["expectedTurnId"] for m in s.sent("turn/steer")] == [turn]  # sent once
        assert s.sent("turn/interrupt") == []
        (start,) = s.events(RulesetLoaded)
        assert (start.reason, start.config_path, start.digest) == ("start", None, effective.ruleset.digest)
    assert reached_model(scripted_model, steer) >= 1
    assert reached_model(scripted_model, interrupt) == 0
