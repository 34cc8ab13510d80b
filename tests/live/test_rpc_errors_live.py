"""Every refusal ``tillerman.controller.core.rpc_errors`` knows, provoked on the real server under test
(the newest checked release from npm, or ``$TILLERMAN_CODEX_BIN``; ``make compat`` runs this against the
oldest and the newest supported release) and read back as the refusal it is meant to be.

A release that words one of these differently fails here, and then does not belong in
``CHECKED_CODEX_VERSIONS``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.codex_server import AppServer, is_notification, start_command, text_input, watched_connection
from tillerman.controller.core.rpc_errors import _PATTERNS, Refusal, classify
from tillerman.monitor.appserver_client import AppServerClient
from tillerman.monitor.jsonrpc import RpcError

pytestmark = [pytest.mark.live, pytest.mark.anyio]

UNKNOWN_THREAD = "00000000-0000-0000-0000-000000000000"


async def _refusal(client: AppServerClient, method: str, params: dict, expected: Refusal) -> str:
    """Sends a request the server must refuse; returns the message once it is read as `expected`."""
    with pytest.raises(RpcError) as refused:
        await client.request(method, params)
    read = classify(refused.value)
    assert (read.refusal, read.code) == (expected, -32600), refused.value.message
    return read.message


async def test_every_known_refusal_is_recognized_on_this_release(app_server: AppServer, workspace: Path) -> None:
    messages: list[str] = []
    async with watched_connection(app_server.url) as (client, log):
        thread, turn = await start_command(client, log, workspace, "RUN: sleep 3", timeout=10)

        async def refused(method: str, params: dict, expected: Refusal) -> None:
            messages.append(await _refusal(client, method, params, expected))

        # while the turn runs
        await refused("turn/steer", {"threadId": thread, "expectedTurnId": "stale", "input": text_input("x")},
                      Refusal.STALE_TURN)  # the steer form, with backticks
        await refused("turn/interrupt", {"threadId": thread, "turnId": "stale"}, Refusal.STALE_TURN)  # without
        await refused("turn/steer", {"threadId": thread, "expectedTurnId": turn, "input": []}, Refusal.INVALID_INPUT)
        await refused("turn/steer", {"threadId": UNKNOWN_THREAD, "expectedTurnId": turn, "input": text_input("x")},
                      Refusal.THREAD_NOT_FOUND)
        queued = await client.request("thread/queue/add", {"threadId": thread, "clientUserMessageId": "q-1",
                                                          "input": text_input("later")})
        queued_id = queued["queuedSubmission"]["id"]
        await refused("thread/queue/start", {"threadId": thread, "queuedSubmissionId": queued_id}, Refusal.QUEUE_BUSY)
        await refused("thread/queue/start", {"threadId": thread, "queuedSubmissionId": "bogus"}, Refusal.REFUSED)
        await refused("thread/queue/reorder", {"threadId": thread, "queuedSubmissionIds": []}, Refusal.INVALID_INPUT)
        await client.request("thread/queue/delete", {"threadId": thread, "queuedSubmissionId": queued_id})
        await log.wait_for(lambda m: is_notification("turn/completed", threadId=thread)(m)
                           and m.params["turn"]["id"] == turn, timeout=30)

        # once it has ended
        await refused("turn/steer", {"threadId": thread, "expectedTurnId": turn, "input": text_input("x")},
                      Refusal.NO_ACTIVE_TURN)
        await refused("turn/interrupt", {"threadId": thread, "turnId": turn}, Refusal.NO_ACTIVE_TURN)
        await refused("thread/queue/start", {"threadId": thread}, Refusal.REFUSED)  # the queue is empty
        await refused("thread/turns/list", {"threadId": UNKNOWN_THREAD, "limit": 1}, Refusal.THREAD_NOT_FOUND)
        await refused("thread/no-such-method", {}, Refusal.REFUSED)  # Invalid request: unknown variant
        await refused("thread/goal/set", {"threadId": thread, "status": "paused"}, Refusal.REFUSED)  # no goal

    # every pattern of the classification met a real message of this release
    unmatched = [pattern.pattern for pattern, _ in _PATTERNS
                 if not any(pattern.fullmatch(message) for message in messages)]
    assert unmatched == [], messages
