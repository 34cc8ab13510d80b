"""Codex usage on the REAL app-server (0.171.0 by default) against the scripted model,
which reports ``usage`` in each ``response.completed``: what tillerman records from
``thread/tokenUsage/updated`` equals the server's own counters, and the rollout the
same run wrote gives the same figures (docs/usage/usage-and-budgets.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.codex_server import AppServer, codex_version, is_notification, start_turn, watched_connection
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import wait_until
from tillerman.ledger.events import Usage
from tillerman.ledger.usage import ZERO
from tillerman.monitor.appserver_events import AppServerEvents
from tillerman.monitor.formats import PARSERS
from tillerman.monitor.jsonrpc import Notification

pytestmark = [pytest.mark.live, pytest.mark.anyio]


async def test_recorded_usage_equals_the_servers_counters_and_the_rollouts(
        app_server: AppServer, scripted_model: ScriptedModel, workspace: Path):
    async with watched_connection(app_server.url) as (client, log):
        mapping = AppServerEvents()
        started = await client.request("thread/start", {"cwd": str(workspace)})
        thread_id = started["thread"]["id"]
        mapping.response("thread/start", started)  # the model the thread runs
        for prompt in ("say hello", "RUN: echo two responses in this turn", "say goodbye"):
            start = len(log.messages)
            await start_turn(client, thread_id, prompt)
            await log.wait_for(is_notification("turn/completed", threadId=thread_id), timeout=60, start=start)
        notes = [m for m in log.messages if isinstance(m, Notification) and m.method == "thread/tokenUsage/updated"]
        live = [e for m in notes for e in mapping.normalize(m.raw) if isinstance(e, Usage)]

    reported = scripted_model.requests  # each response reported its usage once
    assert len(live) == len(notes) >= 3, (codex_version(), len(notes))
    # The sum of each response's figures is the server's running total, on every notification.
    running = ZERO
    for used in live:
        running = running + used.tokens
        assert used.total == running and used.thread_id == thread_id and used.turn_id
        assert used.model == started["model"] and used.context_window
    assert len({u.response_key for u in live}) == len(live)
    assert len(reported) >= len(live)

    # The rollout of the same run: the same responses, thread and totals.
    rollout = Path(started["thread"]["path"])
    await wait_until(lambda: rollout.is_file() and rollout.read_text().count('"token_count"') >= len(live),
                     "the rollout's token counts", timeout=20)
    parser = PARSERS["codex-rollout"](str(rollout))
    from_file = [p.event for p in parser.feed(rollout.read_bytes()) if isinstance(p.event, Usage)]
    assert [(u.thread_id, u.turn_id, u.model, u.tokens, u.total, u.response_key) for u in from_file] == \
           [(u.thread_id, u.turn_id, u.model, u.tokens, u.total, u.response_key) for u in live]
