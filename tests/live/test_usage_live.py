"""Codex usage on the REAL app-server (0.171.0 by default) against the scripted model,
which reports distinct ``usage`` in each ``response.completed`` (input with cached tokens
inside, output with reasoning inside): what tillerman records from
``thread/tokenUsage/updated`` equals, per turn, what the model reported for that turn's
responses and, per thread, the server's own counters; the rollout the same run wrote
gives the same figures (docs/usage/usage-and-budgets.md).

Measured here: the app-server's ``inputTokens`` holds the cached tokens (it passes the
Responses API's ``input_tokens`` through, ``cachedInputTokens`` being its part), and
``outputTokens`` the reasoning ones."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.codex_server import AppServer, codex_version, is_notification, start_turn, watched_connection
from fixtures.scripted_model import ScriptedModel, responses_usage
from tests.live.daemon_support import wait_until
from tillerman.ledger.events import Usage
from tillerman.ledger.usage import ZERO, Tokens, codex_tokens
from tillerman.monitor.appserver_events import AppServerEvents
from tillerman.monitor.formats import PARSERS
from tillerman.monitor.jsonrpc import Notification, RpcError

pytestmark = [pytest.mark.live, pytest.mark.anyio]


def chosen_usage(n: int) -> dict[str, Any]:
    """Response n's usage: distinct figures, cached inside input, reasoning inside output."""
    return responses_usage(1000 * n + 37, 40 + 3 * n, cached_tokens=600 * n + 5, reasoning_tokens=10 + n)


def reported_tokens(usage: dict[str, Any]) -> Tokens:
    """What the model reported, in tillerman's terms (the Responses API already counts
    cached inside input and reasoning inside output)."""
    return Tokens(input=usage["input_tokens"], cached_input=usage["input_tokens_details"]["cached_tokens"],
                  output=usage["output_tokens"], reasoning=usage["output_tokens_details"]["reasoning_tokens"])


@pytest.fixture(scope="module")
def scripted_model() -> Iterator[ScriptedModel]:
    """This module's model reports chosen usage (the shared one sizes it from the request)."""
    with ScriptedModel(usage=chosen_usage) as model:
        yield model


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


async def test_each_turns_usage_equals_what_the_model_reported_for_it(
        app_server: AppServer, scripted_model: ScriptedModel, workspace: Path):
    reported_by_turn: dict[str, Tokens] = defaultdict(lambda: ZERO)
    async with watched_connection(app_server.url) as (client, log):
        mapping = AppServerEvents()
        started = await client.request("thread/start", {"cwd": str(workspace)})
        thread_id = started["thread"]["id"]
        mapping.response("thread/start", started)
        for prompt in ("say hello", "RUN: echo two responses in this turn", "say goodbye"):
            start, before = len(log.messages), len(scripted_model.requests)
            turn_id = await start_turn(client, thread_id, prompt)
            await log.wait_for(is_notification("turn/completed", threadId=thread_id), timeout=60, start=start)
            for request in scripted_model.requests[before:]:
                reported_by_turn[turn_id] = reported_by_turn[turn_id] + reported_tokens(request.usage)
        notes = [m for m in log.messages if isinstance(m, Notification) and m.method == "thread/tokenUsage/updated"
                 and m.raw["params"]["threadId"] == thread_id]
        live = [e for m in notes for e in mapping.normalize(m.raw) if isinstance(e, Usage)]

    recorded_by_turn: dict[str, Tokens] = defaultdict(lambda: ZERO)
    for used in live:
        recorded_by_turn[used.turn_id] = recorded_by_turn[used.turn_id] + used.tokens
    assert dict(recorded_by_turn) == dict(reported_by_turn), codex_version()
    assert all(t.cached_input and t.reasoning for t in recorded_by_turn.values())
    # The thread's: what every response reported is the server's own running total.
    server_total = codex_tokens(notes[-1].raw["params"]["tokenUsage"]["total"])
    assert sum(reported_by_turn.values(), ZERO) == server_total == live[-1].total


async def test_account_usage_read_needs_a_signed_in_account(app_server: AppServer, workspace: Path):
    """What ``account/usage/read`` answers offline, with no account signed in (the live
    tests' Codex home has none): a -32600 refusal, for a thread and for the account alike.
    The daemon takes that as "not reported" and asks no more on the connection."""
    async with watched_connection(app_server.url) as (client, log):
        thread_id = (await client.request("thread/start", {"cwd": str(workspace)}))["thread"]["id"]
        await start_turn(client, thread_id, "say hello")
        await log.wait_for(is_notification("turn/completed", threadId=thread_id), timeout=60)
        for params in ({"threadId": thread_id}, {}):
            with pytest.raises(RpcError) as refused:
                await client.request("account/usage/read", params)
            assert (refused.value.code, str(refused.value)) == (
                -32600, "-32600: codex account authentication required to read token usage"), codex_version()
